"""More text of a stored message is handed on inline (issue #18's fan-out).

While the runner waits for the agent's next event with nothing queued, a delta that stores
nothing is published by the task reading the agent, before the agent is read further: no
queue, no second task. Events that store go through a storage job as before, and what comes
while a job runs waits behind it: tabs get everything in the order the agent said it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.agents.base import Activity, AgentEvent, AgentSpec, MessageDone, TextDelta, TurnDone
from app.supervisor.turns import Unhandled, bursts
from tests.relay import LiveRelay, receive, receive_until

TIMEOUT = 30
MESSAGE = "m1"


class Scripted:
    """An agent that streams one message and watches the relay's numbering as it goes."""

    def __init__(self, spec: AgentSpec, supervisor: Any, script: str) -> None:
        self.cid = spec.conversation_id
        self.supervisor = supervisor
        self.script = script
        self.numbered: list[int] = []  # per delta yielded: numbers taken before it was resumed

    async def start(self) -> None:
        """Nothing to spawn."""

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """The script named by the agent's factory."""
        hub = self.supervisor.hub
        yield TextDelta(MESSAGE, "a")  # the message's first text: its entry is stored
        await self._settled()
        if self.script == "deltas":
            for index in range(30):
                before = hub.current_seq(self.cid)
                yield TextDelta(MESSAGE, str(index % 10))
                self.numbered.append(hub.current_seq(self.cid) - before)
                await asyncio.sleep(0)
        else:  # "order": a storing event among deltas, more deltas while its job runs
            yield TextDelta(MESSAGE, "b")
            yield Activity("t1", "Bash", "call", summary="Running ls", input={"command": "ls"})
            await asyncio.sleep(0)  # the runner takes the activity and starts its job
            await asyncio.sleep(0)
            yield TextDelta(MESSAGE, "c")
            yield TextDelta(MESSAGE, "d")
            await asyncio.sleep(0)
            yield TextDelta(MESSAGE, "e")
        yield MessageDone(MESSAGE, "done")
        yield TurnDone(cost_usd=0.0, duration_ms=1)

    async def _settled(self) -> None:
        """Wait until the first delta's storage job is over and the runner waits again."""
        hub, runner = self.supervisor.hub, self.supervisor.runner(self.cid)
        for _ in range(10_000):  # polled: the relay gives no signal for it
            if MESSAGE in runner.streaming and hub.shown_seq(self.cid) == hub.current_seq(self.cid):
                break
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # the job's answer resumes the runner

    async def interrupt(self) -> None:
        """Nothing runs long enough to be interrupted."""

    async def context_usage(self) -> dict[str, Any] | None:
        """No report."""
        return None

    async def close(self) -> None:
        """Nothing to stop."""


def scripted_relay(relay: LiveRelay, script: str) -> list[Scripted]:
    made: list[Scripted] = []

    def factory(_provider: str, spec: AgentSpec, _settings: Any) -> Scripted:
        made.append(Scripted(spec, relay.supervisor, script))
        return made[-1]

    relay.supervisor.agent_factory = factory
    return made


def turn_events(relay: LiveRelay, cid: int) -> list[dict[str, Any]]:
    """Send a message; every event a tab got until the turn went idle."""
    with relay.socket() as ws:
        assert receive(ws)["type"] == "hello"
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
        assert receive(ws)["type"] == "snapshot"
        assert relay.send(cid, "go").status_code == 202
        return receive_until(
            ws,
            lambda m: m.get("type") == "turn" and m["turn"] == {"state": "idle", "queued": 0},
            timeout=TIMEOUT,
        )


def test_a_delta_of_a_stored_message_is_published_before_the_agent_is_read_further(
    relay: LiveRelay,
) -> None:
    made = scripted_relay(relay, "deltas")
    cid = relay.create(title="Inline")["id"]
    seen = turn_events(relay, cid)
    # Each delta was numbered (and published) by the task reading the agent, as it came:
    # before, it was queued for the runner's task, numbered only once the agent had been
    # read further. (The first few may still meet a runner busy with the first delta's job.)
    assert made[0].numbered[10:] == [1] * 20
    texts = [m["text"] for m in seen if m["type"] == "delta" and "html" not in m]
    assert "".join(texts) == "a" + "0123456789" * 3
    seqs = [m["seq"] for m in seen if "seq" in m]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert relay.wait_idle(cid, timeout=TIMEOUT)["timeline"][1]["text"] == "done"


def test_deltas_that_come_while_a_storing_event_is_stored_wait_for_it(relay: LiveRelay) -> None:
    scripted_relay(relay, "order")
    cid = relay.create(title="Order")["id"]
    seen = turn_events(relay, cid)
    seqs = [m["seq"] for m in seen if "seq" in m]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # tabs get them in seq order
    said = [
        m["text"] if m["type"] == "delta" else (m["entry"]["kind"], m["entry"]["state"])
        for m in seen
        if (m["type"] == "delta" and "html" not in m)
        or (m["type"] == "entry" and m["entry"]["kind"] in ("agent", "activity"))
    ]
    # As the agent said them: the activity's entry after "b", before "c" (which came while
    # the activity was being stored), then the message done (again with the turn's result).
    assert said[:8] == [
        ("agent", "streaming"),
        "a",
        "b",
        ("activity", "running"),
        "c",
        "d",
        "e",
        ("agent", "done"),
    ]
    # The call got no result: the turn's end says so (no spinner for ever).
    assert set(said[8:]) <= {("agent", "done"), ("activity", "interrupted")}
    timeline = relay.wait_idle(cid, timeout=TIMEOUT)["timeline"]
    assert [(e["kind"], e["text"], e["state"]) for e in timeline] == [
        ("user", "go", "sent"),
        ("agent", "done", "done"),
        ("activity", "Running ls", "interrupted"),
    ]


async def pieces(names: list[str], read: list[str]) -> AsyncIterator[AgentEvent]:
    """An agent's deltas, a loop turn apart; `read` says how far it was read."""
    for name in names:
        read.append(name)
        yield TextDelta(MESSAGE, name)
        await asyncio.sleep(0)


def test_bursts_offers_inline_only_what_comes_while_the_consumer_waits() -> None:
    handled: list[str] = []

    def inline(event: AgentEvent) -> bool:
        assert isinstance(event, TextDelta)
        if event.text.startswith("stored"):
            return False  # it needs a storage job: queued for the consumer
        handled.append(event.text)
        return True

    async def consume() -> list[list[str]]:
        got = []
        async for burst in bursts(pieces(["a", "b", "stored", "c", "d"], []), 0, inline):
            got.append([e.text for e in burst if isinstance(e, TextDelta)])
            await asyncio.sleep(0.01)  # its job: what comes meanwhile waits, in order
        return got

    got = asyncio.run(consume())
    assert handled == ["a", "b"]
    assert got == [["stored"], ["c", "d"]]


def test_bursts_raises_an_inline_failure_in_order_and_reads_no_further() -> None:
    read: list[str] = []

    def inline(event: AgentEvent) -> bool:
        assert isinstance(event, TextDelta)
        if event.text == "b":
            raise RuntimeError("no room")
        return True

    async def consume() -> list[list[AgentEvent]]:
        return [burst async for burst in bursts(pieces(["a", "b", "c"], read), 0, inline)]

    with pytest.raises(Unhandled) as raised:
        asyncio.run(consume())
    assert isinstance(raised.value.error, RuntimeError)
    assert str(raised.value.error) == "no room"
    assert read == ["a", "b"]
