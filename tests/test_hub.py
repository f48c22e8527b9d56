import asyncio
import json
import time
from typing import Any

import pytest

from app import hub as hub_module
from app.hub import REPLAY_EVENTS, SUBSCRIBER_QUEUE, Hub, Published, Subscriber

RESYNC = {"type": "resync", "reason": "fell behind"}


def loader(stored: dict[int, int]) -> Any:
    """A load_seq that reads last seqs from a dict and records each call."""
    calls: list[int] = []

    def load(conversation_id: int) -> int:
        calls.append(conversation_id)
        return stored.get(conversation_id, 0)

    load.calls = calls  # type: ignore[attr-defined]
    return load


def drain(subscriber: Subscriber) -> list[dict[str, Any]]:
    """Everything queued for a subscriber (decoded), emptying its queue."""
    return [json.loads(text) for text in subscriber.pending()]


def missed(hub: Hub, conversation_id: int, epoch: str | None, seq: int | None) -> Any:
    """hub.missed with the kept texts decoded (None stays None)."""
    kept = hub.missed(conversation_id, epoch, seq)
    return None if kept is None else [json.loads(published.text) for published in kept]


def test_next_seq_continues_from_loader() -> None:
    hub = Hub(loader({7: 41}))
    assert [hub.next_seq(7), hub.next_seq(7), hub.next_seq(8)] == [42, 43, 1]


def test_next_seq_loads_each_conversation_once() -> None:
    load = loader({7: 41})
    hub = Hub(load)
    hub.next_seq(7)
    hub.next_seq(7)
    hub.current_seq(7)
    assert load.calls == [7]


def test_current_seq_returns_loaded_value() -> None:
    hub = Hub(loader({3: 12}))
    assert hub.current_seq(3) == 12


def test_current_seq_follows_next_seq() -> None:
    hub = Hub(loader({3: 12}))
    hub.next_seq(3)
    hub.next_seq(3)
    assert hub.current_seq(3) == 14


def test_emit_numbers_and_tags_event() -> None:
    hub = Hub(loader({5: 9}))
    event = hub.emit(5, {"type": "turn"})
    assert event == {"type": "turn", "seq": 10, "conversation_id": 5}


def test_epoch_differs_between_hubs() -> None:
    first, second = Hub(loader({})), Hub(loader({}))
    assert (len(first.epoch), first.epoch == second.epoch) == (12, False)


def test_publish_reaches_followers_only() -> None:
    hub = Hub(loader({}))
    follower, other = hub.connect(), hub.connect()
    hub.follow(follower, 1)
    hub.follow(other, 2)
    hub.emit(1, {"type": "delta", "text": "a"})
    assert (drain(follower), drain(other)) == (
        [{"type": "delta", "text": "a", "seq": 1, "conversation_id": 1}],
        [],
    )


def test_broadcast_reaches_every_connected_subscriber() -> None:
    hub = Hub(loader({}))
    following, idle = hub.connect(), hub.connect()
    hub.follow(following, 1)
    hub.broadcast({"type": "conversation", "conversation": {"id": 9}})
    expected = [{"type": "conversation", "conversation": {"id": 9}}]
    assert (drain(following), drain(idle)) == (expected, expected)


def test_disconnect_stops_delivery() -> None:
    hub = Hub(loader({}))
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    hub.disconnect(subscriber)
    hub.emit(1, {"type": "turn"})
    hub.broadcast({"type": "conversation"})
    assert (drain(subscriber), hub.subscribers(1)) == ([], 0)


def test_missed_returns_exact_events_after_seq() -> None:
    hub = Hub(loader({4: 10}))
    for n in range(5):
        hub.emit(4, {"type": "delta", "text": str(n)})
    replayed = missed(hub, 4, hub.epoch, 12)
    assert replayed == [
        {"type": "delta", "text": "2", "seq": 13, "conversation_id": 4},
        {"type": "delta", "text": "3", "seq": 14, "conversation_id": 4},
        {"type": "delta", "text": "4", "seq": 15, "conversation_id": 4},
    ]


def test_missed_from_first_kept_event_is_complete() -> None:
    hub = Hub(loader({4: 10}))
    for _ in range(3):
        hub.emit(4, {"type": "turn"})
    replayed = missed(hub, 4, hub.epoch, 10)
    assert [event["seq"] for event in replayed or []] == [11, 12, 13]


