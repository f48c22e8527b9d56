"""Which entries a read of a conversation shows: its page, then the next queued messages."""

from __future__ import annotations

from app.models import Entry
from app.supervisor.timeline import _queue_without


def entry(seq: int, state: str, entry_id: int | None = None) -> Entry:
    return Entry(
        id=entry_id or seq, conversation_id=1, seq=seq, kind="user", text=f"m{seq}", state=state
    )


def test_a_message_delivered_between_the_two_reads_is_shown_once_as_delivered() -> None:
    # The queue's read found m9 queued; its turn began (a new seq) before the page's read,
    # as PostgreSQL's statements can see it: shown once, sent. (A CI run on PostgreSQL: read
    # in the other order, such a message was in neither read, and a tab's GET lost it.)
    queued = [entry(9, "queued"), entry(10, "queued")]
    page = [entry(1, "sent"), entry(11, "sent", entry_id=9)]
    assert [e.seq for e in _queue_without(queued, page)] == [10]


def test_a_queue_keeps_what_the_page_does_not_hold() -> None:
    queued = [entry(10, "queued")]
    assert [e.seq for e in _queue_without(queued, [entry(1, "sent"), entry(2, "done")])] == [10]
