"""The database engine: SQLite with WAL and foreign keys, sessions for the store."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from sqlalchemy import event, make_url
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

log = logging.getLogger(__name__)


def ensure_private_dir(path: Path) -> None:
    """Create the data directory 0700, or take group and other access off an existing one."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(0o700)
        log.warning("data directory %s was mode %o; it is now 0700", path, mode)


def private_sqlite_files(url: str) -> None:
    """Create the SQLite file 0600 before SQLite does (0644), tighten an existing one.

    SQLite gives the -wal and -shm files the mode of the database file, so they follow.
    """
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.exists() and path.parent.is_dir():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for name in (path, *(Path(f"{path}{suffix}") for suffix in ("-wal", "-shm", "-journal"))):
        try:
            if name.exists() and stat.S_IMODE(name.stat().st_mode) & 0o077:
                name.chmod(0o600)
        except OSError as error:  # not ours to change: say so, keep going
            log.warning("cannot make %s private: %s", name, error)


def make_engine(url: str) -> Engine:
    """Create the engine; SQLite gets WAL, foreign keys and a busy timeout, files 0600."""
    if not url.startswith("sqlite"):
        return create_engine(url)
    private_sqlite_files(url)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: a message acknowledged to the user survives even a power cut.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return engine


def get_session(engine: Engine) -> Session:
    """A session that keeps loaded objects usable after commit."""
    return Session(engine, expire_on_commit=False)