def test_missed_up_to_date_is_empty() -> None:
    hub = Hub(loader({4: 10}))
    hub.emit(4, {"type": "turn"})
    assert missed(hub, 4, hub.epoch, 11) == []


def test_missed_without_events_at_loaded_seq_is_empty() -> None:
    hub = Hub(loader({4: 10}))
    hub.prime(4)  # as the socket's route does, in a storage thread
    assert missed(hub, 4, hub.epoch, 10) == []


def test_missed_of_a_conversation_not_loaded_is_none_and_reads_nothing() -> None:
    # Released between the route's prime (a storage thread) and its replay (the loop): a
    # snapshot, read in a thread, not a load of its numbering on the loop.
    load = loader({4: 10})
    hub = Hub(load)
    hub.prime(4)
    hub.release(4)
    load.calls.clear()
    assert (missed(hub, 4, hub.epoch, 10), load.calls) == (None, [])


def test_prime_of_a_loaded_conversation_keeps_it_from_the_idle_sweep() -> None:
    # A route primes a conversation in a storage thread, then goes on with it on the loop: one
    # untouched for longer than the idle timeout must not be released in between.
    hub = Hub(loader({4: 10}))
    hub.prime(4)
    hub._touched[4] = 0.0  # used long ago
    swept_before = time.monotonic() - 1.0
    assert hub.idle(swept_before) == {4: 10}
    hub.prime(4)
    assert hub.idle(swept_before) == {}


def test_missed_older_than_kept_is_none() -> None:
    hub = Hub(loader({}))
    for _ in range(REPLAY_EVENTS + 2):
        hub.emit(1, {"type": "turn"})
    assert (missed(hub, 1, hub.epoch, 1), len(missed(hub, 1, hub.epoch, 2) or [])) == (
        None,
        REPLAY_EVENTS,
    )


def test_missed_before_loaded_seq_is_none() -> None:
    hub = Hub(loader({4: 10}))
    hub.emit(4, {"type": "turn"})
    assert missed(hub, 4, hub.epoch, 5) is None


def test_missed_wrong_epoch_is_none() -> None:
    hub = Hub(loader({}))
    hub.emit(1, {"type": "turn"})
    assert missed(hub, 1, "not-the-epoch", 0) is None


def test_missed_without_seq_is_none() -> None:
    hub = Hub(loader({}))
    hub.emit(1, {"type": "turn"})
    assert missed(hub, 1, hub.epoch, None) is None


def test_missed_future_seq_is_none() -> None:
    hub = Hub(loader({}))
    hub.emit(1, {"type": "turn"})
    assert missed(hub, 1, hub.epoch, 2) is None


def test_overflow_sends_one_resync_and_stops() -> None:
    hub = Hub(loader({}))
    slow = hub.connect()
    hub.follow(slow, 1)
    for _ in range(SUBSCRIBER_QUEUE + 10):
        hub.emit(1, {"type": "delta"})
    hub.broadcast({"type": "conversation"})
    assert (drain(slow), slow.overflowed) == ([RESYNC], True)


def test_overflow_of_one_subscriber_spares_others() -> None:
    hub = Hub(loader({}))
    slow, fast = hub.connect(), hub.connect()
    hub.follow(slow, 1)
    hub.follow(fast, 1)
    received: list[int] = []
    total = SUBSCRIBER_QUEUE + 50
    for _ in range(total):
        hub.emit(1, {"type": "delta"})
        received += [event["seq"] for event in drain(fast)]
    assert (received, drain(slow)) == (list(range(1, total + 1)), [RESYNC])


def test_overflow_at_exact_queue_size_does_not_resync() -> None:
    hub = Hub(loader({}))
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    for _ in range(SUBSCRIBER_QUEUE):
        hub.emit(1, {"type": "delta"})
    events = drain(subscriber)
    assert (len(events), events[-1]["seq"], subscriber.overflowed) == (
        SUBSCRIBER_QUEUE,
        SUBSCRIBER_QUEUE,
        False,
    )


def test_follow_after_overflow_delivers_again() -> None:
    hub = Hub(loader({}))
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    for _ in range(SUBSCRIBER_QUEUE + 1):
        hub.emit(1, {"type": "delta"})
    drain(subscriber)
    hub.follow(subscriber, 1)
    hub.emit(1, {"type": "turn"})
    assert drain(subscriber) == [
        {"type": "turn", "seq": SUBSCRIBER_QUEUE + 2, "conversation_id": 1}
    ]


