"""The turn's path with fewer jobs and statements keeps every guarantee (issue #18's overhead).

The last burst's job stores the agent's events, ends the turn and looks at the queue in one
session; a database failure there is rolled back and retried by the runner's loop. A message
that begins and ends in one burst is stored once, done. A message sent to an idle
conversation is read, stored and begun in one writer job, with one turn event.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event

from app import store
from app.agents.base import AgentEvent, AgentSpec, MessageDone, TextDelta, TurnDone, Usage
from app.db import get_session
from tests.relay import LiveRelay, receive, receive_until

TIMEOUT = 30


class Quick:
    """An agent whose every event of a turn arrives at once: one burst, a whole message."""

    def __init__(self, spec: AgentSpec) -> None:
        self.turns = 0

    async def start(self) -> None:
        """Nothing to spawn."""

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Usage, text in two pieces, the message, its usage again (as Claude Code's result
        repeats it), the end: no wait between them."""
        self.turns += 1
        message_id = f"m{self.turns}"
        yield Usage(100 * self.turns)
        yield TextDelta(message_id, "You said: ")
        yield TextDelta(message_id, prompt)
        yield MessageDone(message_id, f"You said: {prompt}")
        yield Usage(100 * self.turns)
        yield TurnDone(cost_usd=0.0, duration_ms=1)

    async def interrupt(self) -> None:
        """Nothing runs long enough to be interrupted."""

    async def context_usage(self) -> dict[str, Any] | None:
        """No report."""
        return None

    async def close(self) -> None:
        """Nothing to stop."""


def quick_relay(relay: LiveRelay) -> None:
    relay.supervisor.agent_factory = lambda _provider, spec, _settings: Quick(spec)


def subscribed(ws: Any, cid: int) -> None:
    """Read the hello, subscribe to a conversation, read its snapshot."""
    assert receive(ws)["type"] == "hello"
    ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
    assert receive(ws)["type"] == "snapshot"


def idle(message: dict[str, Any]) -> bool:
    return message.get("type") == "turn" and message["turn"] == {"state": "idle", "queued": 0}


def test_a_message_whole_in_one_burst_is_stored_once_done(relay: LiveRelay) -> None:
    quick_relay(relay)
    cid = relay.create(title="Quick")["id"]
    with relay.socket() as ws:
        subscribed(ws, cid)
        assert relay.send(cid, "hi").status_code == 202
        seen = receive_until(ws, idle, timeout=TIMEOUT)
    agent = [m["entry"] for m in seen if m["type"] == "entry" and m["entry"]["kind"] == "agent"]
    # Added done (then saved again with the turn's result): never a streaming row first.
    assert {(e["id"], e["state"], e["text"]) for e in agent} == {
        (agent[0]["id"], "done", "You said: hi")
    }
    assert [m for m in seen if m["type"] == "delta"] == []  # its entry came whole
    view = relay.get(cid)
    assert [(e["kind"], e["state"], e["text"]) for e in view["timeline"]] == [
        ("user", "sent", "hi"),
        ("agent", "done", "You said: hi"),
    ]
    assert view["context_tokens"] == 100
    with get_session(relay.supervisor.engine) as session:  # both messages counted once
        assert store.count_messages(session=session, conversation_id=cid) == 2


def test_a_message_to_an_idle_conversation_is_told_as_begun_once(relay: LiveRelay) -> None:
    quick_relay(relay)
    cid = relay.create(title="Once")["id"]
    with relay.socket() as ws:
        subscribed(ws, cid)
        entry = relay.send(cid, "hello").json()
        seen = receive_until(ws, idle, timeout=TIMEOUT)
    assert (entry["state"], entry["text"]) == ("queued", "hello")  # as stored when answered
    turns = [m["turn"] for m in seen if m["type"] == "turn"]
    assert turns == [{"state": "running", "queued": 0}, {"state": "idle", "queued": 0}]
    users = [m["entry"] for m in seen if m["type"] == "entry" and m["entry"]["kind"] == "user"]
    assert [(e["state"], e["id"]) for e in users] == [
        ("queued", entry["id"]),
        ("sent", entry["id"]),
    ]


def test_a_first_message_titles_the_conversation_in_its_job(relay: LiveRelay) -> None:
    quick_relay(relay)
    cid = relay.create()["id"]
    assert relay.send(cid, "  name   me  ").status_code == 202
    assert relay.wait_idle(cid, timeout=TIMEOUT)["title"] == "name me"
    assert relay.send(cid, "second").status_code == 202
    assert relay.wait_idle(cid, timeout=TIMEOUT)["title"] == "name me"  # the first only


def test_missing_conversation_is_404_before_the_text_is_judged(relay: LiveRelay) -> None:
    big = "x" * (relay.settings.max_message_bytes + 1)
    for text in ("hi", big, "   ", "/compact"):
        response = relay.send(987654, text)
        assert (response.status_code, response.json()) == (
            404,
            {"detail": "No conversation 987654."},
        ), text


