"""A throwaway Redis server for the cluster tests: Debian's redis-server, a temp dir, loopback.

No persistence (no RDB snapshot, no AOF): the test run's data dies with the server.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import redis

from app.cluster.events import BROADCAST
from tests.postgres import _die_with_parent, _free_port


class RedisServer:
    """redis-server as a child process on a free loopback port, in a temp directory."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="oarlock-redis-"))
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.root / "redis.log"

    @property
    def url(self) -> str:
        """The server's URL for OARLOCK_REDIS_URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: `make test` installs it (make redis)"
            )
        command = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.root),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(self.log),
        ]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.root,
            preexec_fn=_die_with_parent,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError as error:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        text = self.log.read_text(errors="replace") if self.log.exists() else ""
                        self.stop()
                        raise RuntimeError(f"Redis did not start: {text}") from error
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL), wait for it, remove its directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def acl(url: str, rules: Sequence[str], undo: Sequence[str]) -> Iterator[None]:
    """Change what the nodes may do in Redis (the default user's ACL), then change it back."""
    client = redis.Redis.from_url(url)
    try:
        client.execute_command("ACL", "SETUSER", "default", *rules)
        try:
            yield
        finally:
            client.execute_command("ACL", "SETUSER", "default", *undo)
    finally:
        client.close()


def control_forbidden(url: str) -> AbstractContextManager[None]:
    """Nobody may publish on the control channel for a moment (the event channel stays).

    As when Redis drops a pub/sub message or a node is between subscriptions: a node that
    sends a control notice meanwhile logs that it cannot.
    """
    return acl(url, ["resetchannels", "&" + BROADCAST], ["allchannels"])
