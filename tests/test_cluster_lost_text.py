"""A node that lost deltas of a streaming message (trimmed) gets its whole text from the owner.

Node a (this loop) stands for the owner: it streams one message's deltas; node b (its own
loop, tests/cluster_hubs.py) follows it with a tab and is stalled while more entries
are appended than its stream keeps. On resuming, b finds the hole and tells its tab to
resync; its text of the message lacks the lost deltas. b must ask the owner (`on_lost`) and,
once the owner's whole text arrives, snapshot the message right while it still streams.
The owner's answer here is what `Supervisor.publish_live_text` does: the whole text so far in
an "entry" event numbered after every delta in it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from app.cluster.events import STREAM_RUNS, ClusterHub
from app.hub import RESYNC, Subscriber
from tests.cluster_hubs import CID, STORED, Node, hub_and_node

ENTRY = 1


@pytest.fixture
async def nodes() -> AsyncIterator[tuple[ClusterHub, Node]]:
    """Node a (this loop) and node b (its own loop), on one Redis."""
    async with hub_and_node() as pair:
        yield pair


def streaming(text: str) -> dict[str, object]:
    """The "entry" event of the message while it streams, with its text so far."""
    return {"type": "entry", "entry": {"id": ENTRY, "state": "streaming", "text": text}}


async def test_a_node_that_lost_deltas_gets_the_whole_text_from_the_owner(
    nodes: tuple[ClusterHub, Node],
) -> None:
    a, b = nodes
    hub = b.hub
    assert hub is not None
    loop = asyncio.get_running_loop()
    sent: list[str] = []  # the message's deltas, in the order a numbered them
    asked: list[int] = []

    def answer() -> None:  # on a's loop: the owner publishes the whole text so far
        a.emit(CID, streaming("".join(sent)))

    def on_lost(cid: int) -> None:  # on b's loop
        asked.append(cid)
        loop.call_soon_threadsafe(answer)

    hub.on_lost = on_lost

    async def follow() -> Subscriber:
        await hub.prepare(CID)
        tab = hub.connect()
        hub.follow(tab, CID)
        return tab

    tab = b.call(follow)

    def delta(text: str) -> None:
        sent.append(text)
        a.emit(CID, {"type": "delta", "entry_id": ENTRY, "text": text})

    async def seen() -> tuple[int, dict[int, str], list[str]]:
        return hub.current_seq(CID), hub.live_text(CID), tab.pending()

    got: list[str] = []

    async def until_delivered(seq: int) -> dict[int, str]:
        async with asyncio.timeout(60):
            while True:
                delivered, live, texts = await asyncio.to_thread(b.call, seen)
                got.extend(texts)
                if delivered >= seq:
                    return live
                await asyncio.sleep(0.05)

    a.emit(CID, streaming(""))
    for n in range(5):
        delta(f"<{n}>")
    await a.flush()
    assert await until_delivered(STORED + 6) == {ENTRY: "<0><1><2><3><4>"}

    release = b.stall()  # b reads nothing while a appends more entries than a stream keeps
    for n in range(5, 5 + 2 * STREAM_RUNS):
        delta(f"<{n}>")
        await a.flush()  # one stream entry each
    release.set()
    await until_delivered(STORED + 6 + 2 * STREAM_RUNS)
    assert RESYNC in got  # the case under test: b's tab lost events

    # The message streams on; b's text of it (what its snapshots show) must become the
    # owner's, exactly, before the message ends (its final event would carry the text).
    for n in range(20):
        delta(f"<{5 + 2 * STREAM_RUNS + n}>")
        await a.flush()
    live = await until_delivered(a.current_seq(CID))
    assert live == {ENTRY: "".join(sent)}
    assert asked == [CID]  # asked once, not at every delta
