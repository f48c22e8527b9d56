from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import BigInteger, Connection, Integer, inspect, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel

from app import (
    models,  # noqa: F401 - registers the tables on SQLModel.metadata
    store,
)
from app.db import get_session, make_engine
from app.migrate import alembic_config, upgrade
from app.models import Conversation, utcnow
from app.search import include_object, is_search_table
from tests import postgres


def test_upgrade_creates_tables(engine: Engine) -> None:
    names = inspect(engine).get_table_names()
    assert sorted(name for name in names if not is_search_table(name)) == [
        "alembic_version",
        "attachment",
        "cluster_node",
        "conversation",
        "entry",
        "handoff",
        "lease",
        "login_session",
        "pin",
        "push_subscription",
    ]


def test_upgrade_records_head(url: str, engine: Engine) -> None:
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    assert (current, head) == ("0016", "0016")


def test_upgrade_creates_indexes(engine: Engine) -> None:
    inspector = inspect(engine)
    names = sorted(
        index["name"] or ""
        for table in ("conversation", "entry")
        for index in inspector.get_indexes(table)
        if not index.get("duplicates_constraint")  # PostgreSQL's index behind a UNIQUE
        and not is_search_table(index["name"])  # PostgreSQL's full-text index
    )
    assert names == [
        "ix_conversation_status_updated",
        "ix_entry_conversation_kind_seq",
        "ix_entry_conversation_shown_seq",
        "ix_entry_conversation_state_seq",
        "ix_entry_state_conversation",
    ]


def test_upgrade_twice_is_a_no_op(url: str, engine: Engine) -> None:
    upgrade(url)
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() == "0016"


def test_autogenerate_finds_no_difference(engine: Engine) -> None:
    with engine.connect() as connection:
        batch = engine.dialect.name == "sqlite"
        opts = {"render_as_batch": batch, "include_object": include_object}
        context = MigrationContext.configure(connection, opts=opts)
        assert compare_metadata(context, SQLModel.metadata) == []


@postgres.sqlite_only
def test_engine_journal_mode_is_wal(engine: Engine) -> None:
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


@postgres.sqlite_only
def test_engine_foreign_keys_on(engine: Engine) -> None:
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


@postgres.sqlite_only
def test_engine_synchronous_full(engine: Engine) -> None:
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 2


@postgres.sqlite_only
def test_engine_busy_timeout(engine: Engine) -> None:
    with engine.connect() as connection:
        # Short: every call runs on the event loop (test_input.py has a locked database).
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 250


def test_upgrade_creates_the_search_index(engine: Engine) -> None:
    if engine.dialect.name == "postgresql":
        indexes = {index["name"] for index in inspect(engine).get_indexes("entry")}
        assert "entry_fts_pg" in indexes
        return
    names = inspect(engine).get_table_names()
    assert "entry_fts" in names
    with engine.connect() as connection:
        triggers = connection.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name"
        ).scalars()
        assert list(triggers) == [
            "entry_fts_delete",
            "entry_fts_insert",
            "entry_fts_update",
        ]


def test_every_integer_column_is_64_bit(engine: Engine) -> None:
    # Ids up to 2**63 - 1 reach the database: PostgreSQL's INTEGER holds 32 bits, BIGINT 64.
    narrow = [
        f"{table.name}.{column.name}"
        for table in SQLModel.metadata.tables.values()
        for column in table.columns
        if isinstance(column.type.dialect_impl(postgresql.dialect()), Integer)
        and not isinstance(column.type.dialect_impl(postgresql.dialect()), BigInteger)
    ]
    assert narrow == []
    if engine.dialect.name == "postgresql":  # and the migrations made them so
        inspector = inspect(engine)
        found = {
            f"{table}.{column['name']}": str(column["type"])
            for table in inspector.get_table_names()
            for column in inspector.get_columns(table)
            if "INT" in str(column["type"])
        }
        assert set(found.values()) == {"BIGINT"}, found


def test_largest_id_is_stored_and_read(engine: Engine) -> None:
    with get_session(engine) as session:
        conversation = Conversation(
            id=2**63 - 1, title="t", provider="demo", cwd="/w", last_seq=2**63 - 1
        )
        session.add(conversation)
        session.commit()
    with get_session(engine) as session:
        stored = session.get(Conversation, 2**63 - 1)
        assert stored is not None
        assert stored.last_seq == 2**63 - 1


