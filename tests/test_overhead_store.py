"""The turn's storage path writes with plain statements: no read-back, no extra round trip."""

from typing import Any

import pytest
from sqlalchemy import delete, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm.exc import StaleDataError
from sqlmodel import col

from app import store
from app.db import get_session
from app.models import Conversation, Entry


class Statements:
    """The SQL statements an engine runs (their first word), while recording."""

    def __init__(self, engine: Engine) -> None:
        self.seen: list[str] = []
        self.recording = False
        event.listen(engine, "before_cursor_execute", self._saw)

    def _saw(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.recording:
            self.seen.append(statement.split()[0].upper())


def new_conversation(engine: Engine) -> Conversation:
    with get_session(engine) as session:
        return store.create_conversation(
            session=session, title="T", provider="demo", cwd="/w", permission_mode="default"
        )


def reload(engine: Engine, model: Any, row_id: int) -> Any:
    with get_session(engine) as session:
        return session.get(model, row_id)


def test_add_entry_writes_without_reading_back(engine: Engine) -> None:
    conversation = new_conversation(engine)
    statements = Statements(engine)
    with get_session(engine) as session:
        session.add(conversation)
        statements.recording = True
        entry = store.add_entry(
            session=session, conversation=conversation, seq=1, kind="user", text="hi\x00"
        )
        statements.recording = False
    assert [s for s in statements.seen if s not in ("BEGIN", "COMMIT")] == ["INSERT", "UPDATE"]
    stored = reload(engine, Entry, entry.id or 0)
    assert (stored.seq, stored.kind, stored.text, stored.state, stored.data) == (
        1,
        "user",
        "hi\ufffd",
        "done",
        {},
    )
    assert stored.created_at == entry.created_at
    found = reload(engine, Conversation, conversation.id or 0)
    assert (found.last_seq, found.message_count, found.updated_at) == (
        1,
        1,
        entry.created_at,
    )
    assert (conversation.last_seq, conversation.updated_at) == (1, entry.created_at)


def test_an_added_entry_is_saved_later_in_the_same_and_another_session(engine: Engine) -> None:
    conversation = new_conversation(engine)
    with get_session(engine) as session:
        session.add(conversation)
        entry = store.add_entry(
            session=session, conversation=conversation, seq=1, kind="agent", state="streaming"
        )
        # The same row read again in this session is the same object (one identity).
        (again,) = store.entries_in_state(
            session=session, conversation_id=conversation.id or 0, state="streaming"
        )
        assert again is entry
        store.save_entry(
            session=session, entry=entry, conversation=conversation, event_seq=2, text="a"
        )
    statements = Statements(engine)
    with get_session(engine) as session:
        statements.recording = True
        store.save_entry(
            session=session,
            entry=entry,
            conversation=conversation,
            event_seq=3,
            text="ab",
            state="done",
        )
        statements.recording = False
    assert "SELECT" not in statements.seen  # nothing read back
    stored = reload(engine, Entry, entry.id or 0)
    assert (stored.text, stored.state) == ("ab", "done")
    found = reload(engine, Conversation, conversation.id or 0)
    assert (found.last_seq, found.message_count) == (3, 1)  # done agent message: counted once


def test_save_entry_never_lowers_last_seq(engine: Engine) -> None:
    conversation = new_conversation(engine)
    with get_session(engine) as session:
        session.add(conversation)
        entry = store.add_entry(session=session, conversation=conversation, seq=9, kind="line")
        store.save_entry(
            session=session, entry=entry, conversation=conversation, event_seq=4, text="x"
        )
    assert reload(engine, Conversation, conversation.id or 0).last_seq == 9


def test_save_entry_of_a_deleted_entry_fails(engine: Engine) -> None:
    conversation = new_conversation(engine)
    with get_session(engine) as session:
        session.add(conversation)
        entry = store.add_entry(session=session, conversation=conversation, seq=1, kind="line")
    with get_session(engine) as session:  # by another writer: this copy does not know
        session.execute(delete(Entry).where(col(Entry.id) == entry.id))
        session.commit()
    with get_session(engine) as session, pytest.raises(StaleDataError):
        store.save_entry(
            session=session, entry=entry, conversation=conversation, event_seq=2, text="x"
        )


def test_update_conversation_is_one_update(engine: Engine) -> None:
    conversation = new_conversation(engine)
    statements = Statements(engine)
    with get_session(engine) as session:
        session.add(conversation)
        conversation.title = "renamed"  # a caller's own change is saved as well
        statements.recording = True
        store.update_conversation(
            session=session, conversation=conversation, context_tokens=1234, turn_active=True
        )
        statements.recording = False
    assert "SELECT" not in statements.seen
    found = reload(engine, Conversation, conversation.id or 0)
    assert (found.title, found.context_tokens, found.turn_active) == ("renamed", 1234, True)
    assert found.updated_at == conversation.updated_at
