"""The database engine: SQLite with WAL and foreign keys, or PostgreSQL; sessions for the store."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import stat
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from sqlalchemy import event, make_url
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, create_engine

log = logging.getLogger(__name__)


def ensure_private_dir(path: Path) -> None:
    """Create the data directory 0700, or take group and other access off an existing one."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(0o700)
        log.warning("data directory %s was mode %o; it is now 0700", path, mode)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite database URL (None: another database, in memory, a URI)."""
    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database:
        return None
    if database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def private_sqlite_files(url: str) -> None:
    """Create the SQLite file 0600 before SQLite does (0644), tighten an existing one.

    SQLite gives the -wal and -shm files the mode of the database file, so they follow.
    """
    path = sqlite_file(url)
    if path is None:
        return
    if not path.exists() and path.parent.is_dir():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for name in (path, *(Path(f"{path}{suffix}") for suffix in ("-wal", "-shm", "-journal"))):
        try:
            if name.exists() and stat.S_IMODE(name.stat().st_mode) & 0o077:
                name.chmod(0o600)
        except OSError as error:  # not ours to change: say so, keep going
            log.warning("cannot make %s private: %s", name, error)


# Seconds a statement waits for another writer's lock before "database is locked" (a 503):
# calls run in storage threads (app/storage.py), so a user's write fails fast rather than
# holding the writer thread (and every write queued behind it) for the lock's duration.
BUSY_TIMEOUT = 0.25
# How long the agent's writes wait (asynchronously, the loop keeps running) for such a lock.
WRITE_PATIENCE = 30.0


# PostgreSQL: seconds to reach the server before the call fails.
CONNECT_TIMEOUT = 5
# Connections the relay keeps open to a PostgreSQL server (the storage writer, its readers and
# a few other threads), and the most it opens at once.
POOL_SIZE = 5
MAX_OVERFLOW = 10


def with_driver(url: str) -> str:
    """Name psycopg 3 (the driver shipped) in a PostgreSQL URL; leave other URLs unchanged."""
    # SQLAlchemy 2.0 reads postgresql:// as psycopg2, and postgres:// (as hosts hand it out)
    # as nothing at all.
    if url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def unavailable(error: DBAPIError) -> str:
    """A 503's words for a database that cannot be used: the driver's first line (PostgreSQL
    adds CONTEXT lines, a row's place in a table, that say nothing to the user)."""
    reason = str(error.orig) if error.orig else str(error)
    first = reason.strip().splitlines()[0] if reason.strip() else "no reason given"
    return f"The database cannot be used right now ({first}). Nothing was stored."


def display_url(url: str) -> str:
    """Hide the URL's password, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def make_engine(url: str) -> Engine:
    """Create the engine; SQLite gets WAL, foreign keys, a busy timeout and files 0600."""
    url = with_driver(url)
    backend = make_url(url).get_backend_name()
    if backend == "postgresql":
        return postgres_engine(url)
    if backend != "sqlite":
        return create_engine(url, hide_parameters=True)
    private_sqlite_files(url)
    engine = create_engine(
        url,
        hide_parameters=True,  # errors and logs name no user's text (a refused write's message)
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT},
    )

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


def postgres_engine(url: str) -> Engine:
    """Create a pooled PostgreSQL engine: bounded connects, lock waits as short as SQLite's."""
    # Pre-ping: a server restart or a proxy's idle timeout costs a reconnect, not a request.
    engine = create_engine(
        url,
        hide_parameters=True,
        pool_pre_ping=True,
        pool_size=POOL_SIZE,
        max_overflow=MAX_OVERFLOW,
        pool_timeout=CONNECT_TIMEOUT,
        connect_args={"connect_timeout": CONNECT_TIMEOUT, "application_name": "oarlock"},
    )

    @event.listens_for(engine, "connect")
    def _settings(dbapi_connection: Any, _record: Any) -> None:
        # A row another program keeps locked answers 503 instead of freezing every socket.
        # (SET, not libpq's startup "options", which connection poolers such as PgBouncer refuse.)
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET lock_timeout = {round(BUSY_TIMEOUT * 1000)}")
        dbapi_connection.commit()

    return engine


def get_session(engine: Engine) -> Session:
    """A session that keeps loaded objects usable after commit."""
    return Session(engine, expire_on_commit=False)


def write_lock_free(engine: Engine) -> bool:
    """True when no other process holds the write lock now (asks without waiting).

    Asked before every agent write: on a connection of its own per thread, kept (not one
    checked out of the pool, its busy timeout set to 0 and back, each time).
    """
    if engine.dialect.name != "sqlite":
        return True
    probe = _probe(engine)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
    except sqlite3.OperationalError:  # "database is locked"
        return False
    return True


_probes = threading.local()  # .by_engine: this thread's probe connection per engine


def _probe(engine: Engine) -> sqlite3.Connection:
    """This thread's connection for asking about the write lock (busy timeout 0)."""
    by_engine: weakref.WeakKeyDictionary[Engine, sqlite3.Connection] | None = getattr(
        _probes, "by_engine", None
    )
    if by_engine is None:
        by_engine = _probes.by_engine = weakref.WeakKeyDictionary()
    probe = by_engine.get(engine)
    if probe is None:
        database = make_url(str(engine.url)).database or ":memory:"
        uri = database.startswith("file:")
        probe = sqlite3.connect(database, timeout=0, isolation_level=None, uri=uri)
        by_engine[engine] = probe
    return probe


async def wait_until_writable(engine: Engine, patience: float = WRITE_PATIENCE) -> None:
    """Wait, without blocking the event loop, until another process releases the write lock.

    After `patience` seconds it returns anyway: the write then fails as any database error does.
    """
    if engine.dialect.name != "sqlite":
        return
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        if await asyncio.to_thread(write_lock_free, engine):  # (the check is database I/O)
            return
        await asyncio.sleep(0.05)  # polled: another process's lock sends no signal
