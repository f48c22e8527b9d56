from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import BigInteger, Integer, inspect
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from app import models  # noqa: F401 - registers the tables on SQLModel.metadata
from app.db import get_session
from app.migrate import alembic_config, upgrade
from app.models import Conversation
from app.search import include_object, is_search_table
from tests import postgres


def test_upgrade_creates_tables(engine: Engine) -> None:
    names = inspect(engine).get_table_names()
    assert sorted(name for name in names if not is_search_table(name)) == [
        "alembic_version",
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
    assert (current, head) == ("0009", "0009")


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
        "ix_entry_conversation_state_seq",
        "ix_entry_state_conversation",
    ]


def test_upgrade_twice_is_a_no_op(url: str, engine: Engine) -> None:
    upgrade(url)
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() == "0009"


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
