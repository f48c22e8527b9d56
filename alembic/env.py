"""Alembic environment: the models' metadata; batch mode (table copies) for SQLite only."""

from __future__ import annotations

from alembic import context
from sqlalchemy import make_url
from sqlmodel import SQLModel

from app import models  # noqa: F401 - registers the tables on SQLModel.metadata
from app.db import make_engine, with_driver
from app.search import include_object

config = context.config
target_metadata = SQLModel.metadata


def is_sqlite(url: str) -> bool:
    """SQLite alters tables by copying them (batch mode); PostgreSQL alters them in place."""
    return make_url(url).get_backend_name() == "sqlite"


def run_migrations_offline() -> None:
    """Emit SQL without a database."""
    url = with_driver(config.get_main_option("sqlalchemy.url") or "")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=is_sqlite(url),
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Apply migrations to the database."""
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            # A table copy drops the old table: with foreign keys on, SQLite would first delete
            # its rows (and refuse, as other rows refer to them). Set before any transaction
            # (SQLite ignores it inside one); every later connection of the relay turns them on.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()  # (SQLAlchemy began a transaction: Alembic must begin its own)
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=engine.dialect.name == "sqlite",
            include_object=include_object,  # the FTS tables are not in the models
        )
        # For app.migrate.upgrade's caller: what the database was at (None: no schema yet).
        config.attributes["found"] = context.get_context().get_current_revision()
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
