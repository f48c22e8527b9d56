"""Agent processes end with the relay that started them (Linux; elsewhere this does nothing).

Three layers, because a CLI's tool commands run in sessions of their own (no process group of
the CLI reaches them) and a SIGKILLed relay runs no code at all:

* die_with_relay(): every agent CLI is started through pdeathsig.py, so the kernel SIGKILLs
  it the moment the relay dies, however it dies.
* Every agent process gets RELAY_ENV = "<data dir key> <relay pid> <relay start time>
  <instance>", and its children inherit it. A watcher process (sweep.py run as a script,
  in a session of its own) reads a pipe whose write end only the relay holds: when the
  relay ends, however, the watcher reads end-of-file and kills every process carrying this
  relay's exact marker.
* If the watcher was killed too, reap_leftovers(), run when a relay starts, kills each
  process whose marker names this data directory and a relay that no longer runs.

Nothing is killed on a pid alone: the marker is read from the process itself, a relay's
liveness is its pid *and* start time, and the signal goes through a pidfd taken before the
marker was read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from app.agents import sweep
from app.agents.sweep import is_leftover, kill_marked, start_time, supported

log = logging.getLogger(__name__)

WRAPPER = Path(__file__).with_name("pdeathsig.py")
WATCHER = Path(sweep.__file__)
WATCHER_WAIT = 5.0  # seconds a stopping relay waits for its watcher's last sweep
_started: dict[Path, str] = {}  # data dir -> marker of the relay running on it here


def die_with_relay(command: Sequence[str]) -> list[str]:
    """Return command wrapped so that the kernel kills it when this process dies.

    Strictly, when the spawning thread ends: spawn from the event loop's thread, which lasts
    as long as the relay.
    """
    if not supported():
        return list(command)
    return [sys.executable, "-I", "-S", str(WRAPPER), str(os.getpid()), *command]


def data_key(data_dir: Path) -> str:
    """A short fixed-length name for a data directory."""
    return hashlib.sha256(str(data_dir.expanduser().resolve()).encode()).hexdigest()[:16]


def relay_marker(data_dir: Path) -> str:
    """The value of RELAY_ENV for agents this process starts for data_dir."""
    data_dir = data_dir.expanduser().resolve()
    if marker := _started.get(data_dir):
        return marker
    pid = os.getpid()
    return f"{data_key(data_dir)} {pid} {start_time(pid) or 0} -"


def reap_leftovers(data_dir: Path) -> list[int]:
    """Kill the agent processes a relay on data_dir that ended left running; return their pids."""
    key = data_key(data_dir)
    killed = kill_marked(lambda marker: is_leftover(marker, key))
    if killed:
        log.warning("killed %d agent processes left by a relay that ended", len(killed))
    return killed


class Lifetime:
    """One relay's agent marker, its watcher, and the clean-up of what an earlier one left."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        pid = os.getpid()
        instance = secrets.token_hex(4)  # tells relays apart within one process (tests)
        self.marker = f"{data_key(self.data_dir)} {pid} {start_time(pid) or 0} {instance}"
        self._watcher: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None

    def start(self) -> None:
        """Kill what an ended relay left, then start the watcher; agents get self.marker."""
        reap_leftovers(self.data_dir)
        _started[self.data_dir] = self.marker
        if not supported():
            return
        read, self._pipe = os.pipe()  # both close-on-exec: no agent inherits the write end
        try:
            self._watcher = subprocess.Popen(
                [sys.executable, "-I", "-S", str(WATCHER), self.marker],
                stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                cwd="/", env={}, start_new_session=True,  # a group kill spares it
            )  # fmt: skip
        except OSError:
            log.warning("could not start the agent process watcher", exc_info=True)
        finally:
            os.close(read)

    async def stop(self) -> None:
        """Let the watcher kill whatever the stopped agents left, and wait for it (bounded)."""
        if _started.get(self.data_dir) == self.marker:
            del _started[self.data_dir]
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None
        if self._watcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self._watcher.wait, WATCHER_WAIT)
            if self._watcher.poll() is None:
                self._watcher.kill()
                self._watcher.wait()
