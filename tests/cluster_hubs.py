"""Cluster hubs on a real Redis (started here) for the tests: two in one loop, or one in a thread.

A hub in a thread (`Node`) runs on a loop of its own, as another relay node's loop does, so a
test can stall it while the hub in the test's loop goes on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from app.cluster.events import ClusterHub
from tests.redis import RedisServer

T = TypeVar("T")
STORED = 10  # the database's last_seq of every conversation
CID = 7


class Node(threading.Thread):
    """A cluster hub running on its own event loop in a thread (a relay node's loop)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.hub: ClusterHub | None = None

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.hub = ClusterHub(lambda _cid: STORED, self.url, "b")
        self.loop.run_until_complete(self.hub.start())
        self.started.set()
        self.loop.run_forever()

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run a coroutine on the node's loop and return its result."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(fn(), self.loop)
        return future.result(timeout=60)

    def stall(self) -> threading.Event:
        """Hold the node's loop until the returned event is set (nothing runs on it meanwhile)."""
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            held.set()
            release.wait(60)

        self.loop.call_soon_threadsafe(hold)
        assert held.wait(10)
        return release

    def finish(self) -> None:
        """Stop the hub and the loop."""
        assert self.hub is not None
        hub = self.hub

        async def stop() -> None:
            await hub.stop()

        self.call(stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.join(10)
        self.loop.close()


@asynccontextmanager
async def two_hubs() -> AsyncIterator[tuple[ClusterHub, ClusterHub, str]]:
    """Two nodes' hubs in this loop on one Redis (last_seq STORED everywhere), and its URL."""
    server = RedisServer().start()
    made = [ClusterHub(lambda _cid: STORED, server.url, node) for node in ("a", "b")]
    try:
        for hub in made:
            await hub.start()
        yield made[0], made[1], server.url
    finally:
        for hub in made:
            await hub.stop()
        server.stop()


@asynccontextmanager
async def hub_and_node() -> AsyncIterator[tuple[ClusterHub, Node]]:
    """Node a (this loop) and node b (its own loop, in a thread), on one Redis."""
    server = RedisServer().start()
    a = ClusterHub(lambda _cid: STORED, server.url, "a")
    b = Node(server.url)
    try:
        await a.start()
        b.start()
        assert b.started.wait(20)
        yield a, b
    finally:
        await a.stop()
        if b.is_alive():
            b.finish()
        server.stop()
