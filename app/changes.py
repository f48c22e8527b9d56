"""A working directory's uncommitted changes, as git sees them: the header's Changes view.

Everything since the last commit (staged or not) and the untracked files git does not
ignore, in the repository that holds the conversation's directory. Read-only: nothing is
staged, written or locked, and nothing in the repository's config runs (app/git.py).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from app.git import (
    GitError,
    GitMissing,
    GitResult,
    GitTimeout,
    filter_overrides,
    repository,
    run_git,
)

MAX_FILES = 1000  # listed; the rest is counted in "truncated"
MAX_LIST_BYTES = 4 * 1024 * 1024  # of git's file lists
MAX_DIFF_BYTES = 2 * 1024 * 1024  # of one file's diff read from git
MAX_DIFF_LINES = 2000  # of one file's diff shown; the rest counted in "more"
COUNT_BYTES = 1024 * 1024  # an untracked file's lines are counted up to this size
COUNT_BUDGET = 16 * 1024 * 1024  # bytes read to count untracked files' lines, in all
REQUEST_SECONDS = 10.0  # all of one answer's git commands together
# Output that a repository's config would otherwise shape (colours, prefixes, paths relative
# to a subdirectory, external or converted diffs).
DIFF_OPTIONS = ("--no-ext-diff", "--no-textconv", "--no-color", "--no-relative")
DIFF_OPTIONS += ("--ignore-submodules=all", "-M")
# A file over this size is compared as binary: a 60 MB file's line diff took git 640 MB.
BIG_FILE = ("-c", "core.bigFileThreshold=8m")
STATUSES = {
    "A": "added",
    "C": "copied",
    "D": "deleted",
    "M": "modified",
    "R": "renamed",
    "T": "typechange",
    "U": "unmerged",
}


class ChangesError(Exception):
    """The changes cannot be read (the message says why)."""


class NoSuchChange(ChangesError):
    """The path asked about has no change."""


@dataclass(frozen=True)
class Change:
    """One changed file: its path from the repository's top, and its lines added/removed
    (None when unknown: binary, too large, not a regular file). directory: an untracked
    folder git does not look into (a repository of its own), its path ending in "/"."""

    path: str
    status: str
    old_path: str | None = None
    added: int | None = None
    removed: int | None = None
    binary: bool = False
    directory: bool = False


@dataclass(frozen=True)
class Repo:
    """A work tree's top, its filters switched off, and what its changes are measured from."""

    top: Path
    options: list[str]  # the -c options before each command
    base: str  # HEAD's commit, or the empty tree before the first commit
    head: str | None
    branch: str | None
    ceiling: tuple[Path, ...]
    deadline: float  # (time.monotonic) past it, no more git

    def git(self, *args: str, max_bytes: int | None = MAX_LIST_BYTES) -> GitResult:
        """Run git in the top with the filters off; ChangesError when it fails."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise GitTimeout(f"git ran past {REQUEST_SECONDS:g} s")
        command = [*BIG_FILE, *self.options, *args]
        found = run_git(command, self.top, ceiling=self.ceiling, max_bytes=max_bytes, timeout=left)
        # (1: `diff --no-index` found a difference; a cut output's command was killed)
        if found.code not in (0, 1) and not found.cut:
            raise ChangesError(f"git could not read the changes: {found.reason()}")
        return found


def _fields(out: bytes) -> list[str]:
    """The NUL-separated fields of git's -z output; the last one, empty or cut short (the
    output was cut at a size), is left out."""
    return out.decode("utf-8", "surrogateescape").split("\0")[:-1]


def parse_name_status(out: bytes) -> list[tuple[str, str, str | None]]:
    """`git diff --name-status -z` → (status letter, path, old path for a rename or copy)."""
    fields = _fields(out)
    found: list[tuple[str, str, str | None]] = []
    at = 0
    while at < len(fields) and fields[at]:
        letter = fields[at][:1]
        size = 3 if letter in "RC" else 2
        if at + size > len(fields):
            break  # cut short
        if size == 3:
            found.append((letter, fields[at + 2], fields[at + 1]))
        else:
            found.append((letter, fields[at + 1], None))
        at += size
    return found


def parse_numstat(out: bytes) -> dict[str, tuple[int | None, int | None]]:
    """`git diff --numstat -z` → path (the new one of a rename) → (added, removed); None, None
    for a binary file."""
    fields = _fields(out)
    found: dict[str, tuple[int | None, int | None]] = {}
    at = 0
    while at < len(fields) and fields[at]:
        parts = fields[at].split("\t", 2)
        if len(parts) != 3:
            break  # cut short
        added, removed, path = parts
        if not path:  # a rename: its old path and new path follow
            if at + 3 > len(fields):
                break
            path = fields[at + 2]
            at += 2
        at += 1
        try:
            counts = (None, None) if added == "-" else (int(added), int(removed))
        except ValueError:
            break
        found[path] = counts
    return found


def diff_lines(out: bytes) -> tuple[list[str], bool]:
    """A file's `git diff` → its lines from the first hunk on (the header dropped), and
    whether git called it binary. Lines end at "\\n" only: a U+2028 or a form feed inside an
    added line is part of it, not a line of its own."""
    text = out.decode("utf-8", "replace")
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and not lines[-1]:
        lines.pop()
    for at, line in enumerate(lines):
        if line.startswith("@@"):
            return lines[at:], False
        if line.startswith("Binary files ") and line.endswith(" differ"):
            return [], True
    return [], False


def _usable(path: str) -> bool:
    """A path a JSON answer can carry (git gives bytes; surrogates mark what is not UTF-8)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def open_repo(cwd: Path, roots: Iterable[Path]) -> Repo | None:
    """The repository holding cwd (None: not a git work tree). It must lie inside the
    workspace roots, its git directory and borrowed objects included (app/git.py)."""
    ceiling = tuple(roots)
    deadline = time.monotonic() + REQUEST_SECONDS
    try:
        top = repository(cwd, ceiling)
        if top is None:
            return None
        options = filter_overrides(top, ceiling)
    except (GitTimeout, GitMissing):
        raise
    except GitError as error:
        raise ChangesError(str(error)) from None
    repo = Repo(top, options, "", None, None, ceiling, deadline)
    head = repo.git("rev-parse", "-q", "--verify", "HEAD^{commit}").out.decode().strip() or None
    branch = repo.git("symbolic-ref", "-q", "--short", "HEAD").out.decode("utf-8", "replace")
    base = head or repo.git("hash-object", "-t", "tree", "--stdin").out.decode().strip()
    return Repo(top, options, base, head, branch.strip() or None, ceiling, deadline)