def test_follow_switches_conversation() -> None:
    hub = Hub(loader({}))
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    hub.follow(subscriber, 2)
    hub.emit(1, {"type": "turn"})
    hub.emit(2, {"type": "turn"})
    assert (drain(subscriber), hub.subscribers(1), hub.subscribers(2)) == (
        [{"type": "turn", "seq": 1, "conversation_id": 2}],
        0,
        1,
    )


def test_follow_sets_conversation_id() -> None:
    hub = Hub(loader({}))
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    hub.follow(subscriber, 3)
    assert subscriber.conversation_id == 3


@pytest.mark.parametrize("count", [1, 2, 3])
def test_subscribers_counts_followers(count: int) -> None:
    hub = Hub(loader({}))
    for _ in range(count):
        hub.follow(hub.connect(), 6)
    assert hub.subscribers(6) == count


def test_publish_queues_compact_json_text() -> None:
    hub = Hub(loader({}))
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    hub.emit(1, {"type": "delta", "text": "é"})
    assert subscriber.pending() == [('{"type":"delta","text":"é","seq":1,"conversation_id":1}')]


def test_publish_encodes_once_for_every_follower(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    encode = hub_module.encode
    monkeypatch.setattr(hub_module, "encode", lambda event: calls.append(event) or encode(event))
    hub = Hub(loader({}))
    followers = [hub.connect() for _ in range(3)]
    for follower in followers:
        hub.follow(follower, 1)
    hub.emit(1, {"type": "delta", "text": "a"})
    texts = [follower.pending()[0] for follower in followers]
    assert (len(calls), texts[0] is texts[1] is texts[2]) == (1, True)


def test_broadcast_encodes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    encode = hub_module.encode
    monkeypatch.setattr(hub_module, "encode", lambda event: calls.append(event) or encode(event))
    hub = Hub(loader({}))
    tabs = [hub.connect() for _ in range(3)]
    hub.broadcast({"type": "conversation", "conversation": {"id": 9}})
    assert (len(calls), [drain(tab) for tab in tabs]) == (
        1,
        [[{"type": "conversation", "conversation": {"id": 9}}]] * 3,
    )


def test_missed_keeps_published_texts() -> None:
    hub = Hub(loader({}))
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    hub.emit(1, {"type": "turn"})
    hub.emit(1, {"type": "delta", "text": "b"})
    queued = subscriber.pending()
    assert hub.missed(1, hub.epoch, 0) == [Published(1, queued[0]), Published(2, queued[1])]


def test_offer_queues_text_as_is() -> None:
    subscriber = Subscriber()
    subscriber.offer('{"type":"pong"}')
    subscriber.offer({"type": "error", "detail": "x"})
    assert [subscriber.queue.popleft() for _ in range(2)] == [
        '{"type":"pong"}',
        '{"type":"error","detail":"x"}',
    ]


async def test_burst_wakes_sender_once_with_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    # What ends the hold here is a loop turn without a new event, never the clock: with the
    # real HOLD (0.3 ms) a loaded machine's pause between two loop turns woke it early.
    monkeypatch.setattr(hub_module, "HOLD", 60.0)
    hub = Hub(loader({}))
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    for n in range(5):  # one event per loop turn, as a streaming agent publishes
        hub.emit(1, {"type": "delta", "text": str(n)})
        woken_early = subscriber.ready.is_set()
        await asyncio.sleep(0)
    batch = await asyncio.wait_for(subscriber.take(100), 1)
    assert (woken_early, [json.loads(text)["text"] for text in batch]) == (
        False,
        ["0", "1", "2", "3", "4"],
    )


async def test_lone_event_wakes_sender_after_one_loop_turn() -> None:
    hub = Hub(loader({}))
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    hub.emit(1, {"type": "turn"})
    before = subscriber.ready.is_set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert (before, subscriber.ready.is_set()) == (False, True)


async def test_take_returns_at_most_limit() -> None:
    subscriber = Subscriber()
    for n in range(5):
        subscriber.offer({"n": n})
    first, rest = await subscriber.take(3), await subscriber.take(3)
    assert ([json.loads(t)["n"] for t in first], [json.loads(t)["n"] for t in rest]) == (
        [0, 1, 2],
        [3, 4],
    )


async def test_answer_wakes_sender_at_once() -> None:
    subscriber = Subscriber()
    subscriber.offer({"type": "pong"})
    assert subscriber.ready.is_set()
