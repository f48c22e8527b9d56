"""The files of a working directory, for the composer's @ completion (Claude Code attaches
a file a message names as ``@path``)."""

from __future__ import annotations

import heapq
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from app.git import GitError, repository, run_git

MAX_FILES = 50_000  # listed per working directory; a bigger tree is cut (``truncated``)
CACHE_SECONDS = 10.0  # one listing serves a burst of keystrokes
CACHE_SIZE = 16  # working directories kept listed
WALK_SECONDS = 3.0  # a walk stops here (``truncated``): a huge tree, a hung mount
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1: no name of a file to mention
# Never walked into without git (git's own ignore rules do better where there is a repo).
SKIPPED_DIRS = frozenset(
    {"node_modules", "__pycache__", "venv", "dist", "build", "target", "site-packages"}
)


def rank(paths: list[str], query: str, limit: int = 12) -> list[str]:
    """The paths that match query best, best first (case-insensitive).

    A path matches when query's characters appear in it in order. Better: the file's name
    starting with the query, then the name containing it, then the path containing it, then
    the characters scattered; among equals, the shorter path, then alphabetical order.
    """
    needle = query.lower()

    def scored() -> Iterable[tuple[int, int, str]]:
        for path in paths:
            hay = path.lower()
            name = hay.rsplit("/", 1)[-1]
            if name.startswith(needle):
                yield 0, len(path), path
            elif needle in name:
                yield 1, len(path), path
            elif needle in hay:
                yield 2, len(path), path
            elif _in_order(needle, hay):
                yield 3, len(path), path

    return [path for _, _, path in heapq.nsmallest(limit, scored())]


def _in_order(needle: str, hay: str) -> bool:
    at = 0
    for char in needle:
        at = hay.find(char, at) + 1
        if not at:
            return False
    return True


def list_files(
    root: Path, ceiling: Iterable[Path] = (), limit: int = MAX_FILES
) -> tuple[list[str], bool]:
    """The files under root, relative to it with "/" separators, and whether the list was cut.

    In a git work tree, git's list (tracked files and untracked ones not ignored), a
    repository no deeper than the ceiling directories (the workspace roots: one above them,
    such as a home's dotfiles, is not used); elsewhere a walk that skips hidden and dependency
    directories and follows no symlinked directory. Names that are not UTF-8 (a JSON answer
    cannot carry them) or hold a control character (a newline would end up in the composer,
    inside the `@"…"` a pick inserts) are left out.
    """
    listed = _git_files(root, ceiling, limit)
    return listed if listed is not None else _walk(root, limit)


def _git_files(root: Path, ceiling: Iterable[Path], limit: int) -> tuple[list[str], bool] | None:
    command = ["ls-files", "--cached", "--others", "--exclude-standard", "-z"]
    try:
        # Not a repository that reads elsewhere (a `.git` file pointing out of the roots):
        # its names would be another project's. Walked instead.
        if repository(root, ceiling) is None:
            return None
        found = run_git(command, root, ceiling=ceiling)
        # Tracked but deleted from the work tree: not offered (the agent could not read it).
        gone = run_git(["ls-files", "--deleted", "-z"], root, ceiling=ceiling)
    except GitError:
        return None
    if found.code != 0:  # not a git work tree
        return None
    deleted = set(gone.out.split(b"\0")) if gone.code == 0 else set()
    names = (
        n.decode("utf-8", "strict")
        for n in found.out.split(b"\0")
        if n and n not in deleted and _mentionable(n)
    )
    unique = list(dict.fromkeys(names))  # (a file in conflict is listed once per stage)
    return unique[:limit], len(unique) > limit


def _mentionable(name: bytes) -> bool:
    """UTF-8, without a control character (see list_files)."""
    try:
        text = name.decode("utf-8", "strict")
    except UnicodeDecodeError:
        return False
    return _CONTROL.search(text) is None


def _walk(root: Path, limit: int) -> tuple[list[str], bool]:
    found: list[str] = []
    deadline = time.monotonic() + WALK_SECONDS
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        base = Path(directory).relative_to(root).as_posix()
        for name in sorted(files):
            path = name if base == "." else f"{base}/{name}"
            if not _mentionable(os.fsencode(path)):
                continue
            found.append(path)
            if len(found) > limit:
                return found[:limit], True
        if time.monotonic() > deadline:
            return found, True
    return found, False


class FileLists:
    """Listings of working directories, each kept CACHE_SECONDS after it was made.

    Listings run in a pool of their own (a big tree never holds the threads the rest of the
    relay uses) and one at a time per directory: requests meanwhile wait for that one.
    """

    def __init__(self) -> None:
        self._lists: OrderedDict[Path, tuple[float, list[str], bool]] = OrderedDict()
        self._lock = threading.Lock()
        self._listing: dict[Path, threading.Lock] = {}
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="oarlock-files")

    def get(self, root: Path, ceiling: Iterable[Path] = ()) -> tuple[list[str], bool]:
        """root's files (see list_files), listed again when the last listing is too old."""
        with self._lock:
            one = self._listing.setdefault(root, threading.Lock())
        with one:
            with self._lock:
                kept = self._lists.get(root)
                if kept is not None and time.monotonic() - kept[0] < CACHE_SECONDS:
                    self._lists.move_to_end(root)
                    return kept[1], kept[2]
            files, truncated = list_files(root, ceiling)
            with self._lock:
                self._lists[root] = (time.monotonic(), files, truncated)
                self._lists.move_to_end(root)
                while len(self._lists) > CACHE_SIZE:
                    dropped, _ = self._lists.popitem(last=False)
                    self._listing.pop(dropped, None)
        return files, truncated
