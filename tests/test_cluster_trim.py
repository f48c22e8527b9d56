"""A node that reads a conversation's stream after Redis trimmed it tells its tabs to resync.

Two nodes' hubs on a real Redis: node a in the test's loop, node b on a loop of its own in a
thread, so that b can stall (its loop held, as by a long pause of the process) while a streams
more stream entries than a stream keeps (MAXLEN ~ STREAM_RUNS). The events b had not read are gone:
its tab must get every event or be told to resync, never a silent hole.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import redis

from app.cluster.events import RUN_EVENTS, STREAM_RUNS, ClusterHub, stream_key
from app.hub import RESYNC, Subscriber
from tests.cluster_hubs import CID, STORED, Node, hub_and_node


@pytest.fixture
async def nodes() -> AsyncIterator[tuple[ClusterHub, Node]]:
    """Node a (this loop) and node b (its own loop), on one Redis."""
    async with hub_and_node() as pair:
        yield pair


def seqs(texts: list[str]) -> list[int]:
    """The seqs of the events among texts (frames of one event each)."""
    return [json.loads(text)["seq"] for text in texts if text != RESYNC]


async def test_a_tab_on_a_node_that_read_too_late_is_told_to_resync(
    nodes: tuple[ClusterHub, Node],
) -> None:
    a, b = nodes
    hub = b.hub
    assert hub is not None

    async def follow() -> Subscriber:
        await hub.prepare(CID)
        tab = hub.connect()
        hub.follow(tab, CID)
        return tab

    tab = b.call(follow)

    async def delivered() -> int:
        return hub.current_seq(CID)

    async def taken() -> list[str]:
        return tab.pending()

    async def until_delivered(seq: int) -> None:
        async with asyncio.timeout(60):
            while await asyncio.to_thread(b.call, delivered) < seq:  # noqa: ASYNC110 - b polls
                await asyncio.sleep(0.05)

    for _ in range(10):
        a.emit(CID, {"type": "delta", "entry_id": 1, "text": "x"})
    await a.flush()
    await until_delivered(STORED + 10)
    assert seqs(b.call(taken)) == list(range(STORED + 1, STORED + 11))

    release = b.stall()  # node b's loop is held: it reads nothing meanwhile
    count = 2 * STREAM_RUNS
    for _ in range(count):  # one stream entry each (a run is packed in one)
        a.emit(CID, {"type": "delta", "entry_id": 1, "text": "y"})
        await a.flush()
    last = STORED + 10 + count
    # The case under test: events after the last one b read were trimmed away.
    first = redis.Redis.from_url(b.url).xrange(stream_key(CID), count=1)
    # (b may get one entry late)
    assert int(first[0][1][b"s"].split()[0]) > STORED + 11 + RUN_EVENTS
    release.set()

    await until_delivered(last)
    texts = b.call(taken)
    got = seqs(texts)
    # Every event after those it had, or a resync (the tab reloads its state: a snapshot).
    assert RESYNC in texts or got == list(range(STORED + 11, last + 1)), (got[:3], len(got))
    assert RESYNC in texts  # (every event cannot be: they were trimmed before b read them)
