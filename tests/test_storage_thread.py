"""Storage off the event loop: the loop answers while the database waits; order and seq hold."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event, text

from app import db, store
from app.db import get_session, make_engine
from app.hub import Hub
from app.storage import Storage
from app.supervisor import ConversationError
from tests.relay import LiveRelay, make_settings, receive
from tests.test_input import write_lock


@pytest.fixture
def patient_relay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A relay on SQLite whose writes wait as long as another process holds the lock."""
    # The relay's own 250 ms wait would end the test's write before the ordering is checked:
    # here a write waits for the whole lock, as a long one (a big /compact, a slow disk) does.
    monkeypatch.setattr(db, "BUSY_TIMEOUT", 60.0)
    with LiveRelay(make_settings(tmp_path / "data", database_url=None)) as live:
        yield live


def test_healthz_and_ping_answer_while_a_write_waits_for_a_foreign_lock(
    patient_relay: LiveRelay,
) -> None:
    relay = patient_relay
    if relay.supervisor.engine.dialect.name != "sqlite":
        pytest.skip("a foreign write lock is SQLite's")
    cid = relay.create(title="locked")["id"]
    database = relay.settings.resolved_data_dir / "oarlock.db"
    inserting = threading.Event()

    def watch(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith(("INSERT", "UPDATE")):
            inserting.set()  # the message's write has started: it now waits for the lock

    event.listen(relay.supervisor.engine, "before_cursor_execute", watch)
    answers: list[str] = []
    with relay.socket() as ws:
        assert receive(ws)["type"] == "hello"
        with write_lock(database) as holder:
            posting = threading.Thread(
                target=lambda: answers.append(str(relay.send(cid, "while locked").status_code))
            )
            posting.start()
            assert inserting.wait(30)
            ws.send(json.dumps({"type": "ping"}))
            pong = receive(ws, timeout=20)  # on a loop that waited for the lock: none
            with httpx.Client(base_url=relay.base, timeout=20) as client:
                health = client.get("/healthz").status_code
            # Both answered while the other process still held the lock and the write waited.
            assert holder.poll() is None
            assert answers == []
            assert (pong, health) == ({"type": "pong"}, 200)
        posting.join(30)
    assert answers == ["202"]  # then stored, once the lock was released
    assert [e["text"] for e in relay.wait_idle(cid)["timeline"]][:1] == ["while locked"]


def test_a_message_read_before_a_compact_and_stored_after_it_is_refused(relay: LiveRelay) -> None:
    cid = relay.create(title="old")["id"]
    with get_session(relay.supervisor.engine) as session:
        stale = store.get_conversation(session=session, conversation_id=cid)  # as a route read it
    assert stale is not None and stale.status == "active"
    assert relay.send(cid, "/compact").status_code == 201  # stored before the message's job
    supervisor = relay.supervisor
    job = supervisor.storage.write(supervisor.submit, stale, "late")
    running = asyncio.run_coroutine_threadsafe(job, supervisor.storage.loop)
    with pytest.raises(ConversationError, match="archived"):
        running.result(30)
    assert relay.get(cid)["timeline"] == []  # nothing stored in the archived conversation


def test_storage_counts_database_calls_made_on_the_loop(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    storage = Storage(engine)

    def query() -> int:
        with engine.connect() as connection:
            return int(connection.execute(text("select 1")).scalar_one())

    async def main() -> None:
        storage.start()
        assert await storage.write(query) == 1
        assert await storage.read(query) == 1
        assert storage.loop_io == 0
        query()  # on the loop: counted (tests/relay.py fails a relay that did any)
        assert storage.loop_io == 1
        await storage.stop()

    asyncio.run(main())
    engine.dispose()


def test_writer_keeps_submission_order_and_answers_after_effects(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    storage = Storage(engine)
    seen: list[str] = []

    def job(name: str) -> str:
        seen.append(f"run {name}")
        storage.soon(seen.append, f"effect {name}")  # runs on the loop, before the caller
        return name

    async def main() -> None:
        storage.start()
        futures = [storage.submit(job, str(n)) for n in range(5)]
        for future in futures:
            name = await future
            assert f"effect {name}" in seen  # the effect ran before its caller resumed
        await storage.stop()

    asyncio.run(main())
    engine.dispose()
    runs = [entry for entry in seen if entry.startswith("run")]
    assert runs == [f"run {n}" for n in range(5)]
    for n in range(5):
        assert seen.index(f"run {n}") < seen.index(f"effect {n}")


def test_hub_publishes_in_seq_order_whoever_finishes_first() -> None:
    hub = Hub(lambda _cid: 0)
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    first = hub.next_seq(1)  # taken by a write still being stored
    second = hub.emit(1, {"type": "delta", "text": "b"})  # published by the loop meanwhile
    assert subscriber.pending() == []  # held: the tab would see a gap
    hub.publish(1, {"type": "entry", "seq": first})
    assert [json.loads(t)["seq"] for t in subscriber.pending()] == [first, second["seq"]]
    assert hub.shown_seq(1) == second["seq"]


def test_hub_fills_a_number_given_back_after_a_later_one() -> None:
    hub = Hub(lambda _cid: 0)
    subscriber = hub.connect()
    hub.follow(subscriber, 1)
    failed = hub.next_seq(1)  # its write failed
    later = hub.emit(1, {"type": "delta", "text": "x"})
    hub.rewind(1, failed)  # cannot be given back: a skip event takes its place
    events = [json.loads(t) for t in subscriber.pending()]
    assert [(e["type"], e["seq"]) for e in events] == [("skip", failed), ("delta", later["seq"])]


def test_a_read_under_way_as_the_relay_stops_leaves_no_connection_open(tmp_path: Path) -> None:
    # The stop disposed of the engine while a reader thread still held a connection: handed
    # back to the discarded pool, it stayed open until the collector found it (psycopg's
    # ResourceWarning in a later, unrelated test of a CI run on PostgreSQL).
    relay = LiveRelay(make_settings(tmp_path / "data")).start()
    storage, pool = relay.supervisor.storage, relay.supervisor.engine.pool
    reading = threading.Event()

    def slow_read() -> int:
        with relay.supervisor.engine.connect() as connection:
            reading.set()
            time.sleep(0.5)
            return int(connection.execute(text("select 1")).scalar_one())

    read = asyncio.run_coroutine_threadsafe(storage.read(slow_read), storage.loop)
    assert reading.wait(10)
    relay.stop()
    with contextlib.suppress(Exception):  # (answered or not: the relay is gone)
        read.result(10)
    time.sleep(0.6)  # past the read's end in any case
    assert (pool.checkedout(), pool.checkedin()) == (0, 0), "a connection left open"
