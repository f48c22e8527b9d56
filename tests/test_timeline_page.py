"""Which entries a read of a conversation shows: its page, then the next queued messages."""

from __future__ import annotations

from app.models import Entry
from app.supervisor.timeline import QUEUED_SHOWN, _page_without


def entry(seq: int, state: str) -> Entry:
    return Entry(id=seq, conversation_id=1, seq=seq, kind="user", text=f"m{seq}", state=state)


def test_the_page_leaves_out_what_the_queue_shows_and_what_comes_after_it() -> None:
    queued = [entry(seq, "queued") for seq in range(10, 10 + QUEUED_SHOWN)]
    page = [entry(1, "sent"), entry(2, "queued"), queued[0], entry(500, "queued")]
    # m2 the page read as queued, the queue's read did not (its turn began between the two
    # statements, as PostgreSQL can see them): it stays. m10 is the queue's; m500 is past the
    # queue's last shown one (no gap).
    assert [e.seq for e in _page_without(page, queued)] == [1, 2]


def test_with_a_short_queue_nothing_queued_is_past_it() -> None:
    queued = [entry(10, "queued")]
    page = [entry(1, "sent"), entry(20, "queued")]  # queued after the queue's read
    assert [e.seq for e in _page_without(page, queued)] == [1, 20]
