"""SQL per request stays constant as data grows, and timeline queries use their indexes.

Statements are counted with SQLAlchemy's before_cursor_execute event on the relay's own
engine (app.state.engine). A request's statements are those run by its own task: the
runner task a POST wakes ("deliver-<id>") works on after the answer and is left out.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app import store
from app.agents.base import AgentEvent, AgentSpec, TurnDone
from app.db import get_session
from tests.postgres import SELECTED
from tests.relay import LiveRelay

# SQLite's query plans, and rows seeded into its file: PostgreSQL's plans are its own (its
# statements per request are the same code's, counted here on SQLite).
pytestmark = pytest.mark.skipif(SELECTED == "postgres", reason="SQLite's plans and file")

STAMP = "2026-11-30 12:00:00.000000"
# A step that finds rows through an index or the primary key (not a SCAN, no temp B-tree).
SEARCHES = re.compile(r"SEARCH \w+ USING (COVERING INDEX|INDEX|INTEGER PRIMARY KEY) ")
USER, AGENT = ("user", "Hi", "sent"), ("agent", "*Yo*", "done")
LIST_QUERIES = 1  # the page
OPEN_QUERIES = 4  # the conversation, its last entries, its queued messages, their count
SEND_QUERIES = 4  # the conversation (in the writer); message insert (returning), update; turn


class Stalled:
    """An agent whose turn waits until interrupted: a POST's turn never runs alongside it."""

    def __init__(self, spec: AgentSpec) -> None:
        self.stop = asyncio.Event()
        self.turning = threading.Event()  # its turn has started (the runner waits on it)

    async def start(self) -> None:
        """Nothing to spawn."""

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Wait, then end as interrupted."""
        self.turning.set()
        await self.stop.wait()
        yield TurnDone(interrupted=True)

    async def interrupt(self) -> None:
        """Let the turn end."""
        self.stop.set()

    async def context_usage(self) -> dict[str, Any] | None:
        """No report."""
        return None

    async def close(self) -> None:
        """Nothing to stop."""


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements the engine runs meanwhile, except the delivery tasks'."""
    seen: list[str] = []

    def record(*args: Any) -> None:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        if task is None or not task.get_name().startswith("deliver-"):
            seen.append(args[2])

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def db_path(relay: LiveRelay) -> Path:
    return relay.settings.resolved_data_dir / "oarlock.db"


def add_conversations(relay: LiveRelay, count: int) -> None:
    """Insert conversations with SQL, straight into the relay's database."""
    with sqlite3.connect(db_path(relay)) as db:
        db.executemany(
            "INSERT INTO conversation (title, provider, status, cwd, permission_mode,"
            " turn_active, last_seq, created_at, updated_at)"
            " VALUES (?, 'demo', 'active', '/w', 'default', 0, 0, ?, ?)",
            [(f"C{n}", STAMP, STAMP) for n in range(count)],
        )


def add_entries(relay: LiveRelay, conversation_id: int, count: int) -> None:
    """Insert a conversation's timeline with SQL (user and agent messages in turn)."""
    with sqlite3.connect(db_path(relay)) as db:
        db.executemany(
            "INSERT INTO entry (conversation_id, seq, kind, text, state, data, created_at)"
            " VALUES (?, ?, ?, ?, ?, '{}', ?)",
            [
                (conversation_id, seq, *(USER if seq % 2 else AGENT), STAMP)
                for seq in range(1, count + 1)
            ],
        )
        db.execute("UPDATE conversation SET last_seq = ? WHERE id = ?", (count, conversation_id))


def count_get(relay: LiveRelay, path: str) -> int:
    """Statements of one GET, after a first one has warmed the caches (the hub's seq)."""
    assert relay.http.get(path).status_code == 200
    with statements(relay.app.state.engine) as seen:
        assert relay.http.get(path).status_code == 200
    return len(seen)


def count_send(relay: LiveRelay, conversation_id: int, agents: list[Stalled]) -> int:
    """Statements of one POST of a message, queued behind a stalled turn.

    The turn is started first: the runner's own statements (it starts as soon as the first
    message is committed, before that POST is answered) are not counted with the POST's.
    """
    started = len(agents)
    assert relay.send(conversation_id, "First step.").status_code == 202
    deadline = time.monotonic() + 30
    while len(agents) == started or not agents[-1].turning.is_set():
        assert time.monotonic() < deadline, "the first turn never started"
        time.sleep(0.01)
    with statements(relay.app.state.engine) as seen:
        assert relay.send(conversation_id, "Next step, please.").status_code == 202
    return len(seen)


