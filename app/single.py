"""One relay per data directory (and per SQLite database): a lock the kernel drops with the
process, however it ends (kill -9 included).

A second `oarlock serve` on the same data ran its start-up recovery on the first relay's
database (its running turns got "The relay restarted…" lines) and, on another port, served
the same conversations with agents of its own (an operator review; README "Port in use"
sent people there). Now it stops at once, naming the relay that holds the lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "relay.lock"  # in the data directory; beside a SQLite file kept elsewhere: <file>.lock

_held: list[int] = []  # the locks' descriptors, open for the process's life


def lock_error(path: Path, what: str) -> str | None:
    """Take the lock file at path for this process; or why not (another relay holds it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # (not inherited by agents: PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        named = f" (process {holder})" if holder else ""
        return (
            f"Another oarlock relay{named} runs on {what}: stop it first, or give this one "
            "its own OARLOCK_DATA_DIR (and database). If it is the one you meant to start, "
            "it is running already."
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held.append(fd)
    return None


def _holder(fd: int) -> int | None:
    """The process id the relay holding the lock wrote in it (None: unreadable)."""
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def single_error(data_dir: Path, sqlite_file: Path | None) -> str | None:
    """Lock the data directory, and a SQLite database kept outside it; or why not."""
    problem = lock_error(data_dir / LOCK_FILE, f"the data directory {data_dir}")
    if (
        problem is None
        and sqlite_file is not None
        and sqlite_file.parent.resolve() != data_dir.resolve()
        and sqlite_file.parent.is_dir()  # (else opening the database says what is wrong)
    ):
        lock = sqlite_file.with_name(sqlite_file.name + ".lock")
        problem = lock_error(lock, f"the database {sqlite_file}")
    return problem
