"""The files of a working directory, for the composer's @ completion (Claude Code attaches
a file a message names as ``@path``)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import OrderedDict
from pathlib import Path

MAX_FILES = 50_000  # listed per working directory; a bigger tree is cut (``truncated``)
CACHE_SECONDS = 10.0  # one listing serves a burst of keystrokes
CACHE_SIZE = 16  # working directories kept listed
GIT_TIMEOUT = 5.0
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
    scored: list[tuple[int, int, str]] = []
    for path in paths:
        hay = path.lower()
        name = hay.rsplit("/", 1)[-1]
        if name.startswith(needle):
            score = 0
        elif needle in name:
            score = 1
        elif needle in hay:
            score = 2
        elif _in_order(needle, hay):
            score = 3
        else:
            continue
        scored.append((score, len(path), path))
    scored.sort()
    return [path for _, _, path in scored[:limit]]


def _in_order(needle: str, hay: str) -> bool:
    at = 0
    for char in needle:
        at = hay.find(char, at) + 1
        if not at:
            return False
    return True


def list_files(root: Path, limit: int = MAX_FILES) -> tuple[list[str], bool]:
    """The files under root, relative to it with "/" separators, and whether the list was cut.

    In a git work tree, git's list (tracked files and untracked ones not ignored); elsewhere a
    walk that skips hidden and dependency directories and follows no symlinked directory.
    """
    listed = _git_files(root, limit)
    return listed if listed is not None else _walk(root, limit)


def _git_files(root: Path, limit: int) -> tuple[list[str], bool] | None:
    command = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"]
    try:
        done = subprocess.run(
            command, cwd=root, capture_output=True, timeout=GIT_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # not a git work tree (or no git)
        return None
    names = [n for n in done.stdout.decode("utf-8", "replace").split("\0") if n]
    unique = list(dict.fromkeys(names))  # (a file in conflict is listed once per stage)
    return unique[:limit], len(unique) > limit


def _walk(root: Path, limit: int) -> tuple[list[str], bool]:
    found: list[str] = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        base = Path(directory).relative_to(root).as_posix()
        for name in sorted(files):
            found.append(name if base == "." else f"{base}/{name}")
            if len(found) > limit:
                return found[:limit], True
    return found, False


class FileLists:
    """Listings of working directories, each kept CACHE_SECONDS (thread-safe)."""

    def __init__(self) -> None:
        self._lists: OrderedDict[Path, tuple[float, list[str], bool]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, root: Path) -> tuple[list[str], bool]:
        """root's files (see list_files), listed again when the last listing is too old."""
        now = time.monotonic()
        with self._lock:
            kept = self._lists.get(root)
            if kept is not None and now - kept[0] < CACHE_SECONDS:
                self._lists.move_to_end(root)
                return kept[1], kept[2]
        files, truncated = list_files(root)
        with self._lock:
            self._lists[root] = (now, files, truncated)
            self._lists.move_to_end(root)
            while len(self._lists) > CACHE_SIZE:
                self._lists.popitem(last=False)
        return files, truncated