class EndFails:
    """The database refuses a turn's end (turn_active back to false) the first times."""

    def __init__(self, relay: LiveRelay, times: int) -> None:
        self.engine = relay.supervisor.engine
        self.left = times
        self.lock = threading.Lock()

    def __enter__(self) -> EndFails:
        event.listen(self.engine, "before_cursor_execute", self._before)
        return self

    def __exit__(self, *_exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._before)

    def _before(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        # The end's UPDATE: turn_active with updated_at; a turn's beginning sets turn_active
        # with last_seq (or, in older code, alone).
        shape = ("UPDATE conversation SET", "turn_active", "updated_at")
        ends = all(part in statement for part in shape) and "last_seq" not in statement
        if ends:
            with self.lock:
                if self.left > 0:
                    self.left -= 1
                    raise RuntimeError("injected: the database refused the turn's end")


@pytest.mark.parametrize("times", [1, 2, 3])
def test_a_failed_end_of_turn_loses_nothing_and_the_queue_moves(
    relay: LiveRelay, caplog: pytest.LogCaptureFixture, times: int
) -> None:
    # 1: the job's own retry (in _next_turn) ends it; 2: the look fails too and the runner's
    # loop ends the turn; 3: the loop's first try fails as well and the next one ends it.
    caplog.set_level(logging.WARNING, logger="app.supervisor")
    quick_relay(relay)
    cid = relay.create(title="Fails")["id"]
    with EndFails(relay, times) as failing:
        assert relay.send(cid, "one").status_code == 202
        assert relay.send(cid, "two").status_code == 202
        view = relay.wait_idle(cid, timeout=TIMEOUT)
        assert failing.left == 0
    assert "could not close the turn" in caplog.text
    assert [(e["kind"], e["state"], e["text"]) for e in view["timeline"]] == [
        ("user", "sent", "one"),
        ("agent", "done", "You said: one"),
        ("user", "sent", "two"),
        ("agent", "done", "You said: two"),
    ]
    assert view["timeline"][1]["data"]["result"] == {"cost_usd": 0.0, "duration_ms": 1}
    with get_session(relay.supervisor.engine) as session:  # the turn ended in the database
        stored = store.get_conversation(session=session, conversation_id=cid)
        assert stored is not None and not stored.turn_active
    assert relay.send(cid, "three").status_code == 202  # the runner goes on
    assert relay.wait_idle(cid, timeout=TIMEOUT)["timeline"][-1]["text"] == "You said: three"


def test_a_repeated_usage_writes_the_row_once(relay: LiveRelay) -> None:
    quick_relay(relay)
    cid = relay.create(title="Usage")["id"]
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("UPDATE conversation") and "context_tokens" in statement:
            seen.append(statement)

    event.listen(relay.supervisor.engine, "before_cursor_execute", record)
    try:
        assert relay.send(cid, "count").status_code == 202
        view = relay.wait_idle(cid, timeout=TIMEOUT)
    finally:
        event.remove(relay.supervisor.engine, "before_cursor_execute", record)
    assert view["context_tokens"] == 100
    assert len(seen) == 1  # the second, unchanged figure changes nothing


class HeldSync:
    """The database's fsync held until released (a slow disk): what waits for it, waits."""

    def __init__(self, relay: LiveRelay) -> None:
        self.storage = relay.supervisor.storage
        self.real = self.storage._sync
        self.holding = threading.Event()  # an fsync has begun and is being held
        self.release = threading.Event()

    def __enter__(self) -> HeldSync:
        self.storage._sync = self._sync  # type: ignore[method-assign]
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release.set()
        self.storage._sync = self.real  # type: ignore[method-assign]

    def _sync(self) -> None:
        self.holding.set()
        self.release.wait(TIMEOUT)
        self.real()


class Told(Quick):
    """Quick, saying when a prompt reached it."""

    def __init__(self, spec: AgentSpec, prompted: threading.Event) -> None:
        super().__init__(spec)
        self.prompted = prompted

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Say the prompt came, then answer as Quick does."""
        self.prompted.set()
        async for each in super().turn(prompt):
            yield each


def test_the_prompt_goes_out_on_commit_while_the_answer_waits_for_the_fsync(
    relay: LiveRelay,
) -> None:
    prompted = threading.Event()
    relay.supervisor.agent_factory = lambda _provider, spec, _settings: Told(spec, prompted)
    cid = relay.create(title="Early")["id"]
    answered: list[int] = []
    with HeldSync(relay) as held:
        post = threading.Thread(target=lambda: answered.append(relay.send(cid, "hi").status_code))
        post.start()
        assert held.holding.wait(TIMEOUT)
        # Committed, in the log, safe from a crash of the relay: the agent may have it now.
        assert prompted.wait(TIMEOUT)
        assert answered == []  # a power cut could still lose it: not acknowledged yet
        held.release.set()
        post.join(TIMEOUT)
    assert answered == [202]
    assert relay.wait_idle(cid, timeout=TIMEOUT)["timeline"][-1]["text"] == "You said: hi"
