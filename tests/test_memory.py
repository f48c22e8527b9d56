"""Memory that comes back: idle and archived conversations released, caches bounded (12: 10)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app import render, store
from app.hub import FRAME_CHARS, REPLAY_CHARS, RESYNC, SOCKET_BUDGET, Hub, Subscriber
from tests.relay import LiveRelay, make_settings, receive, receive_until

IDLE = {"state": "idle", "queued": 0}


def start(tmp_path: Path, idle_timeout: float) -> Iterator[LiveRelay]:
    with LiveRelay(make_settings(tmp_path / "data", agent_idle_timeout=idle_timeout)) as live:
        yield live


@pytest.fixture
def quick(tmp_path: Path) -> Iterator[LiveRelay]:
    """A relay whose conversations are idle after 2 s (the reaper looks every 0.5 s)."""
    yield from start(tmp_path, 2.0)


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[LiveRelay]:
    """A relay whose conversations are idle after 20 s (the reaper looks every 5 s)."""
    yield from start(tmp_path, 20.0)


def wait(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def held(relay: LiveRelay, cid: int) -> tuple[bool, bool]:
    """Whether the relay holds a runner, and hub state, for a conversation."""
    return cid in relay.supervisor.runners, cid in relay.supervisor.hub.held()


def talked(relay: LiveRelay, text: str = "hello") -> int:
    """A conversation with one finished turn."""
    cid = int(relay.create()["id"])
    assert relay.send(cid, text).status_code == 202
    relay.wait_for(cid, lambda view: view["turn"] == IDLE and len(view["timeline"]) >= 2)
    return cid


def stored_last_seq(relay: LiveRelay, cid: int) -> int:
    with relay.supervisor.session() as session:
        conversation = store.get_conversation(session=session, conversation_id=cid)
        assert conversation is not None
        return conversation.last_seq


def test_idle_conversation_releases_runner_and_replay(quick: LiveRelay) -> None:
    cid = talked(quick, "x" * 200_000)
    assert held(quick, cid) == (True, True)
    assert quick.supervisor.hub.replay_chars(cid) > 200_000
    wait(lambda: held(quick, cid) == (False, False), "the idle conversation was never released")
    assert quick.supervisor.hub.replay_chars(cid) == 0
    assert quick.get(cid)["turn"] == IDLE  # and it still answers


def test_released_conversation_numbering_goes_on(quick: LiveRelay) -> None:
    cid = talked(quick)
    with quick.socket() as ws:
        assert receive(ws)["type"] == "hello"
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
        snapshot = receive(ws)
    seen, epoch = snapshot["conversation"]["seq"], snapshot["conversation"]["epoch"]
    assert stored_last_seq(quick, cid) < seen  # the last events (turn) are not stored
    wait(lambda: held(quick, cid) == (False, False), "the idle conversation was never released")
    # Its agent was stopped after the tab left: one more event ("agent": "asleep"), stored too.
    assert stored_last_seq(quick, cid) == seen + 1
    seen += 1  # what a tab that stayed would have seen
    with quick.socket() as ws:
        assert receive(ws)["type"] == "hello"
        position = {"epoch": epoch, "seq": seen}
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid, **position}))
        assert receive(ws) == {"type": "subscribed", "conversation_id": cid}
        assert quick.send(cid, "again").status_code == 202
        seen_all = receive_until(ws, lambda m: m["type"] == "turn" and m["turn"] == IDLE)
    events = [event for event in seen_all if "seq" in event]  # not the sidebar's
    assert [event["seq"] for event in events] == list(range(seen + 1, seen + 1 + len(events)))
    assert next(e["entry"]["text"] for e in events if e["type"] == "entry") == "again"


def test_archived_conversation_is_released_without_waiting_for_idle(slow: LiveRelay) -> None:
    archived, active = talked(slow), talked(slow)
    response = slow.send(archived, "/compact")
    assert response.status_code == 201, response.text
    wait(lambda: held(slow, archived) == (False, False), "the archived one was never released")
    assert held(slow, active)[0] is True  # used as recently, but active: kept until idle


def test_replay_is_bounded_by_characters() -> None:
    hub = Hub(lambda _cid: 0)
    for n in range(20):
        hub.emit(1, {"type": "delta", "text": f"{n}:" + "x" * 100_000})
    assert REPLAY_CHARS - 100_100 < hub.replay_chars(1) <= REPLAY_CHARS
    assert hub.missed(1, hub.epoch, 0) is None  # the oldest are gone: a snapshot instead
    kept = hub.missed(1, hub.epoch, 15) or []
    assert [json.loads(p.text)["seq"] for p in kept] == [16, 17, 18, 19, 20]


def test_replay_keeps_the_newest_event_however_large() -> None:
    hub = Hub(lambda _cid: 0)
    hub.emit(1, {"type": "delta", "text": "x" * (REPLAY_CHARS + 10)})
    assert [json.loads(p.text)["seq"] for p in hub.missed(1, hub.epoch, 0) or []] == [1]


def test_queue_over_the_socket_budget_resyncs() -> None:
    subscriber = Subscriber()
    text = json.dumps({"type": "snapshot", "text": "x" * (1024 * 1024)})
    for _ in range(SOCKET_BUDGET // len(text)):
        subscriber.offer(text)
    assert (subscriber.overflowed, len(subscriber.queue)) == (False, SOCKET_BUDGET // len(text))
    subscriber.offer(text)
    assert (subscriber.overflowed, list(subscriber.queue)) == (True, [RESYNC])


async def test_take_stops_at_the_frame_size() -> None:
    subscriber = Subscriber()
    small = "s" * (FRAME_CHARS // 3)
    large = "l" * (FRAME_CHARS * 2)
    for text in (small, small, small, large, small):
        subscriber.offer(text)
    frames = [await subscriber.take(256) for _ in range(3)]
    assert [[text[0] for text in frame] for frame in frames] == [["s", "s", "s"], ["l"], ["s"]]
    assert subscriber.chars == 0


async def test_reader_waits_while_the_queue_is_over_half_the_budget() -> None:
    subscriber = Subscriber()
    subscriber.offer("x" * (SOCKET_BUDGET // 2 + 1))
    waiting = asyncio.ensure_future(subscriber.wait_for_room())
    await asyncio.sleep(0.01)
    blocked = not waiting.done()
    await subscriber.take(256)
    await asyncio.wait_for(waiting, 1)
    assert blocked is True


def test_release_forgets_and_numbering_reloads() -> None:
    stored = {1: 0}
    hub = Hub(lambda cid: stored[cid])
    follower = hub.connect()
    hub.emit(1, {"type": "turn"})
    hub.emit(1, {"type": "turn"})
    hub.follow(follower, 1)
    assert hub.idle(float("inf")) == {}  # a tab follows it
    hub.disconnect(follower)
    assert hub.idle(float("inf")) == {1: 2}
    assert hub.idle(0.0) == {}  # touched since
    stored[1] = 2  # what the supervisor stores before releasing
    hub.release(1)
    assert (hub.held(), hub.replay_chars(1)) == (set(), 0)
    assert hub.emit(1, {"type": "turn"})["seq"] == 3


def test_markdown_cache_is_bounded_by_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = render.TextCache(400_000)
    monkeypatch.setattr(render, "_cache", cache)
    texts = [f"# Text {n}\n\n" + "word " * 1000 for n in range(60)]
    htmls = [render.render_markdown(text) for text in texts]
    assert 380_000 < cache.held <= 400_000
    assert cache.held == sum(sys.getsizeof(t) + sys.getsizeof(h) for t, h in cache._items.items())
    assert cache.get(texts[-1]) == htmls[-1]
    assert cache.get(texts[0]) is None  # the least recently used went first
    huge = "word " * 10_000  # over 1/16 of the cache: rendered, not kept
    assert render.render_markdown(huge).startswith("<p>word")
    assert cache.get(huge) is None