def _tracked(repo: Repo, paths: tuple[str, ...] = ()) -> tuple[list[Change], bool]:
    """The tracked files changed (those of paths only, when given), by path; whether git's
    list was cut."""
    spec = ("--", *paths)
    names = repo.git("diff", *DIFF_OPTIONS, "-z", "--name-status", repo.base, *spec)
    counts = parse_numstat(repo.git("diff", *DIFF_OPTIONS, "-z", "--numstat", repo.base, *spec).out)
    found = []
    for letter, path, old in sorted(parse_name_status(names.out), key=lambda named: named[1]):
        if not (_usable(path) and (old is None or _usable(old))):
            continue
        added, removed = counts.get(path, (None, None))
        binary = path in counts and added is None
        found.append(Change(path, STATUSES.get(letter, "modified"), old, added, removed, binary))
    return found, names.cut


def _untracked(
    repo: Repo, paths: tuple[str, ...] = (), limit: int = MAX_FILES
) -> tuple[list[Change], bool]:
    """The untracked files git does not ignore (of paths only, when given), by path, at most
    limit; whether there were more."""
    others = repo.git("ls-files", "-z", "--others", "--exclude-standard", "--", *paths)
    budget = [COUNT_BUDGET]
    found = []
    for path in sorted(p for p in _fields(others.out) if p and _usable(p)):
        if len(found) == limit:
            return found, True
        if path.endswith("/"):  # a folder git does not look into: a repository of its own
            found.append(Change(path, "untracked", directory=True))
            continue
        added, binary = _count_lines(repo.top / path, budget)
        found.append(Change(path, "untracked", None, added, None, binary))
    return found, others.cut


