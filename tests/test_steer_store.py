"""The stored message count the /compact preview reads: kept by every write, set by 0006."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import text
from sqlmodel import Session

from app import store
from app.db import make_engine
from app.migrate import alembic_config, upgrade
from tests import postgres
from tests.relay import LiveRelay

COUNT = (
    "SELECT count(*) FROM entry WHERE conversation_id = :cid"
    " AND kind IN ('user', 'agent') AND state != 'queued'"
)


def recount(relay: LiveRelay, cid: int) -> tuple[int, int]:
    """(the stored count, a real count) of a conversation's messages."""
    with relay.supervisor.session() as session:
        stored = store.count_messages(session=session, conversation_id=cid)
        real = session.connection().execute(text(COUNT), {"cid": cid}).scalar_one()
    return stored, real


def test_the_count_follows_turns_queues_interruptions_and_compaction(relay: LiveRelay) -> None:
    cid = relay.create(title="Count")["id"]
    assert relay.send(cid, "slow please").status_code == 202
    relay.wait_for(cid, lambda v: v["turn"]["state"] == "running")
    for text_ in ("queued one", "queued two"):
        assert relay.send(cid, text_).status_code == 202
    # Stopped mid-turn: the interrupted reply is a message; the queued ones are not yet.
    relay.http.post(f"/api/conversations/{cid}/interrupt")
    relay.wait_idle(cid)
    assert recount(relay, cid)[0] == recount(relay, cid)[1] >= 4
    assert relay.send(cid, "slow again").status_code == 202
    relay.wait_for(cid, lambda v: v["turn"]["state"] == "running")
    assert relay.send(cid, "moves on").status_code == 202  # queued: moves to the successor
    new = relay.send(cid, "/compact").json()["compacted_into"]
    relay.wait_idle(new["id"])
    relay.wait_idle(cid)
    for conversation in (cid, new["id"]):
        stored, real = recount(relay, conversation)
        assert stored == real, conversation
    assert recount(relay, new["id"])[1] == 2  # "moves on" and its answer


def test_migration_0006_counts_the_messages_already_stored(tmp_path: Path) -> None:
    url = postgres.database_url(tmp_path) or f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0005")
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO conversation (id, title, provider, status, cwd, permission_mode,"
                " turn_active, last_seq, created_at, updated_at) VALUES"
                " (1, 't', 'demo', 'active', '/', 'default', false, 5, :now, :now)"
            ),
            {"now": "2026-11-30 12:00:00"},
        )
        for seq, kind, state in (
            (1, "user", "sent"),
            (2, "agent", "done"),
            (3, "activity", "done"),
            (4, "agent", "interrupted"),
            (5, "user", "queued"),
        ):
            connection.execute(
                text(
                    "INSERT INTO entry (conversation_id, seq, kind, text, state, data, created_at)"
                    " VALUES (1, :seq, :kind, 'x', :state, '{}', :now)"
                ),
                {"seq": seq, "kind": kind, "state": state, "now": "2026-11-30 12:00:00"},
            )
    upgrade(url)
    with Session(engine) as session:
        assert store.count_messages(session=session, conversation_id=1) == 3
        assert store.list_pins(session=session, conversation_id=1) == []
    engine.dispose()
