"""Several relay nodes for the cluster tests: PostgreSQL and Redis started by the test.

Each node is a real `python -m app serve` (tests/crash.py), with its own data directory, one
shared PostgreSQL database and one Redis; they share a workspace (as shared storage would).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.migrate import upgrade
from tests import postgres
from tests.crash import RelayProcess
from tests.redis import RedisServer

LEASE_SECONDS = 3  # a dead node's conversations move after at most this (plus a heartbeat)


class Nodes:
    """Relay processes sharing a database and a Redis."""

    def __init__(self, root: Path, database_url: str, redis: RedisServer) -> None:
        self.root = root
        self.redis = redis
        self.workspace = root / "shared"
        (self.workspace / "work").mkdir(parents=True, exist_ok=True)
        self.database_url = database_url
        self.redis_url = redis.url
        self.nodes: list[RelayProcess] = []

    def env(self, **extra: str) -> dict[str, str]:
        """The settings every node of this cluster gets."""
        return {
            "OARLOCK_DATABASE_URL": self.database_url,
            "OARLOCK_REDIS_URL": self.redis_url,
            "OARLOCK_LEASE_SECONDS": str(LEASE_SECONDS),
            "OARLOCK_WORKSPACE_ROOTS": str(self.workspace),
            "OARLOCK_DEFAULT_CWD": str(self.workspace / "work"),
            "OARLOCK_DEMO_DELAY": "0.02",
            **extra,
        }

    def start(self, count: int, **extra: str) -> list[RelayProcess]:
        """Start count more nodes."""
        started = []
        for _ in range(count):
            node = RelayProcess(self.root / f"node{len(self.nodes) + 1}")
            self.nodes.append(node)
            started.append(node.start(**self.env(**extra)))
        return started

    def close(self) -> None:
        """Stop every node still running."""
        for node in self.nodes:
            node.close()

    def kill(self, node: RelayProcess) -> None:
        """kill -9 of one node (its agents are the demo's: in process, they die with it)."""
        node.kill(signal.SIGKILL)


@contextmanager
def cluster(root: Path) -> Iterator[Nodes]:
    """PostgreSQL (a new database on the session's server) and a Redis of its own."""
    url = postgres.start().create_database()
    upgrade(url)
    server = RedisServer().start()
    nodes = Nodes(root, url, server)
    try:
        yield nodes
    finally:
        nodes.close()
        server.stop()
        postgres.start().drop_database(url)
