from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, exc, func, text
from sqlalchemy.engine import Engine
from sqlmodel import select

from app import store
from app.db import get_session
from app.models import Conversation, Entry

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def new_conversation(engine: Engine, title: str = "T", **fields: Any) -> Conversation:
    with get_session(engine) as session:
        conversation = store.create_conversation(
            session=session, title=title, provider="demo", cwd="/w", permission_mode="default"
        )
        for name, value in fields.items():
            setattr(conversation, name, value)
        session.add(conversation)
        session.commit()
        return conversation


def add(engine: Engine, conversation: Conversation, seq: int, kind: str, **fields: Any) -> Entry:
    with get_session(engine) as session:
        session.add(conversation)
        return store.add_entry(
            session=session, conversation=conversation, seq=seq, kind=kind, **fields
        )


def reload(engine: Engine, conversation_id: int) -> Conversation:
    with get_session(engine) as session:
        found = store.get_conversation(session=session, conversation_id=conversation_id)
    assert found is not None
    return found


def test_create_conversation_defaults(engine: Engine) -> None:
    conversation = new_conversation(engine, "Fix it")
    stored = reload(engine, conversation.id or 0)
    assert (
        stored.title,
        stored.provider,
        stored.status,
        stored.cwd,
        stored.permission_mode,
        stored.last_seq,
        stored.pending_summary,
        stored.turn_active,
    ) == ("Fix it", "demo", "active", "/w", "default", 0, None, False)


def test_get_conversation_unknown_is_none(engine: Engine) -> None:
    with get_session(engine) as session:
        assert store.get_conversation(session=session, conversation_id=99) is None


def test_add_entry_sets_last_seq(engine: Engine) -> None:
    conversation = new_conversation(engine)
    add(engine, conversation, 3, "user", text="hi", state="queued")
    add(engine, conversation, 7, "agent", text="yo")
    assert reload(engine, conversation.id or 0).last_seq == 7


def test_add_entry_lower_seq_keeps_last_seq(engine: Engine) -> None:
    conversation = new_conversation(engine)
    add(engine, conversation, 9, "user")
    add(engine, conversation, 4, "line")
    assert reload(engine, conversation.id or 0).last_seq == 9


def test_add_entry_stores_fields(engine: Engine) -> None:
    conversation = new_conversation(engine)
    entry = add(engine, conversation, 2, "line", text="x", state="running", data={"level": "info"})
    with get_session(engine) as session:
        stored = store.get_entry(session=session, entry_id=entry.id or 0)
    assert stored is not None
    assert (stored.conversation_id, stored.seq, stored.kind, stored.text, stored.state) == (
        conversation.id,
        2,
        "line",
        "x",
        "running",
    )
    assert stored.data == {"level": "info"}


def test_add_entry_touch_updates_updated_at(engine: Engine) -> None:
    conversation = new_conversation(engine, updated_at=T0)
    add(engine, conversation, 1, "user")
    assert reload(engine, conversation.id or 0).updated_at > T0


def test_add_entry_without_touch_keeps_updated_at(engine: Engine) -> None:
    conversation = new_conversation(engine, updated_at=T0)
    with get_session(engine) as session:
        session.add(conversation)
        store.add_entry(session=session, conversation=conversation, seq=1, kind="line", touch=False)
    assert reload(engine, conversation.id or 0).updated_at == T0


def test_add_entry_duplicate_seq_is_refused(engine: Engine) -> None:
    conversation = new_conversation(engine)
    add(engine, conversation, 1, "user")
    with pytest.raises(exc.IntegrityError):
        add(engine, conversation, 1, "agent")


def test_save_entry_records_event_seq(engine: Engine) -> None:
    conversation = new_conversation(engine)
    entry = add(engine, conversation, 1, "agent", state="streaming")
    with get_session(engine) as session:
        session.add(conversation)
        store.save_entry(
            session=session,
            entry=entry,
            conversation=conversation,
            event_seq=5,
            text="ok",
            state="done",
        )
    with get_session(engine) as session:
        stored = store.get_entry(session=session, entry_id=entry.id or 0)
    assert stored is not None
    assert (
        stored.seq,
        stored.text,
        stored.state,
        reload(engine, conversation.id or 0).last_seq,
    ) == (
        1,
        "ok",
        "done",
        5,
    )


def test_last_entries_returns_last_n_in_order(engine: Engine) -> None:
    conversation = new_conversation(engine)
    for seq in range(1, 61):
        add(engine, conversation, seq * 2, "user" if seq % 2 else "agent")
    with get_session(engine) as session:
        entries = store.last_entries(
            session=session, conversation_id=conversation.id or 0, limit=50
        )
    assert [entry.seq for entry in entries] == [seq * 2 for seq in range(11, 61)]


def test_last_entries_before_seq(engine: Engine) -> None:
    conversation = new_conversation(engine)
    for seq in range(1, 21):
        add(engine, conversation, seq, "line")
    with get_session(engine) as session:
        entries = store.last_entries(
            session=session, conversation_id=conversation.id or 0, limit=5, before_seq=12
        )
    assert [entry.seq for entry in entries] == [7, 8, 9, 10, 11]