def test_list_conversations_queries_do_not_grow(relay: LiveRelay) -> None:
    add_conversations(relay, 10)
    few = count_get(relay, "/api/conversations")
    add_conversations(relay, 90)
    assert (few, count_get(relay, "/api/conversations")) == (LIST_QUERIES, LIST_QUERIES)


def test_open_conversation_queries_do_not_grow(relay: LiveRelay) -> None:
    short, long = relay.create()["id"], relay.create()["id"]
    add_entries(relay, short, 20)
    add_entries(relay, long, 200)
    counts = (
        count_get(relay, f"/api/conversations/{short}"),
        count_get(relay, f"/api/conversations/{long}"),
    )
    assert counts == (OPEN_QUERIES, OPEN_QUERIES)


def test_send_message_queries_do_not_grow(relay: LiveRelay) -> None:
    agents: list[Stalled] = []

    def stalled(_provider: str, spec: AgentSpec, _settings: Any) -> Stalled:
        agents.append(Stalled(spec))
        return agents[-1]

    relay.supervisor.agent_factory = stalled
    empty, long = relay.create(title="Empty")["id"], relay.create(title="Long")["id"]
    add_entries(relay, long, 200)
    counts = (count_send(relay, empty, agents), count_send(relay, long, agents))
    assert counts == (SEND_QUERIES, SEND_QUERIES)


# -- query plans ------------------------------------------------------------------------------


@pytest.fixture
def url(tmp_path: Path) -> str:
    """SQLite only: the plans are SQLite's (conftest's `engine` migrates it)."""
    return f"sqlite:///{tmp_path / 'plans.db'}"


def captured(engine: Engine, call: Any) -> list[tuple[str, Any]]:
    """The (statement, parameters) pairs a store call runs."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        with get_session(engine) as session:
            call(session)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen


def plans(engine: Engine, call: Any) -> list[str]:
    """EXPLAIN QUERY PLAN of every statement a store call runs, one line per step."""
    found: list[str] = []
    with engine.connect() as connection:
        cursor = connection.connection.cursor()
        for statement, parameters in captured(engine, call):
            rows = cursor.execute(f"EXPLAIN QUERY PLAN {statement}", parameters).fetchall()
            found += [row[3] for row in rows]
    return found


REQUEST_QUERIES = {
    "list_conversations": lambda s: store.list_conversations(session=s, status="active"),
    "list_conversations_before": lambda s: store.list_conversations(
        session=s, status="active", before=(datetime(2026, 1, 1, tzinfo=UTC), 1)
    ),
    "get_conversation": lambda s: store.get_conversation(session=s, conversation_id=1),
    "get_entry": lambda s: store.get_entry(session=s, entry_id=1),
    "last_entries": lambda s: store.last_entries(session=s, conversation_id=1, limit=201),
    "last_entries_before": lambda s: store.last_entries(
        session=s, conversation_id=1, limit=201, before_seq=50
    ),
    "recent_messages": lambda s: store.recent_messages(session=s, conversation_id=1),
    "count_queued": lambda s: store.count_queued(session=s, conversation_id=1),
}


@pytest.mark.parametrize("name", sorted(REQUEST_QUERIES))
def test_timeline_query_searches_an_index(engine: Engine, name: str) -> None:
    steps = plans(engine, REQUEST_QUERIES[name])
    assert steps
    assert [step for step in steps if not SEARCHES.match(step)] == []


def test_kind_filter_is_in_the_index_search(engine: Engine) -> None:
    steps = plans(engine, REQUEST_QUERIES["recent_messages"])
    assert all("conversation_id=? AND kind=?" in step for step in steps), steps


def test_state_filter_is_in_the_index_search(engine: Engine) -> None:
    steps = plans(
        engine,
        lambda s: store.entries_in_state(session=s, conversation_id=1, state="queued"),
    )
    assert all("conversation_id=? AND state=?" in step for step in steps), steps
