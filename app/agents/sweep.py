"""Find and kill processes by the relay marker in their environment; also the watcher script.

Stdlib only, and light, because it also runs alone as each relay's watcher:
`python -I -S sweep.py MARKER` blocks until its stdin (a pipe whose write end only the relay
holds) reaches end-of-file, which happens when the relay ends however it ends, and then kills
every process whose environment carries exactly that marker.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

RELAY_ENV = "OARLOCK_RELAY"
PROC = "/proc"
REAP_ROUNDS = 5  # scans repeated while they find something (a child forked mid-scan)


def supported() -> bool:
    """Whether this system has prctl(PR_SET_PDEATHSIG) and /proc."""
    return sys.platform.startswith("linux") and os.path.isdir(PROC)


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def start_time(pid: int) -> int | None:
    """When a running process started (clock ticks after boot); None if it is not running."""
    try:
        stat = _read(f"{PROC}/{pid}/stat").decode()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the name, in parentheses, may hold spaces
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # a zombie has ended
        return None
    return int(fields[19])  # field 22 of proc(5); fields[0] is field 3


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
    if len(parts) != 4 or parts[0] != key or not (parts[1] + parts[2]).isdigit():
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


def _kill_if(pid: int, wanted: Callable[[str | None], bool]) -> bool:
    """Kill process pid if its marker is wanted; True if it was signalled."""
    try:
        pidfd = _pidfd(pid)
    except ProcessLookupError:
        return False
    try:
        try:
            environ = _read(f"{PROC}/{pid}/environ")
        except OSError:  # gone, or another user's process
            return False
        if not wanted(marker_of(environ)):
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


def kill_marked(wanted: Callable[[str | None], bool]) -> list[int]:
    """Kill every other process whose marker is wanted; return their pids."""
    if not supported():
        return []
    killed = [os.getpid()]  # never this process
    for _ in range(REAP_ROUNDS):
        found = [
            int(entry.name)
            for entry in os.scandir(PROC)
            if entry.name.isdigit()
            and int(entry.name) not in killed  # (one killed may not have exited yet)
            and _kill_if(int(entry.name), wanted)
        ]
        killed += found
        if not found:
            break
    return killed[1:]


def watch(marker: str) -> None:
    """Block until the relay's end closes stdin, then kill its agents' processes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the relay
    while sys.stdin.buffer.read(4096):
        pass
    kill_marked(lambda found: found == marker)


if __name__ == "__main__":
    watch(sys.argv[1])
