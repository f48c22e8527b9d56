"""The database engine: SQLite with WAL and foreign keys, sessions for the store."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

# Seconds a statement waits for another writer's lock before "database is locked" (a 503):
# every call runs on the event loop, so this is the longest a lock can freeze every socket.
BUSY_TIMEOUT = 0.25
# How long the agent's writes wait (asynchronously, the loop keeps running) for such a lock.
WRITE_PATIENCE = 30.0


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


def write_lock_free(engine: Engine) -> bool:
    """True when no other process holds the write lock now (asks without waiting)."""
    if engine.dialect.name != "sqlite":
        return True
    with engine.connect() as connection:
        raw = connection.connection.driver_connection
        assert raw is not None
        raw.execute("PRAGMA busy_timeout=0")
        try:
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("ROLLBACK")
        except sqlite3.OperationalError:  # "database is locked"
            return False
        finally:
            raw.execute(f"PRAGMA busy_timeout={round(BUSY_TIMEOUT * 1000)}")
    return True


async def wait_until_writable(engine: Engine, patience: float = WRITE_PATIENCE) -> None:
    """Wait, without blocking the event loop, until another process releases the write lock.

    After `patience` seconds it returns anyway: the write then fails as any database error does.
    """
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        if write_lock_free(engine):
            return
        await asyncio.sleep(0.05)  # polled: another process's lock sends no signal
