"""The database engine: SQLite with WAL and foreign keys, sessions for the store."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

# Seconds a statement waits for another writer's lock before "database is locked" (a 503):
# every call runs on the event loop, so this is the longest a lock can freeze every socket.
BUSY_TIMEOUT = 0.25


def make_engine(url: str) -> Engine:
    """Create the engine; SQLite gets WAL, foreign keys and a busy timeout."""
    if not url.startswith("sqlite"):
        return create_engine(url)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: a message acknowledged to the user survives even a power cut.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={round(BUSY_TIMEOUT * 1000)}")
        cursor.close()

    return engine


def get_session(engine: Engine) -> Session:
    """A session that keeps loaded objects usable after commit."""
    return Session(engine, expire_on_commit=False)