def _new(session: Session, title: str, text: str, kind: str = "user") -> tuple[int, int]:
    """A conversation with one entry: their ids."""
    made = store.create_conversation(
        session=session, title=title, provider="demo", cwd="/w", permission_mode="default"
    )
    entry = store.add_entry(session=session, conversation=made, seq=1, kind=kind, text=text)
    return made.id or 0, entry.id or 0


def test_a_deleted_conversations_ids_are_never_given_again(engine: Engine) -> None:
    """Deleting the newest conversation and its entries: the next ones get new ids (before, on
    SQLite, the same: its links and its tabs' places led to the new conversation)."""
    with get_session(engine) as session:
        old = _new(session, "old", "hi")
        conversation = store.get_conversation(session=session, conversation_id=old[0])
        assert conversation is not None
        store.delete_conversation(session=session, conversation=conversation)
    with get_session(engine) as session:
        new = _new(session, "new", "hi")
    assert new[0] > old[0] and new[1] > old[1]


@postgres.sqlite_only
def test_the_copy_to_never_reused_ids_keeps_rows_and_search(tmp_path: Path) -> None:
    """0010 copies SQLite's conversation and entry tables: the rows, their ids, the links between
    them and the search index (its triggers made again) come through; ids are not reused."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0009")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:  # in SQL: the models are the newest schema's
            _old(connection, "a", "kestrel")
            _old(connection, "b", "heron", kind="agent")
            connection.execute(text("UPDATE conversation SET compacted_from_id = 1 WHERE id = 2"))
        upgrade(url)
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA foreign_key_check").all() == []
            rows = connection.exec_driver_sql("SELECT id, conversation_id, text FROM entry").all()
            assert [tuple(row) for row in rows] == [(1, 1, "kestrel"), (2, 2, "heron")]
            linked = connection.exec_driver_sql("SELECT compacted_from_id FROM conversation")
            assert list(linked.scalars()) == [None, 1]
        assert search_hits(engine, "kestrel") == [1]
        with get_session(engine) as session:
            newest = store.get_conversation(session=session, conversation_id=2)
            assert newest is not None
            store.delete_conversation(session=session, conversation=newest)
            third = _new(session, "c", "osprey")
        assert third == (3, 3)  # not 2 again
        assert search_hits(engine, "osprey") == [3]  # the new table's trigger indexed it
        assert search_hits(engine, "heron") == []  # and its delete trigger took 2 out
    finally:
        engine.dispose()


def _old(
    connection: Connection, title: str, said: str, kind: str = "user", state: str = "done"
) -> None:
    """A conversation with one entry, in SQL as an older schema (0006 on) takes them."""
    at = {"at": utcnow()}
    made = connection.execute(
        text(
            "INSERT INTO conversation (title, provider, status, cwd, permission_mode,"
            " turn_active, last_seq, created_at, updated_at)"
            " VALUES (:title, 'demo', 'active', '/w', 'default', false, 1, :at, :at) RETURNING id"
        ),
        {"title": title, **at},
    ).scalar_one()
    connection.execute(
        text(
            "INSERT INTO entry (conversation_id, seq, kind, text, state, data, created_at)"
            " VALUES (:cid, 1, :kind, :said, :state, '{}', :at)"
        ),
        {"cid": made, "kind": kind, "said": said, "state": state, **at},
    )


def test_the_questions_waiting_are_counted_from_the_pending_entries(url: str) -> None:
    """0011 counts each conversation's pending entries (its questions waiting for an answer)."""
    command.upgrade(alembic_config(url), "0010")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            _old(connection, "asking", "Bash wants permission", kind="activity", state="pending")
            _old(connection, "answered", "Bash wants permission", kind="activity", state="allowed")
        upgrade(url)
        with get_session(engine) as session:
            found = store.list_conversations(session=session, status="active")
            counts = [(conversation.title, conversation.questions) for conversation in found]
        assert sorted(counts) == [("answered", 0), ("asking", 1)]
    finally:
        engine.dispose()


def search_hits(engine: Engine, word: str) -> list[int]:
    """The entry ids SQLite's search index finds for a word."""
    with engine.connect() as connection:
        found = connection.exec_driver_sql(
            "SELECT rowid FROM entry_fts WHERE entry_fts MATCH ?", (word,)
        )
        return list(found.scalars())
