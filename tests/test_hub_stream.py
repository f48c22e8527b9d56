"""The conversation stream every tab reads at its own place (issue 18's fan-out work).

Publishing appends an event once, however many tabs follow; each tab keeps a cursor. These
check that each tab still gets exactly its events, in order, with its own messages where
they were queued, and that tabs at the same place share one frame.
"""

from __future__ import annotations

import json
from typing import Any

from app.hub import RESYNC, SOCKET_BUDGET, SUBSCRIBER_QUEUE, Hub, Subscriber


def seqs(texts: list[str]) -> list[Any]:
    """Each text's seq (or its type when it has none)."""
    events = [json.loads(text) for text in texts]
    return [event.get("seq", event.get("type")) for event in events]


def frame_seqs(frame: str) -> list[Any]:
    """The seqs of a frame (one event, or an array of them)."""
    data = json.loads(frame)
    return seqs([json.dumps(e) for e in (data if isinstance(data, list) else [data])])


async def test_tabs_at_the_same_place_share_one_frame_holding_exactly_their_events() -> None:
    hub = Hub(lambda _cid: 0)
    early, late = hub.connect(), hub.connect()
    hub.follow(early, 1)
    for n in range(5):
        hub.emit(1, {"type": "delta", "text": str(n)})
    hub.follow(late, 1)  # joins at seq 5: it gets what comes next only
    for n in range(3):
        hub.emit(1, {"type": "delta", "text": str(n)})
    others = [hub.connect() for _ in range(3)]
    for tab in others:
        hub.follow(tab, 1)
    assert frame_seqs(await early.frame(256)) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert frame_seqs(await late.frame(256)) == [6, 7, 8]
    for n in range(4):
        hub.emit(1, {"type": "delta", "text": str(n)})
    frames = [await tab.frame(256) for tab in (early, late, *others)]
    assert all(frame_seqs(frame) == [9, 10, 11, 12] for frame in frames)
    assert all(frame is frames[0] for frame in frames)  # joined once, for every tab


async def test_a_tab_s_own_messages_come_where_they_were_queued() -> None:
    hub = Hub(lambda _cid: 0)
    tab, other = hub.connect(), hub.connect()
    hub.follow(tab, 1)
    hub.follow(other, 1)
    hub.emit(1, {"type": "delta", "text": "a"})
    tab.offer({"type": "pong"})
    hub.emit(1, {"type": "delta", "text": "b"})
    hub.broadcast({"type": "conversation", "conversation": {"id": 2}})
    hub.emit(1, {"type": "delta", "text": "c"})
    expected = [1, "pong", 2, "conversation", 3]
    assert frame_seqs(await tab.frame(256)) == expected
    assert frame_seqs(await other.frame(256)) == [1, 2, "conversation", 3]


async def test_frames_in_order_across_limits() -> None:
    hub = Hub(lambda _cid: 0)
    tab = hub.connect()
    hub.follow(tab, 1)
    for n in range(10):
        hub.emit(1, {"type": "delta", "text": str(n)})
    tab.offer({"type": "pong"})
    hub.emit(1, {"type": "delta", "text": "x"})
    taken = [frame_seqs(await tab.frame(4)) for _ in range(3)]
    assert taken == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, "pong", 11]]
    assert tab.pending() == []


def test_switching_conversation_keeps_what_was_not_sent_yet_in_order() -> None:
    hub = Hub(lambda _cid: 0)
    tab = hub.connect()
    hub.follow(tab, 1)
    hub.emit(1, {"type": "delta", "text": "a"})
    tab.offer({"type": "pong"})
    hub.emit(1, {"type": "delta", "text": "b"})
    hub.follow(tab, 2)
    tab.offer({"type": "subscribed"})
    hub.emit(2, {"type": "turn"})
    hub.emit(1, {"type": "delta", "text": "not followed any more"})
    events = [json.loads(text) for text in tab.pending()]
    assert [(e.get("conversation_id"), e.get("seq", e["type"])) for e in events] == [
        (1, 1),
        (None, "pong"),
        (1, 2),
        (None, "subscribed"),
        (2, 1),
    ]


def test_a_stalled_tab_is_resynced_and_the_stream_forgets_what_it_missed() -> None:
    hub = Hub(lambda _cid: 0)
    stalled, reading = hub.connect(), hub.connect()
    hub.follow(stalled, 1)
    hub.follow(reading, 1)
    got: list[Any] = []
    for n in range(3 * SUBSCRIBER_QUEUE):
        hub.emit(1, {"type": "delta", "text": str(n)})
        if n % 100 == 0:
            got += seqs(reading.pending())
    got += seqs(reading.pending())
    assert got == list(range(1, 3 * SUBSCRIBER_QUEUE + 1))
    stream = stalled.stream
    assert stream is not None and len(stream.texts) <= SUBSCRIBER_QUEUE  # memory stays bounded
    assert (stalled.pending(), stalled.overflowed) == ([RESYNC], True)
    hub.emit(1, {"type": "turn"})
    assert stalled.pending() == []  # nothing more until it subscribes again
    assert seqs(reading.pending()) == [3 * SUBSCRIBER_QUEUE + 1]


def test_a_tab_more_characters_behind_than_the_budget_is_resynced() -> None:
    hub = Hub(lambda _cid: 0)
    stalled, reading = hub.connect(), hub.connect()
    hub.follow(stalled, 1)
    hub.follow(reading, 1)
    chunk = "x" * (SOCKET_BUDGET // 8)
    for _ in range(12):
        hub.emit(1, {"type": "delta", "text": chunk})
        assert len(reading.pending()) == 1
    assert (stalled.pending(), reading.overflowed) == ([RESYNC], False)


def test_a_subscriber_following_nothing_still_gets_its_own_messages() -> None:
    tab = Subscriber()
    tab.offer({"type": "pong"})
    assert seqs(tab.pending()) == ["pong"]


def test_watchers_see_every_published_event_but_deltas() -> None:
    hub = Hub(lambda _cid: 0)
    seen: list[tuple[int | None, str]] = []
    hub.watchers.append(lambda cid, event: seen.append((cid, event["type"])))
    hub.emit(1, {"type": "delta", "text": "a"})
    hub.emit(1, {"type": "entry", "entry": {"id": 1}})
    hub.broadcast({"type": "conversation", "conversation": {"id": 1}})
    assert seen == [(1, "entry"), (None, "conversation")]