def list_changes(repo: Repo) -> tuple[list[Change], bool]:
    """The changed files (tracked ones by path, then the untracked ones), and whether the list
    was cut at MAX_FILES."""
    tracked, cut = _tracked(repo)
    untracked, more = _untracked(repo, limit=max(0, MAX_FILES + 1 - len(tracked)))
    changes = tracked + untracked
    return changes[:MAX_FILES], cut or more or len(changes) > MAX_FILES


def _count_lines(path: Path, budget: list[int]) -> tuple[int | None, bool]:
    """An untracked file's lines and whether it is binary (a NUL in its first 8 kB); None when
    it is not a regular file, larger than COUNT_BYTES, or past the reading budget."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # a symlink, gone, unreadable
        return None, False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > min(COUNT_BYTES, budget[0]):
            return None, False
        data = os.read(fd, COUNT_BYTES)
    except OSError:
        return None, False
    finally:
        os.close(fd)
    budget[0] -= len(data)
    if b"\0" in data[:8000]:
        return None, True
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0), False


def _plain(path: str) -> bool:
    """A path from the work tree's top, as the list gives them: relative, no "..", no NUL."""
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and ".." not in parts and "\0" not in path


def find_change(repo: Repo, path: str, old_path: str | None = None) -> Change:
    """What the list says of one path (a rename's old path given, as the list gives it):
    looked up alone, not by listing everything. NoSuchChange when it has none."""
    if not _plain(path) or (old_path is not None and not _plain(old_path)):
        raise NoSuchChange(f"No change to {path}.")
    paths = (old_path, path) if old_path else (path,)
    tracked, _ = _tracked(repo, paths)
    for change in tracked:
        if change.path == path and change.old_path == old_path:
            return change
    untracked, _ = _untracked(repo, (path,))
    for change in untracked:
        if change.path == path:
            return change
    raise NoSuchChange(f"No change to {path}.")


def file_diff(repo: Repo, path: str, old_path: str | None = None) -> dict[str, Any]:
    """One changed file's diff from the last commit (an untracked one's whole text as added):
    at most MAX_DIFF_LINES lines from its first hunk; NoSuchChange when it has none."""
    change = find_change(repo, path, old_path)
    link = repo.top / path
    if change.directory:
        found = GitResult(0, b"", "")
    elif change.status == "untracked" and link.is_symlink():
        # Its target's name, as git shows a link to a file (a link to a folder showed nothing).
        target = os.readlink(os.fsencode(link)).decode("utf-8", "replace")
        found = GitResult(0, f"@@ -0,0 +1 @@\n+{target}\n".encode(), "")
    elif change.status == "untracked":  # ("./": a file named "-" is not the standard input)
        found = repo.git(
            "diff", *DIFF_OPTIONS, "--no-index", "--", os.devnull, f"./{path}",
            max_bytes=MAX_DIFF_BYTES,
        )  # fmt: skip
    else:
        paths = [change.old_path, path] if change.old_path else [path]
        found = repo.git("diff", *DIFF_OPTIONS, repo.base, "--", *paths, max_bytes=MAX_DIFF_BYTES)
    lines, binary = diff_lines(found.out)
    if found.cut and lines:
        lines.pop()  # the last line read may be cut short
    shown = lines[:MAX_DIFF_LINES]
    return asdict(change) | {
        "diff": shown,
        "more": len(lines) - len(shown),
        "cut": found.cut,
        "binary": binary or change.binary,
    }


def changes_view(cwd: Path, roots: Iterable[Path]) -> dict[str, Any]:
    """The Changes view's answer for a working directory."""
    repo = open_repo(cwd, roots)
    if repo is None:
        return {
            "repo": False,
            "root": None,
            "branch": None,
            "head": None,
            "files": [],
            "truncated": False,
        }
    changes, cut = list_changes(repo)
    return {
        "repo": True,
        "root": str(repo.top),
        "branch": repo.branch,
        "head": repo.head[:12] if repo.head else None,
        "files": [asdict(change) for change in changes],
        "truncated": cut,
    }
