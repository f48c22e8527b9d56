"""The cluster hub against a real Redis (started by the test): numbering, replay, trimming."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator

import pytest

from app.cluster.events import STREAM_RUNS, ClusterHub
from tests.cluster_hubs import two_hubs


@pytest.fixture
async def hubs() -> AsyncIterator[tuple[ClusterHub, ClusterHub]]:
    """Two nodes' hubs on one Redis; the database's last_seq is 10 for every conversation."""
    async with two_hubs() as (a, b, _url):
        yield a, b


async def until(condition: object, seconds: float = 20) -> None:
    """Wait for condition() (a callable) to hold."""
    async with asyncio.timeout(seconds):
        while not condition():  # type: ignore[operator]  # noqa: ASYNC110 - the reader task
            await asyncio.sleep(0.01)


async def test_numbers_are_shared_and_start_above_the_stored_ones(
    hubs: tuple[ClusterHub, ClusterHub],
) -> None:
    a, b = hubs
    assert a.epoch == b.epoch
    assert [a.next_seq(1), b.next_seq(1), a.next_seq(1)] == [11, 12, 13]
    assert b.next_seq(2) == 11  # each conversation its own counter


async def test_a_node_replays_what_another_published_and_a_trimmed_start_is_a_snapshot(
    hubs: tuple[ClusterHub, ClusterHub],
) -> None:
    a, b = hubs
    count = STREAM_RUNS + 500
    for _ in range(count):  # one stream entry each (a run is packed in one)
        a.emit(7, {"type": "delta", "entry_id": 1, "text": "x"})
        await a.flush()
    last = 10 + count
    # Appended: a's events are on their way (numbering thread, outbox) until then. A stream
    # read before any arrived is empty while the counter says `last`: b would take them all
    # as delivered before it followed, and never replay them (the old flakiness).
    await a.flush()
    await b.prepare(7)
    # The counter is shared (it says `last` at once): wait for what b itself read.
    await until(lambda: b.missed(7, b.epoch, last - 1) is not None)
    assert b.missed(7, b.epoch, 11) is None  # trimmed away: the tab gets a snapshot
    tail = b.missed(7, b.epoch, last - 5)
    assert tail is not None and [p.seq for p in tail] == list(range(last - 4, last + 1))
    assert b.missed(7, "another-epoch", last - 5) is None
    a.emit(7, {"type": "turn", "turn": {"state": "idle", "queued": 0}})  # live, after prepare
    await until(lambda: b.state(7, "turn") is not None)
    assert b.current_seq(7) == last + 1
    assert b.state(7, "turn") == {"state": "idle", "queued": 0}


async def test_conversations_released_by_the_idle_sweep_never_end_the_stream_reader(
    hubs: tuple[ClusterHub, ClusterHub],
) -> None:
    """The idle sweep releases conversations in the writer thread while the hub's reader task
    goes through the followed ones on the loop. Without a lock in common, a release in the
    middle of the reader's look ended the reader ("dictionary changed size during iteration")
    and the node's tabs got no more events. Here a thread releases while the loop follows the
    conversations again, and another node's events keep the reader looking (on the code
    before, 4 of 5 runs ended the reader)."""
    a, b = hubs
    await a.prepare(7)
    cids = range(100, 300)
    done = threading.Event()

    def sweep() -> None:
        while not done.is_set():
            for cid in cids:
                a.release(cid)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the GIL changes hands often: in the reader's look too
    thread = threading.Thread(target=sweep)
    thread.start()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            b.emit(7, {"type": "delta", "entry_id": 1, "text": "x"})
            for cid in cids:
                await a.prepare(cid)
    finally:
        done.set()
        thread.join(10)
        sys.setswitchinterval(interval)
    assert all(not task.done() for task in a._tasks), [t for t in a._tasks if t.done()]
    last = b.current_seq(7)
    await b.flush()
    await until(lambda: a.current_seq(7) == last)  # a still reads b's events
