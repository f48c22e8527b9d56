"""A burst's numbers taken at once, runs of events appended at once, a lost hole skipped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from app.cluster.events import BROADCAST, RUN_CHARS, RUN_EVENTS, ClusterHub, _commands, id_pair
from app.cluster.ordering import Orderer
from app.hub import RESYNC
from tests.cluster_hubs import two_hubs


def test_each_run_of_one_streams_events_is_one_entry_in_order() -> None:
    batch = [("x", (1, 11, "a")), ("x", (1, 12, "b")), ("b", "list"), ("x", (2, 5, "c"))]
    batch += [("x", (1, 13, "d"))]
    assert list(_commands(batch)) == [
        ("x", "oarlock:events:1", ["11 12", "a\nb"]),
        ("b", BROADCAST, ["list"]),
        ("x", "oarlock:events:2", ["5", "c"]),
        ("x", "oarlock:events:1", ["13", "d"]),
    ]
    long = [("x", (1, n, "t")) for n in range(RUN_EVENTS + 1)]
    runs = list(_commands(long))
    assert [args[0].count(" ") + 1 for _kind, _key, args in runs] == [RUN_EVENTS, 1]
    big = [
        ("x", (1, 1, "a" * (RUN_CHARS - 1))),
        ("x", (1, 2, "bb")),
        ("x", (1, 3, "c" * RUN_CHARS)),
    ]
    assert [args[0] for _kind, _key, args in _commands(big)] == ["1", "2", "3"]


def test_stream_ids_compare_as_redis_orders_them() -> None:
    assert id_pair(b"1700000000000-10") > id_pair("1700000000000-9")
    assert id_pair("0-0") < id_pair(b"1-0")


def test_a_lost_hole_is_skipped_at_once() -> None:
    order = Orderer(delivered=4)
    order.add(7, "seven", now=0.0)
    order.add(9, "nine", now=0.0)
    assert order.skip() == [(7, "seven"), (9, "nine")]
    assert order.delivered == 9 and not order.waiting and order.since is None
    assert order.add(10, "ten", now=0.0) == [(10, "ten")]


@pytest.fixture
async def hubs() -> AsyncIterator[tuple[ClusterHub, ClusterHub]]:
    """Two nodes' hubs on one Redis; the database's last_seq is 10 for every conversation."""
    async with two_hubs() as (a, b, _url):
        yield a, b


async def test_numbers_taken_for_a_burst_are_its_own_and_the_unused_ones_filled(
    hubs: tuple[ClusterHub, ClusterHub],
) -> None:
    a, b = hubs
    await b.prepare(7)
    tab = b.connect()
    b.follow(tab, 7)
    taken: list[int] = []

    def burst() -> None:  # a storage job (a thread): five numbers, three used
        with a.reserved(7, 5):
            for _ in range(3):
                seq = a.next_seq(7)
                taken.append(seq)
                a.publish(7, {"type": "delta", "entry_id": 1, "text": "x", "seq": seq})
            taken.append(b.next_seq(7))  # another node meanwhile: after the five

    loop = asyncio.get_running_loop()
    a.soon = lambda fn, *args: loop.call_soon_threadsafe(fn, *args)  # as storage.soon does
    await asyncio.to_thread(burst)
    assert taken == [11, 12, 13, 16]
    assert a.next_seq(7) == 17  # (not in a burst: the counter, as before)
    b.publish(7, {"type": "delta", "entry_id": 1, "text": "y", "seq": 16})
    a.publish(7, {"type": "delta", "entry_id": 1, "text": "z", "seq": 17})
    async with asyncio.timeout(20):
        while b.current_seq(7) < 17:  # noqa: ASYNC110 - the reader task
            await asyncio.sleep(0.01)
    events = [json.loads(text) for text in tab.pending()]
    assert [e["seq"] for e in events] == list(range(11, 18))  # no hole waited for
    assert [e["type"] for e in events] == ["delta"] * 3 + ["skip", "skip"] + ["delta"] * 2


async def test_a_hole_waited_for_in_vain_makes_the_tabs_resync(
    hubs: tuple[ClusterHub, ClusterHub],
) -> None:
    a, b = hubs
    await b.prepare(8)
    tab = b.connect()
    b.follow(tab, 8)
    lost = await asyncio.to_thread(a.next_seq, 8)  # taken by a node that died before appending
    seq = await asyncio.to_thread(a.next_seq, 8)
    a.publish(8, {"type": "delta", "entry_id": 1, "text": "after the hole", "seq": seq})
    async with asyncio.timeout(20):
        while b.current_seq(8) < seq:  # noqa: ASYNC110 - the reader task (2 s: GAP_WAIT)
            await asyncio.sleep(0.05)
    assert lost == seq - 1
    assert tab.pending() == [RESYNC]  # not the later event alone, with a silent gap
