"""Which entries a read of a conversation shows: its page, then the next queued messages."""

from __future__ import annotations

from app.models import Entry
from app.supervisor.timeline import _page_without


def entry(seq: int, state: str, entry_id: int | None = None) -> Entry:
    return Entry(
        id=entry_id or seq, conversation_id=1, seq=seq, kind="user", text=f"m{seq}", state=state
    )


def test_a_message_queued_again_between_the_two_reads_is_shown_once() -> None:
    # The page read m2 as sent; recovery queued it again (a new seq) before the queue's read,
    # as PostgreSQL's statements can see it: shown once, queued.
    page = [entry(1, "sent"), entry(2, "sent")]
    queued = [entry(9, "queued", entry_id=2)]
    assert [e.seq for e in _page_without(page, queued)] == [1]


def test_a_page_keeps_what_the_queue_does_not_hold() -> None:
    page = [entry(1, "sent"), entry(2, "done")]
    assert [e.seq for e in _page_without(page, [entry(10, "queued")])] == [1, 2]
