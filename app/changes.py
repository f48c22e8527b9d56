"""A working directory's uncommitted changes, as git sees them: the header's Changes view.

Everything since the last commit (staged or not) and the untracked files git does not
ignore, in the repository that holds the conversation's directory. Read-only: nothing is
staged, written or locked, and nothing in the repository's config runs (app/git.py).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.git import GitResult, filter_overrides, run_git

MAX_FILES = 1000  # listed; the rest is counted in "truncated"
MAX_LIST_BYTES = 4 * 1024 * 1024  # of git's file lists
MAX_DIFF_BYTES = 2 * 1024 * 1024  # of one file's diff read from git
MAX_DIFF_LINES = 2000  # of one file's diff shown; the rest counted in "more"
COUNT_BYTES = 1024 * 1024  # an untracked file's lines are counted up to this size
COUNT_BUDGET = 16 * 1024 * 1024  # bytes read to count untracked files' lines, in all
# Output that a repository's config would otherwise shape (colours, prefixes, paths relative
# to a subdirectory, external or converted diffs).
DIFF_OPTIONS = ("--no-ext-diff", "--no-textconv", "--no-color", "--no-relative")
DIFF_OPTIONS += ("--ignore-submodules=all", "-M")
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
    (None when unknown: binary, too large, not a regular file)."""

    path: str
    status: str
    old_path: str | None = None
    added: int | None = None
    removed: int | None = None
    binary: bool = False


@dataclass(frozen=True)
class Repo:
    """A work tree's top, its filters switched off, and what its changes are measured from."""

    top: Path
    options: list[str]  # the -c options before each command
    base: str  # HEAD's commit, or the empty tree before the first commit
    head: str | None
    branch: str | None
    ceiling: tuple[Path, ...]

    def git(self, *args: str, max_bytes: int | None = MAX_LIST_BYTES) -> GitResult:
        """Run git in the top with the filters off; ChangesError when it fails."""
        found = run_git([*self.options, *args], self.top, ceiling=self.ceiling, max_bytes=max_bytes)
        # (1: `diff --no-index` found a difference; a cut output's command was killed)
        if found.code not in (0, 1) and not found.cut:
            raise ChangesError(f"git could not read the changes: {found.reason()}")
        return found


def parse_name_status(out: bytes) -> list[tuple[str, str, str | None]]:
    """`git diff --name-status -z` → (status letter, path, old path for a rename or copy)."""
    fields = out.decode("utf-8", "surrogateescape").split("\0")
    found: list[tuple[str, str, str | None]] = []
    at = 0
    while at < len(fields) and fields[at]:
        letter = fields[at][:1]
        if letter in "RC":
            found.append((letter, fields[at + 2], fields[at + 1]))
            at += 3
        else:
            found.append((letter, fields[at + 1], None))
            at += 2
    return found


def parse_numstat(out: bytes) -> dict[str, tuple[int | None, int | None]]:
    """`git diff --numstat -z` → path (the new one of a rename) → (added, removed); None, None
    for a binary file."""
    fields = out.decode("utf-8", "surrogateescape").split("\0")
    found: dict[str, tuple[int | None, int | None]] = {}
    at = 0
    while at < len(fields) and fields[at]:
        added, removed, path = fields[at].split("\t", 2)
        if path:
            at += 1
        else:  # a rename: its old path and new path follow
            path = fields[at + 2]
            at += 3
        counts = (None, None) if added == "-" else (int(added), int(removed))
        found[path] = counts
    return found


