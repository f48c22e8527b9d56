"""Agent processes end with the relay that started them (Linux; elsewhere this does nothing).

Two layers, because a CLI's tool commands run in sessions of their own (no process group of
the CLI reaches them) and a SIGKILLed relay runs no code at all:

* die_with_relay(): every agent CLI is started through pdeathsig.py, so the kernel SIGKILLs
  it the moment the relay dies, however it dies.
* Every agent process gets RELAY_ENV = "<data dir key> <relay pid> <relay start time>", and
  its children inherit it. reap_leftovers(), run when a relay starts, kills each process
  whose marker names this data directory and a relay that no longer runs. Nothing is killed
  on a pid alone: the marker is read from the process itself, the relay's liveness is its
  pid *and* start time, and the signal goes through a pidfd taken before the marker was read.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

RELAY_ENV = "OARLOCK_RELAY"
WRAPPER = Path(__file__).with_name("pdeathsig.py")
PROC = Path("/proc")
REAP_ROUNDS = 5  # scans repeated while they find something (a child forked mid-scan)


def supported() -> bool:
    """Whether this system has prctl(PR_SET_PDEATHSIG) and /proc."""
    return sys.platform.startswith("linux") and PROC.is_dir()


def die_with_relay(command: Sequence[str]) -> list[str]:
    """Return command wrapped so that the kernel kills it when this process dies."""
    if not supported():
        return list(command)
    return [sys.executable, "-I", "-S", str(WRAPPER), str(os.getpid()), *command]


def data_key(data_dir: Path) -> str:
    """A short fixed-length name for a data directory."""
    return hashlib.sha256(str(data_dir.expanduser().resolve()).encode()).hexdigest()[:16]


def start_time(pid: int) -> int | None:
    """When a running process started (clock ticks after boot); None if it is not running."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the name, in parentheses, may hold spaces
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # a zombie has ended
        return None
    return int(fields[19])  # field 22 of proc(5); fields[0] is field 3


def relay_marker(data_dir: Path) -> str:
    """The value of RELAY_ENV for agents this process starts."""
    pid = os.getpid()
    return f"{data_key(data_dir)} {pid} {start_time(pid) or 0}"


def marker_of(environ: bytes) -> str | None:
    """The RELAY_ENV value in a /proc/<pid>/environ dump, if any."""
    prefix = f"{RELAY_ENV}=".encode()
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def is_leftover(marker: str | None, key: str) -> bool:
    """True when a marker names this data directory and a relay that no longer runs."""
    parts = (marker or "").split()
    if len(parts) != 3 or parts[0] != key or not (parts[1] + parts[2]).isdigit():
        return False
    return start_time(int(parts[1])) != int(parts[2])  # a reused pid has another start time


def _pidfd(pid: int) -> int | None:
    """A pidfd for pid, None where the kernel has none; raises ProcessLookupError if gone."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except (AttributeError, OSError):
        return None


def _kill_if_leftover(pid: int, key: str) -> bool:
    try:
        pidfd = _pidfd(pid)
    except ProcessLookupError:
        return False
    try:
        try:
            environ = (PROC / str(pid) / "environ").read_bytes()
        except OSError:  # gone, or another user's process
            return False
        if not is_leftover(marker_of(environ), key):
            return False
        try:
            if pidfd is not None:  # the process read above, even if its pid was reused since
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            return False
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def reap_leftovers(data_dir: Path) -> list[int]:
    """Kill the agent processes a previous relay on data_dir left running; return their pids."""
    if not supported():
        return []
    key, killed = data_key(data_dir), [os.getpid()]  # never this process
    for _ in range(REAP_ROUNDS):
        found = [
            int(entry.name)
            for entry in os.scandir(PROC)
            if entry.name.isdigit()
            and int(entry.name) not in killed  # (one killed may not have exited yet)
            and _kill_if_leftover(int(entry.name), key)
        ]
        killed += found
        if not found:
            break
    killed = killed[1:]
    if killed:
        log.warning("killed %d agent processes left by a relay that ended", len(killed))
    return killed
