"""Streamed text's fast paths (issue 18): the same JSON, order and replay as before.

`Hub.publish_delta` (a number taken by next_seq) and `Hub.stream_delta` (numbering and
publishing in one, on the loop) write a delta's JSON text without building a dict or calling
the encoder; a tab and a reconnecting tab must get exactly what publishing the dict gave them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from app.hub import Hub, encode
from app.live_render import LiveRender

Publish = Callable[[Hub, int, int, str], int]  # (hub, conversation, entry id, text) -> seq


def numbered_then_published(hub: Hub, cid: int, entry_id: int, text: str) -> int:
    """next_seq, then publish_delta (the general way: a burst's job, any thread)."""
    seq = hub.next_seq(cid)
    hub.publish_delta(cid, seq, entry_id, text)
    return seq


def streamed(hub: Hub, cid: int, entry_id: int, text: str) -> int:
    """stream_delta (a single node's reply read at once, on the loop)."""
    seqs: list[int] = []
    hub.stream_delta(cid, entry_id, text, seqs)
    assert len(seqs) == 1  # the message's numbers: this delta's
    return seqs[0]


PATHS = pytest.mark.parametrize("publish", [numbered_then_published, streamed])

TEXTS = ["plain", 'quote " and \\ backslash', "é ü 中文 😀", "\n\t\x00\x1f", "\u2028\u2029", ""]


def delta(seq: int, entry_id: int, text: str, conversation_id: int) -> str:
    """What publishing the dict gave a tab (hub.publish, then encode)."""
    event = {"type": "delta", "entry_id": entry_id, "text": text, "seq": seq}
    return encode(event | {"conversation_id": conversation_id})


@PATHS
def test_a_delta_s_text_is_what_encoding_its_dict_gave(publish: Publish) -> None:
    hub = Hub(lambda _cid: 40)
    tab = hub.connect()
    hub.follow(tab, 7)
    expected = []
    for text in TEXTS:
        seq = publish(hub, 7, 123456789012, text)
        expected.append(delta(seq, 123456789012, text, 7))
    assert tab.pending() == expected
    assert [json.loads(text)["text"] for text in expected] == TEXTS
    missed = hub.missed(7, hub.epoch, 40)  # a tab that reconnects gets exactly these
    assert missed is not None
    assert [published.text for published in missed] == expected
    assert [published.seq for published in missed] == list(range(41, 41 + len(TEXTS)))


@PATHS
def test_a_delta_numbered_after_one_still_being_stored_waits_for_it(publish: Publish) -> None:
    stored: list[tuple[object, ...]] = []  # what a storage job hands to the loop, held back
    hub = Hub(lambda _cid: 0)
    tab = hub.connect()
    hub.follow(tab, 1)
    first = hub.next_seq(1)  # numbered in the writer thread; published once committed
    hub.soon = lambda fn, *args: stored.append((fn, *args))
    hub.publish(1, {"type": "entry", "entry": {"id": 5}, "seq": first})
    hub.soon = lambda fn, *args: fn(*args)
    assert publish(hub, 1, 5, "after") == 2
    assert tab.pending() == []  # not before the entry that precedes it
    assert hub.shown_seq(1) == 0
    fn, *args = stored.pop()
    fn(*args)
    assert tab.pending() == [
        encode({"type": "entry", "entry": {"id": 5}, "seq": 1, "conversation_id": 1}),
        delta(2, 5, "after", 1),
    ]
    assert hub.shown_seq(1) == 2


async def test_a_live_rendering_notes_text_only_while_one_is_due_or_running() -> None:
    emitted: list[tuple[str, int]] = []
    live = LiveRender(lambda: "*hi*", lambda html, units: emitted.append((html, units)))
    assert not live.noted()  # nothing due: the text must poke it
    live.busy = True
    assert not live.noted()  # running, but this text is not noted yet
    live.poke()
    assert live.noted()  # running, and it renders again once done
    live.busy = False
    assert not live.noted()  # a rendering that ended without rendering again
    live.due = time.monotonic() + 60
    live.poke()
    assert live.noted()  # a timer is set: it reads the text when it fires
    live.close()
    assert not live.noted()
