"""What differs between SQLite and PostgreSQL, answered the same on both.

`make test` runs this file on SQLite and again with OARLOCK_TEST_DB=postgres against a real,
throwaway PostgreSQL server (tests/postgres.py); a few tests only mean something on one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import make_url, text
from sqlalchemy.engine import Engine
from sqlmodel import select

from app import store
from app.db import display_url, get_session, with_driver
from app.models import Conversation
from tests import postgres
from tests.relay import LiveRelay, gone_error, make_settings, receive

BIG = 2**63 - 1  # the largest id the API accepts (SQLite's largest integer)


def new_conversation(engine: Engine) -> Conversation:
    with get_session(engine) as session:
        return store.create_conversation(
            session=session, title="T", provider="demo", cwd="/w", permission_mode="default"
        )


# ---- ids beyond 32 bits --------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        f"/api/conversations/{2**31}",
        f"/api/conversations/{BIG}",
        f"/api/conversations/{BIG}/context",
        f"/api/conversations/{BIG}/backups",
    ],
)
def test_unknown_large_id_is_a_404(relay: LiveRelay, path: str) -> None:
    response = relay.http.get(path)
    assert response.status_code == 404, response.text
    assert "detail" in response.json()


def test_large_cursors_are_answered(relay: LiveRelay) -> None:
    cid = relay.create(title="cursor")["id"]
    response = relay.http.get(f"/api/conversations/{cid}", params={"before": BIG})
    assert response.status_code == 200, response.text
    response = relay.http.get("/api/conversations", params={"before": f"1-{BIG}"})
    assert response.status_code == 200, response.text
    response = relay.http.get("/api/conversations", params={"before": f"1-{BIG + 1}"})
    assert response.status_code == 422, response.text
    assert response.json() == {"detail": "The page cursor is not one this relay gave out."}


def test_subscribe_to_unknown_large_id_is_an_error_event(relay: LiveRelay) -> None:
    with relay.socket() as ws:
        assert receive(ws)["type"] == "hello"
        ws.send(json.dumps({"type": "subscribe", "conversation_id": BIG}))
        assert receive(ws) == gone_error(BIG)


# ---- NUL characters (PostgreSQL's text cannot hold one) ------------------------------------


def test_nul_in_a_message_is_a_422_and_stores_nothing(relay: LiveRelay) -> None:
    cid = relay.create(title="nul")["id"]
    response = relay.send(cid, "a\x00b")
    assert response.status_code == 422, response.text
    assert "The text cannot contain a NUL character." in response.text
    assert relay.get(cid)["timeline"] == []


def test_nul_in_a_title_is_a_422(relay: LiveRelay) -> None:
    response = relay.http.post("/api/conversations", json={"title": "a\x00b", "provider": "demo"})
    assert response.status_code == 422, response.text
    assert "NUL" in response.text
    cid = relay.create(title="kept")["id"]
    response = relay.http.patch(f"/api/conversations/{cid}", json={"title": "a\x00b"})
    assert response.status_code == 422, response.text
    assert relay.get(cid)["title"] == "kept"


def test_nul_in_a_handoff_is_a_422_and_an_agents_is_replaced(relay: LiveRelay) -> None:
    cid = relay.create(title="handoff")["id"]
    url = f"/api/conversations/{cid}/handoff"
    for body in (
        {"done": "a\x00b", "next": "n", "files": []},
        {"done": "d", "next": "a\x00b", "files": []},
        {"done": "d", "next": "n", "files": ["x\x00y"]},
    ):
        response = relay.http.put(url, json=body)
        assert response.status_code == 422, response.text
        assert "NUL" in response.text
    assert relay.http.get(url).json()["handoff"] is None  # nothing stored
    with get_session(relay.app.state.engine) as session:  # what the save_handoff tool stores
        handoff = store.save_handoff(
            session=session,
            cwd="/w",
            done="a\x00b",
            next="c\x00d",
            files=["e\x00f"],
            source="agent",
            conversation_id=cid,
        )
        assert (handoff.done, handoff.next, handoff.files) == ("a\ufffdb", "c\ufffdd", ["e\ufffdf"])


def test_agent_text_with_nul_is_stored_with_a_replacement_character(engine: Engine) -> None:
    # An agent's output is never refused (a tool may print a binary file): it is stored.
    conversation = new_conversation(engine)
    with get_session(engine) as session:
        session.add(conversation)
        entry = store.add_entry(
            session=session, conversation=conversation, seq=1, kind="agent", text="a\x00b"
        )
        store.save_entry(
            session=session, entry=entry, conversation=conversation, event_seq=2, text="c\x00d"
        )
        store.add_entry(
            session=session,
            conversation=conversation,
            seq=3,
            kind="activity",
            data={"output": "e\x00f"},  # JSON keeps it as \\u0000 on both databases
        )
    with get_session(engine) as session:
        stored = store.last_entries(session=session, conversation_id=conversation.id or 0, limit=9)
    assert [(e.text, e.data) for e in stored] == [("c\ufffdd", {}), ("", {"output": "e\x00f"})]


# ---- /compact as one transaction, with two writers -----------------------------------------


def test_compacting_a_conversation_another_writer_compacted_leaves_nothing(
    engine: Engine,
) -> None:
    conversation = new_conversation(engine)
    with get_session(engine) as first, get_session(engine) as second:
        mine = first.get(Conversation, conversation.id)
        theirs = second.get(Conversation, conversation.id)
        assert mine is not None and theirs is not None
        new = store.compact_conversation(session=first, old=mine, summary="s", title="T (c)")
        with pytest.raises(store.AlreadyArchived):
            store.compact_conversation(session=second, old=theirs, summary="s", title="T (c)")
    with get_session(engine) as session:
        rows = session.exec(select(Conversation).order_by(Conversation.id)).all()
    assert [(c.id, c.status, c.compacted_into_id, c.compacted_from_id) for c in rows] == [
        (conversation.id, "archived", new.id, None),
        (new.id, "active", None, conversation.id),
    ]


# ---- URLs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("postgresql://u:p@h:5432/d", "postgresql+psycopg://u:p@h:5432/d"),
        ("postgres://u@h/d", "postgresql+psycopg://u@h/d"),
        ("postgresql+psycopg://u@h/d", "postgresql+psycopg://u@h/d"),
        ("sqlite:////data/oarlock.db", "sqlite:////data/oarlock.db"),
    ],
)
def test_postgresql_urls_get_the_shipped_driver(given: str, used: str) -> None:
    assert with_driver(given) == used


def test_display_url_hides_the_password() -> None:
    assert display_url("postgresql+psycopg://me:s%40cret@h/d") == (
        "postgresql+psycopg://me:***@h/d"
    )


@postgres.postgres_only
def test_migrate_command_with_a_password_url(tmp_path: Path) -> None:
    # The server trusts loopback connections: any password is accepted, so one with % works.
    url = make_url(postgres.database_url(tmp_path) or "")
    secret = url.set(drivername="postgresql", password="s@cret%41word")
    env = {**os.environ, "OARLOCK_DATABASE_URL": secret.render_as_string(hide_password=False)}
    done = subprocess.run(
        [sys.executable, "-m", "app", "migrate", "--data-dir", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Created the database's tables (schema " in done.stdout
    assert "): postgresql://postgres:***@127.0.0.1:" in done.stdout
    assert "cret" not in done.stdout + done.stderr
    with psycopg.connect(url.set(drivername="postgresql").render_as_string(False)) as connection:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchone()


# ---- PostgreSQL's own behaviour ------------------------------------------------------------


@postgres.postgres_only
def test_a_row_another_program_keeps_locked_answers_503_and_sockets_flow(
    relay: LiveRelay,
) -> None:
    cid = relay.create(title="locked")["id"]
    url = make_url(relay.settings.db_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False)) as holder:
        holder.execute("SELECT id FROM conversation WHERE id = %s FOR UPDATE", (cid,))
        with relay.socket() as ws:
            assert receive(ws)["type"] == "hello"
            response = relay.send(cid, "while locked")
            assert response.status_code == 503, response.text
            assert response.json()["detail"] == (  # the driver's first line: no CONTEXT lines
                "The database cannot be used right now (canceling statement due to lock"
                " timeout). Nothing was stored."
            )
            ws.send(json.dumps({"type": "ping"}))
            assert receive(ws) == {"type": "pong"}
        holder.rollback()
    assert relay.get(cid)["timeline"] == []  # nothing was stored
    assert relay.send(cid, "after").status_code == 202
    relay.wait_idle(cid)


@postgres.postgres_only
def test_connections_the_server_closed_are_replaced(relay: LiveRelay) -> None:
    # A server restart or a proxy's idle timeout ends the pool's connections under it.
    cid = relay.create(title="reconnect")["id"]
    url = make_url(relay.settings.db_url)
    admin = url.set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        ended = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (url.database,),
        ).fetchall()
    assert ended  # the relay had connections, and they are gone
    assert relay.send(cid, "after a restart").status_code == 202
    assert relay.wait_idle(cid)["timeline"][0]["text"] == "after a restart"


@postgres.postgres_only
def test_concurrent_writers_of_one_seq_cannot_both_store(engine: Engine) -> None:
    # Two writers that picked the same seq (two relays sharing a database): the unique index
    # refuses the second one, whose message is then not acknowledged (nothing is lost silently).
    conversation = new_conversation(engine)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def write(label: str) -> None:
        with get_session(engine) as session:
            mine = session.get(Conversation, conversation.id)
            assert mine is not None
            barrier.wait()
            try:
                store.add_entry(session=session, conversation=mine, seq=1, kind="user", text=label)
            except Exception as error:  # noqa: BLE001 - collected for the assertion
                errors.append(error)

    threads = [threading.Thread(target=write, args=(label,)) for label in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # The loser waited for the winner's commit, then met the unique index: an error it reports
    # (so its message is not acknowledged), never a second row or an overwritten one.
    assert [type(error).__name__ for error in errors] == ["IntegrityError"]
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT seq FROM entry")).fetchall()
        last = connection.execute(text("SELECT last_seq FROM conversation")).scalar()
    assert (len(rows), last) == (1, 1)


@postgres.postgres_only
def test_relay_started_with_a_postgres_scheme_url(tmp_path: Path) -> None:
    # postgres://… as hosting providers hand it out (SQLAlchemy itself only knows postgresql).
    url = make_url(postgres.database_url(tmp_path) or "").set(drivername="postgresql")
    plain = url.render_as_string(hide_password=False).replace("postgresql://", "postgres://")
    settings = make_settings(tmp_path / "data", database_url=plain)
    live = LiveRelay(settings).start()
    try:
        cid = live.create(title="plain")["id"]
        assert live.send(cid, "hello").status_code == 202
        assert [e["kind"] for e in live.wait_idle(cid)["timeline"]] == ["user", "agent"]
    finally:
        live.stop()
    assert not (tmp_path / "data" / "oarlock.db").exists()  # no SQLite file beside it