def diff_lines(out: bytes) -> tuple[list[str], bool]:
    """A file's `git diff` → its lines from the first hunk on (the header dropped), and
    whether git called it binary."""
    text = out.decode("utf-8", "replace")
    lines = text.splitlines()
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
    """The repository holding cwd (None: not a git work tree). Its top must lie inside the
    workspace roots: a repository whose config points its work tree elsewhere is refused."""
    ceiling = tuple(roots)
    found = run_git(["rev-parse", "--show-toplevel"], cwd, ceiling=ceiling)
    if found.code != 0:
        if "not a git repository" in found.err:
            return None
        raise ChangesError(f"git could not read the changes: {found.reason()}")
    top = Path(found.out.decode("utf-8", "surrogateescape").rstrip("\n")).resolve()
    if not any(top == root.resolve() or top.is_relative_to(root.resolve()) for root in ceiling):
        raise ChangesError(f"The repository's work tree {top} is outside the workspace roots.")
    try:
        options = filter_overrides(top, ceiling)
    except ValueError as error:
        raise ChangesError(f"git could not read the changes: {error}") from None
    repo = Repo(top, options, "", None, None, ceiling)
    head = repo.git("rev-parse", "-q", "--verify", "HEAD^{commit}").out.decode().strip() or None
    branch = repo.git("symbolic-ref", "-q", "--short", "HEAD").out.decode("utf-8", "replace")
    base = head or repo.git("hash-object", "-t", "tree", "--stdin").out.decode().strip()
    return Repo(top, options, base, head, branch.strip() or None, ceiling)


def list_changes(repo: Repo) -> tuple[list[Change], bool]:
    """The changed files (tracked ones by path, then the untracked ones), and whether the list
    was cut at MAX_FILES."""
    names = repo.git("diff", *DIFF_OPTIONS, "-z", "--name-status", repo.base, "--")
    counts = parse_numstat(repo.git("diff", *DIFF_OPTIONS, "-z", "--numstat", repo.base, "--").out)
    changes = []
    for letter, path, old in sorted(parse_name_status(names.out), key=lambda found: found[1]):
        if not (_usable(path) and (old is None or _usable(old))):
            continue
        added, removed = counts.get(path, (None, None))
        status = STATUSES.get(letter, "modified")
        binary = path in counts and added is None
        changes.append(Change(path, status, old, added, removed, binary))
    others = repo.git("ls-files", "-z", "--others", "--exclude-standard")
    budget = [COUNT_BUDGET]
    for path in sorted(p for p in others.out.decode("utf-8", "surrogateescape").split("\0") if p):
        if len(changes) > MAX_FILES:
            break
        if _usable(path):
            added, binary = _count_lines(repo.top / path, budget)
            changes.append(Change(path, "untracked", None, added, None, binary))
    cut = len(changes) > MAX_FILES or names.cut or others.cut
    return changes[:MAX_FILES], cut


def _count_lines(path: Path, budget: list[int]) -> tuple[int | None, bool]:
    """An untracked file's lines and whether it is binary (a NUL in its first 8 kB); None when
    it is not a regular file, larger than COUNT_BYTES, or past the reading budget."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # a symlink, gone, unreadable
        return None, False
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > min(COUNT_BYTES, budget[0]):
            return None, False
        data = file.read(COUNT_BYTES)
    budget[0] -= len(data)
    if b"\0" in data[:8000]:
        return None, True
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0), False


def file_diff(repo: Repo, path: str) -> dict[str, Any]:
    """One changed file's diff from the last commit (an untracked one's whole text as added):
    at most MAX_DIFF_LINES lines from its first hunk; NoSuchChange when it has none."""
    changes, _ = list_changes(repo)
    change = next((c for c in changes if c.path == path), None)
    if change is None:
        raise NoSuchChange(f"No change to {path}.")
    if change.status == "untracked":
        found = repo.git(
            "diff", *DIFF_OPTIONS, "--no-index", "--", os.devnull, path, max_bytes=MAX_DIFF_BYTES
        )
    else:
        paths = [change.old_path, path] if change.old_path else [path]
        found = repo.git("diff", *DIFF_OPTIONS, repo.base, "--", *paths, max_bytes=MAX_DIFF_BYTES)
    lines, binary = diff_lines(found.out)
    if found.cut and lines:
        lines.pop()  # the last line read may be cut short
    shown = lines[:MAX_DIFF_LINES]
    more = len(lines) - len(shown)
    return asdict(change) | {
        "diff": shown,
        "more": more,
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