def test_last_entries_ignores_other_conversations(engine: Engine) -> None:
    first, second = new_conversation(engine), new_conversation(engine)
    add(engine, first, 1, "user", text="mine")
    add(engine, second, 2, "user", text="theirs")
    with get_session(engine) as session:
        entries = store.last_entries(session=session, conversation_id=first.id or 0, limit=10)
    assert [entry.text for entry in entries] == ["mine"]


def test_recent_messages_last_24_sent_messages(engine: Engine) -> None:
    conversation = new_conversation(engine)
    seq = 0
    expected: list[int] = []
    for n in range(30):
        seq += 1
        add(engine, conversation, seq, "user" if n % 2 == 0 else "agent", state="sent")
        expected.append(seq)
        seq += 1
        add(engine, conversation, seq, "activity" if n % 2 else "line")
    add(engine, conversation, seq + 1, "user", text="waiting", state="queued")
    with get_session(engine) as session:
        found = store.recent_messages(session=session, conversation_id=conversation.id or 0)
    assert [entry.seq for entry in found] == expected[-24:]


def test_recent_messages_excludes_queued_and_other_kinds(engine: Engine) -> None:
    conversation = new_conversation(engine)
    add(engine, conversation, 1, "user", text="asked", state="sent")
    add(engine, conversation, 2, "activity", text="tool")
    add(engine, conversation, 3, "agent", text="answered", state="interrupted")
    add(engine, conversation, 4, "line", text="Interrupted by the user.")
    add(engine, conversation, 5, "user", text="later", state="queued")
    with get_session(engine) as session:
        found = store.recent_messages(session=session, conversation_id=conversation.id or 0)
    assert [(entry.kind, entry.text) for entry in found] == [
        ("user", "asked"),
        ("agent", "answered"),
    ]


def test_entries_in_state_by_seq(engine: Engine) -> None:
    conversation = new_conversation(engine)
    add(engine, conversation, 4, "user", text="b", state="queued")
    add(engine, conversation, 2, "user", text="a", state="queued")
    add(engine, conversation, 3, "user", text="sent", state="sent")
    with get_session(engine) as session:
        found = store.entries_in_state(
            session=session, conversation_id=conversation.id or 0, state="queued"
        )
    assert [entry.text for entry in found] == ["a", "b"]


def test_count_queued_counts_queued_only(engine: Engine) -> None:
    conversation = new_conversation(engine)
    add(engine, conversation, 1, "user", state="sent")
    add(engine, conversation, 2, "user", state="queued")
    add(engine, conversation, 3, "user", state="queued")
    with get_session(engine) as session:
        assert store.count_queued(session=session, conversation_id=conversation.id or 0) == 2


def test_conversations_with_work_finds_unfinished(engine: Engine) -> None:
    queued = new_conversation(engine, "queued")
    add(engine, queued, 1, "user", state="queued")
    new_conversation(engine, "cut", turn_active=True)
    streaming = new_conversation(engine, "streaming")
    add(engine, streaming, 1, "agent", state="streaming")
    quiet = new_conversation(engine, "quiet")
    add(engine, quiet, 1, "user", state="sent")
    asking = new_conversation(engine, "asking")
    add(engine, asking, 1, "activity", state="pending", data={"type": "permission"})
    archived = new_conversation(engine, "archived", status="archived")
    add(engine, archived, 1, "user", state="queued")
    done = new_conversation(engine, "done", status="archived")
    add(engine, done, 1, "user", state="sent")
    with get_session(engine) as session:
        found = store.conversations_with_work(session=session)
    assert sorted(c.title for c in found) == ["archived", "asking", "cut", "queued", "streaming"]


def test_compact_conversation_links_both(engine: Engine) -> None:
    old = new_conversation(
        engine, "Old", auto_compact_window=100_000, model="demo", model_window=200_000
    )
    with get_session(engine) as session:
        session.add(old)
        new = store.compact_conversation(
            session=session, old=old, summary="Conversation: Old", title="Old (compacted)"
        )
    old_row, new_row = reload(engine, old.id or 0), reload(engine, new.id or 0)
    assert (old_row.status, old_row.compacted_into_id) == ("archived", new.id)
    assert (
        new_row.title,
        new_row.status,
        new_row.provider,
        new_row.cwd,
        new_row.permission_mode,
        new_row.auto_compact_window,
        new_row.model,
        new_row.model_window,
        new_row.pending_summary,
        new_row.compacted_from_id,
        new_row.compacted_into_id,
        new_row.last_seq,
    ) == (
        "Old (compacted)",
        "active",
        "demo",
        "/w",
        "default",
        100_000,
        "demo",
        200_000,
        "Conversation: Old",
        old.id,
        None,
        0,
    )


