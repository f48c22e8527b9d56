"""A message to an idle conversation begins its turn in the job that stores it (one job less)."""

from __future__ import annotations

import asyncio
import threading

from sqlmodel import select

from app.db import get_session
from app.models import Entry
from app.routes.deps import load_conversation
from tests.relay import LiveRelay


def test_the_message_job_begins_the_turn(relay: LiveRelay) -> None:
    supervisor = relay.supervisor
    storage = supervisor.storage
    cid = relay.create()["id"]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:  # a job right behind the message's: the writer does nothing else
        holding.set()
        release.wait(30)

    async def send() -> None:
        conversation = await storage.read(load_conversation, supervisor, cid)
        storage.submit(supervisor.submit, conversation, "hello").add_done_callback(
            lambda f: f.exception()
        )
        storage.submit(hold)

    asyncio.run_coroutine_threadsafe(send(), storage.loop).result(10)
    try:
        assert holding.wait(10)
        with get_session(supervisor.engine) as session:
            (entry,) = session.exec(select(Entry).where(Entry.conversation_id == cid)).all()
        # Delivered (marked sent, with the id its agent record will carry) by the message's
        # own job: a separate job would still be waiting behind the held writer.
        assert entry.state == "sent"
        assert entry.data["prompt_uuid"]
        assert entry.seq > 1  # queued at 1, moved to the end when sent, as before
    finally:
        release.set()
    view = relay.wait_idle(cid)
    assert [(e["kind"], e["state"]) for e in view["timeline"]] == [
        ("user", "sent"),
        ("agent", "done"),
    ]
    assert view["turn"] == {"state": "idle", "queued": 0}
