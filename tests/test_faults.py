"""Faults: a full disk gives a clear error and the relay carries on when space returns."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from tests.relay import LiveRelay


def test_full_disk_answers_503_then_recovers(relay: LiveRelay) -> None:
    engine = relay.app.state.engine
    cid = relay.create(title="disk")["id"]

    def full(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")  # no room to grow: "disk full"
        cursor.close()

    event.listen(engine, "connect", full)
    engine.dispose()  # every connection from now on is a full one
    try:
        response = relay.send(cid, "x" * 200_000)
        assert response.status_code == 503
        assert response.json() == {
            "detail": "The database cannot be used right now (database or disk is full). "
            "Nothing was stored."
        }
        assert relay.http.get("/healthz").json() == {"status": "ok"}
        assert relay.get(cid)["timeline"] == []  # reading still works; nothing half-stored
    finally:
        event.remove(engine, "connect", full)
        engine.dispose()
    assert relay.send(cid, "space again").status_code == 202
    view = relay.wait_idle(cid)
    assert [e["text"][:22] for e in view["timeline"]] == ["space again", "You said: “space again"]