def test_compact_conversation_failure_leaves_nothing(engine: Engine) -> None:
    old = new_conversation(engine, "Old")
    old_id = old.id
    with engine.begin() as connection:
        # Make the archiving UPDATE fail after the successor's INSERT was flushed.
        if engine.dialect.name == "postgresql":
            connection.execute(
                text(
                    "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "RAISE EXCEPTION 'refused' USING ERRCODE = 'integrity_constraint_violation';"
                    " END $$"
                )
            )
            connection.execute(
                text(
                    "CREATE TRIGGER refuse_archive BEFORE UPDATE OF status ON conversation "
                    "FOR EACH ROW WHEN (NEW.status = 'archived') EXECUTE FUNCTION refuse()"
                )
            )
        else:
            connection.execute(
                text(
                    "CREATE TRIGGER refuse_archive BEFORE UPDATE OF status ON conversation "
                    "WHEN NEW.status = 'archived' BEGIN SELECT RAISE(ABORT, 'refused'); END"
                )
            )
    with get_session(engine) as session:
        session.add(old)
        with pytest.raises(exc.IntegrityError):
            store.compact_conversation(session=session, old=old, summary="s", title="Old (c)")
        session.rollback()
    with get_session(engine) as session:
        rows = session.exec(select(Conversation)).all()
        assert [(c.id, c.status, c.compacted_into_id) for c in rows] == [(old_id, "active", None)]


def test_list_conversations_newest_first(engine: Engine) -> None:
    ids = [new_conversation(engine, updated_at=T0 + timedelta(minutes=n)).id for n in range(3)]
    with get_session(engine) as session:
        page = store.list_conversations(session=session, status="active")
    assert [c.id for c in page] == ids[::-1]


def test_list_conversations_pages_by_updated_at_then_id(engine: Engine) -> None:
    # Ids 1..5; 2, 3 and 4 share an updated_at, so the id breaks the tie.
    minutes = [5, 3, 3, 3, 1]
    for minute in minutes:
        new_conversation(engine, updated_at=T0 + timedelta(minutes=minute))
    pages: list[list[int]] = []
    cursor: tuple[datetime, int] | None = None
    with get_session(engine) as session:
        while True:
            page = store.list_conversations(
                session=session, status="active", limit=2, before=cursor
            )
            if not page:
                break
            pages.append([c.id or 0 for c in page])
            cursor = (page[-1].updated_at, page[-1].id or 0)
    assert pages == [[1, 4], [3, 2], [5]]


def test_list_conversations_filters_status(engine: Engine) -> None:
    new_conversation(engine, "a")
    new_conversation(engine, "b", status="archived")
    with get_session(engine) as session:
        archived = store.list_conversations(session=session, status="archived")
    assert [c.title for c in archived] == ["b"]


def test_update_conversation_sets_fields_and_updated_at(engine: Engine) -> None:
    conversation = new_conversation(engine, updated_at=T0)
    with get_session(engine) as session:
        session.add(conversation)
        store.update_conversation(session=session, conversation=conversation, title="New")
    stored = reload(engine, conversation.id or 0)
    assert (stored.title, stored.updated_at > T0) == ("New", True)


def test_delete_entry_removes_it(engine: Engine) -> None:
    conversation = new_conversation(engine)
    entry = add(engine, conversation, 1, "line")
    with get_session(engine) as session:
        stored = store.get_entry(session=session, entry_id=entry.id or 0)
        assert stored is not None
        store.delete_entry(session=session, entry=stored)
    with get_session(engine) as session:
        assert session.exec(select(func.count()).select_from(Entry)).one() == 0


# A page is the last entries that are not queued: read from the partial index of those, a long
# queue is neither in the way nor read (the query must say its condition as the index does).
PAGE_INDEX = "ix_entry_conversation_shown_seq"


@pytest.mark.parametrize("before_seq", [None, 60])
def test_last_entries_uses_index(engine: Engine, before_seq: int | None) -> None:
    conversation = new_conversation(engine)
    for seq in range(1, 101):
        add(engine, conversation, seq, "user")
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        with get_session(engine) as session:
            store.last_entries(
                session=session,
                conversation_id=conversation.id or 0,
                limit=50,
                before_seq=before_seq,
            )
    finally:
        event.remove(engine, "before_cursor_execute", record)
    [(statement, parameters)] = [s for s in statements if "FROM entry" in s[0]]
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            # 100 rows are few enough for a sequential scan to be cheapest: ask whether an
            # index can serve the query in order, as it must for a long timeline.
            connection.exec_driver_sql("ANALYZE entry")
            connection.exec_driver_sql("SET enable_seqscan = off")
            plan = [
                row[0] for row in connection.exec_driver_sql(f"EXPLAIN {statement}", parameters)
            ]
        assert any(f"Index Scan Backward using {PAGE_INDEX}" in s for s in plan), plan
        assert [step for step in plan if "Sort" in step or "Seq Scan" in step] == [], plan
        return
    with engine.connect() as connection:
        plan = [
            row[3]
            for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)
        ]
    assert any(f"USING INDEX {PAGE_INDEX}" in step for step in plan), plan
    assert [step for step in plan if step.startswith("SCAN entry") or "TEMP B-TREE" in step] == []
