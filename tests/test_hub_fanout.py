"""The hub's fan-out path (issue 18): a stream's tabs keep up, and encoding stays exact."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.hub import Hub, Subscriber, encode

DELTAS = 10_000  # one streaming turn of the fan-out bench


def drain(subscriber: Subscriber) -> list[dict[str, Any]]:
    """Everything queued for a subscriber (decoded), emptying its queue."""
    return [json.loads(text) for text in subscriber.pending()]


def test_tabs_a_whole_streaming_turn_behind_are_not_told_to_resync() -> None:
    # A tab's queue holds the texts every tab shares, a pointer each: a reader a whole
    # 10,000-delta turn behind (a busy browser, a loaded machine) still gets every event.
    hub = Hub(lambda _cid: 0)
    tabs = [hub.connect() for _ in range(10)]
    for tab in tabs:
        hub.follow(tab, 1)
    for n in range(DELTAS):
        hub.emit(1, {"type": "delta", "entry_id": 3, "text": f"{n}.0000000"})
    for tab in tabs:
        events = drain(tab)
        assert not tab.overflowed
        assert [e["seq"] for e in events] == list(range(1, DELTAS + 1))
        assert events[-1]["text"] == f"{DELTAS - 1}.0000000"


@pytest.mark.parametrize(
    "event",
    [
        {"type": "delta", "entry_id": 1, "text": "x", "seq": 2, "conversation_id": 3},
        {"type": "delta", "text": 'é ✓ 😀 \u2028 \x00 "quoted" \\ \n\t', "html": "<p>a</p>"},
        {"a": None, "b": True, "c": False, "d": 1.5, "e": -0.0, "f": 10**30, "g": 1e300},
        {"nested": [{"x": [1, 2, {"y": []}]}, {}], "empty": "", "list": [None, "s", 2]},
        {"nan": float("nan"), "inf": float("inf")},
    ],
)
def test_encode_is_compact_json_as_json_dumps_writes_it(event: dict[str, Any]) -> None:
    assert encode(event) == json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def test_encode_refuses_what_json_cannot_write() -> None:
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        encode({"type": "x", "bad": {1, 2}})
