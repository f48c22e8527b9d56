"""A run of events packed in one stream entry: fewer entries, the same exact replay."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import redis

from app.cluster.events import ClusterHub, stream_key
from app.hub import Subscriber
from tests.cluster_hubs import two_hubs
from tests.test_cluster_events import until

CID = 7


@pytest.fixture
async def hubs() -> AsyncIterator[tuple[ClusterHub, ClusterHub, str]]:
    """Two nodes' hubs on one Redis (last_seq 10), and its URL."""
    async with two_hubs() as made:
        yield made


async def test_a_burst_is_packed_and_a_resume_inside_an_entry_gets_exactly_the_rest(
    hubs: tuple[ClusterHub, ClusterHub, str],
) -> None:
    a, b, url = hubs
    for n in range(20):
        a.emit(CID, {"type": "delta", "entry_id": 1, "text": f"<{n}>\n"})
    # Made at once, they go out in runs: the writer takes what waits. Held here (the loop
    # blocked until the numbering thread has handed all 20 on), the writer finds all of them
    # waiting; left to timing, a writer faster than the numbering took them one by one.
    a._numbering.submit(lambda: None).result(timeout=10)
    await a.flush()
    entries = redis.Redis.from_url(url).xrange(stream_key(CID))
    assert len(entries) < 20  # packed (one entry per event before)
    await b.prepare(CID)
    await until(lambda: b.current_seq(CID) == 30)
    # A tab that had seq 14 (inside an entry) reconnects to b: exactly 15..30, in order.
    tail = b.missed(CID, b.epoch, 14)
    assert tail is not None
    assert [p.seq for p in tail] == list(range(15, 31))
    assert [json.loads(p.text)["text"] for p in tail] == [f"<{n}>\n" for n in range(4, 20)]
    # A tab following on b live gets the next run whole and in order too.
    tab: Subscriber = b.connect()
    b.follow(tab, CID)
    for n in range(5):
        a.emit(CID, {"type": "delta", "entry_id": 1, "text": f"[{n}]"})
    got: list[str] = []
    await until(lambda: len(got.extend(tab.pending()) or got) >= 5)  # (pending takes them)
    assert [json.loads(t)["seq"] for t in got] == list(range(31, 36))
