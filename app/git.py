"""Running git in a working directory an agent can write to, so that nothing in it runs.

A repository's own config (``.git/config``, which an agent's edit or an unpacked archive can
write) may name commands git runs while it reads: ``core.fsmonitor`` on every command that
looks at the work tree, a filter's ``clean``/``process`` command on every file it reads, an
external diff and textconv drivers on a diff, and hooks when the index is written. Every git
command here switches each of them off on its command line, and gets none of the relay's
environment (its token, API keys) but what git needs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

GIT_TIMEOUT = 5.0
# Nothing in a repository's own config may run a command (fsmonitor runs on any work-tree
# read); no lock taken and no index written (a written index runs the post-index-change hook).
GIT_OPTIONS = (
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.untrackedCache=false",
    # No transport at all: a partial clone's missing object would be fetched through the
    # repository's remote (its `uploadpack`, `core.sshCommand`, an `ext::` URL run commands).
    "-c",
    "protocol.allow=never",
    "--no-optional-locks",
    "--no-pager",
)
MAX_FILTERS = 64  # filter drivers switched off by name; a config naming more is refused
GIT_ENV_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")  # not the relay's secrets
FILTER_KEYS = ("clean", "smudge", "process")


class GitError(Exception):
    """git could not do what was asked (the message says why)."""


class GitMissing(GitError):
    """git is not installed (or may not be run)."""


class GitTimeout(GitError):
    """git ran past its time."""


class OutsideRoots(GitError):
    """The repository lies (in part) outside the workspace roots."""


@dataclass(frozen=True)
class GitResult:
    """What a git command printed (stdout cut at the asked size), and how it ended."""

    code: int
    out: bytes
    err: str
    cut: bool = False

    def reason(self) -> str:
        """git's own error line (its first `fatal:` or `error:` one, else its first), for a
        message."""
        lines = [line.strip() for line in self.err.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith(("fatal: ", "error: "))]
        if not lines:
            return f"git exited with {self.code}"
        return (errors or lines)[0].removeprefix("fatal: ").removeprefix("error: ")


def git_env(ceiling: Iterable[Path] = ()) -> dict[str, str]:
    """git's environment: a few of the relay's variables, and no repository above ceiling's
    parents (a home's dotfiles repository is not the project's)."""
    env = {name: os.environ[name] for name in GIT_ENV_NAMES if name in os.environ}
    env["GIT_CEILING_DIRECTORIES"] = os.pathsep.join(str(top.parent) for top in ceiling)
    env["GIT_LITERAL_PATHSPECS"] = "1"  # a path is a path: no ":(glob)" or ":!" magic
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_NO_LAZY_FETCH"] = "1"  # (git 2.44 and later; protocol.allow=never before)
    return env


def run_git(
    args: Sequence[str],
    cwd: Path,
    *,
    ceiling: Iterable[Path] = (),
    max_bytes: int | None = None,
    timeout: float = GIT_TIMEOUT,
) -> GitResult:
    """Run `git <GIT_OPTIONS> <args>` in cwd; its output read up to max_bytes (then stopped).

    Raises GitMissing without git, GitTimeout past timeout (the command and whatever it
    started are killed).
    """
    # Its errors go to a file: a pipe git filled while its output was being read would stop it.
    with tempfile.TemporaryFile() as errors:
        try:
            process = subprocess.Popen(
                ["git", *GIT_OPTIONS, *args],
                cwd=cwd,
                env=git_env(ceiling),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                start_new_session=True,  # killed with whatever it started
            )
        except (FileNotFoundError, PermissionError) as error:
            raise GitMissing(str(error)) from None
        except OSError as error:  # a command line too long, out of processes...
            raise GitError(f"git could not be run: {error}") from None
        expired = threading.Event()

        def kill() -> None:
            expired.set()
            _kill(process)

        timer = threading.Timer(timeout, kill)
        timer.start()
        assert process.stdout is not None
        try:
            out = process.stdout.read() if max_bytes is None else process.stdout.read(max_bytes + 1)
            cut = max_bytes is not None and len(out) > max_bytes
            if cut:
                _kill(process)
                out = out[: max_bytes or 0]
            code = process.wait()
        finally:
            timer.cancel()
            process.stdout.close()
        errors.seek(0)
        err = errors.read(8192).decode("utf-8", "replace")
    if expired.is_set():
        raise GitTimeout(f"git {args[0]} ran past {timeout:g} s")
    return GitResult(code, out, err, cut)


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def filter_overrides(cwd: Path, ceiling: Iterable[Path] = ()) -> list[str]:
    """`-c` options that switch off every filter driver git's config names (reading config runs
    nothing): a diff or `ls-files --others` reads files through them otherwise."""
    command = ["config", "-z", "--name-only", "--get-regexp", r"^filter\."]
    found = run_git(command, cwd, ceiling=ceiling)
    names = set()
    for key in found.out.decode("utf-8", "replace").split("\0"):
        head, _, field = key.rpartition(".")
        if head.startswith("filter.") and field in (*FILTER_KEYS, "required"):
            names.add(head.removeprefix("filter."))
    if len(names) > MAX_FILTERS:
        raise GitError(
            f"The repository's config names {len(names)} filter drivers; at most {MAX_FILTERS} "
            "can be switched off."
        )
    options: list[str] = []
    for name in sorted(names):
        if "=" in name or "\n" in name:  # cannot be named on a command line: refused
            raise GitError(f"git cannot be told to skip the filter {name!r}.")
        for field in FILTER_KEYS:
            options += ["-c", f"filter.{name}.{field}="]
        options += ["-c", f"filter.{name}.required=false"]
    return options


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path.is_relative_to(root.resolve()) for root in roots)


def repository(cwd: Path, roots: Iterable[Path]) -> Path | None:
    """The top of the work tree holding cwd (None: not in one, or git is not there).

    OutsideRoots when the work tree, its git directory (a `.git` file may point anywhere), the
    common one of a linked work tree, or an object store it borrows from (alternates) is not
    inside the workspace roots: git would read that repository's files and history.
    """
    roots = tuple(roots)
    command = ["rev-parse", "--show-toplevel", "--absolute-git-dir", "--git-common-dir"]
    found = run_git(command, cwd, ceiling=roots)
    lines = found.out.decode("utf-8", "surrogateescape").split("\n")
    if found.code != 0 and "not a git repository" in found.err:
        return None
    if found.code != 0 or len(lines) < 3:  # dubious ownership, a broken .git...
        raise GitError(f"git could not read the repository: {found.reason()}")
    top, git_dir = Path(lines[0]).resolve(), Path(lines[1]).resolve()
    common = (cwd / lines[2]).resolve()  # (printed relative to cwd, or absolute)
    places = [top, git_dir, common]
    try:
        borrowed = (common / "objects" / "info" / "alternates").read_text("utf-8", "replace")
    except OSError:
        borrowed = ""
    store = common / "objects"
    lent = [line for line in borrowed.splitlines() if line.strip() and not line.startswith("#")]
    places += [(store / line).resolve() for line in lent]
    if roots and not all(_inside(place, roots) for place in places):  # (no roots: no check)
        raise OutsideRoots(f"The repository at {top} uses files outside the workspace roots.")
    return top
