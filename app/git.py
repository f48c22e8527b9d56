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
    "--no-optional-locks",
    "--no-pager",
)
GIT_ENV_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")  # not the relay's secrets
FILTER_KEYS = ("clean", "smudge", "process")


class GitMissing(Exception):
    """git is not installed (or cannot be run)."""


class GitTimeout(Exception):
    """git ran past its time."""


@dataclass(frozen=True)
class GitResult:
    """What a git command printed (stdout cut at the asked size), and how it ended."""

    code: int
    out: bytes
    err: str
    cut: bool = False

    def reason(self) -> str:
        """git's own first error line, for a message."""
        lines = [line.strip() for line in self.err.splitlines() if line.strip()]
        return lines[0].removeprefix("fatal: ") if lines else f"git exited with {self.code}"


def git_env(ceiling: Iterable[Path] = ()) -> dict[str, str]:
    """git's environment: a few of the relay's variables, and no repository above ceiling's
    parents (a home's dotfiles repository is not the project's)."""
    env = {name: os.environ[name] for name in GIT_ENV_NAMES if name in os.environ}
    env["GIT_CEILING_DIRECTORIES"] = os.pathsep.join(str(top.parent) for top in ceiling)
    env["GIT_LITERAL_PATHSPECS"] = "1"  # a path is a path: no ":(glob)" or ":!" magic
    env["GIT_TERMINAL_PROMPT"] = "0"
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
    try:
        process = subprocess.Popen(
            ["git", *GIT_OPTIONS, *args],
            cwd=cwd,
            env=git_env(ceiling),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # killed with whatever it started
        )
    except OSError as error:
        raise GitMissing(str(error)) from None
    expired = threading.Event()

    def kill() -> None:
        expired.set()
        _kill(process)

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        assert process.stdout is not None and process.stderr is not None
        out = process.stdout.read() if max_bytes is None else process.stdout.read(max_bytes + 1)
        cut = max_bytes is not None and len(out) > max_bytes
        if cut:
            _kill(process)
            out = out[: max_bytes or 0]
        err = process.stderr.read(8192).decode("utf-8", "replace")
        code = process.wait()
    finally:
        timer.cancel()
        process.stdout.close()
        process.stderr.close()
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
    options: list[str] = []
    for name in sorted(names):
        if "=" in name or "\n" in name:  # cannot be named on a command line: refused
            raise ValueError(f"git cannot be told to skip the filter {name!r}")
        for field in FILTER_KEYS:
            options += ["-c", f"filter.{name}.{field}="]
        options += ["-c", f"filter.{name}.required=false"]
    return options
