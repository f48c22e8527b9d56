"""Control messages between relay nodes on one PostgreSQL and one Redis (started by the test).

A /compact or a delete on a node that does not run the conversation tells the node that
does (its lease), which stops the agent or forgets the conversation. Two relays in this
process, as in tests/test_cluster_races.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import httpx
import redis
from sqlalchemy import text as sql

from app.cluster.events import seq_key, stream_key
from app.supervisor.runner import DELETING
from tests.crash import TIMEOUT
from tests.redis import control_forbidden
from tests.relay import TOKEN, LiveRelay, receive, receive_until
from tests.stand_in import StandIn
from tests.test_cluster_races import (  # noqa: F401 - two_nodes: the fixture
    LEASE_SECONDS,
    Pause,
    started_nodes,
    two_nodes,
)


def until(condition: Any, what: str) -> None:
    """Wait for condition() to hold (the other node acts on a message it receives)."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def ran_once(owner: LiveRelay, title: str) -> int:
    """A new conversation the owner ran one turn of (it holds its lease), now idle."""
    cid = owner.create(title=title)["id"]
    assert owner.send(cid, "hello").status_code == 202
    owner.wait_idle(cid, timeout=TIMEOUT)
    return int(cid)


def live_agent(relay: LiveRelay, cid: int) -> bool:
    """Whether the relay has a live agent for the conversation."""
    runner = relay.supervisor.runners.get(cid)
    return runner is not None and runner.agent is not None


def test_a_compact_on_another_node_stops_the_owners_agent(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """x compacts a conversation y runs: y's agent of the old conversation stops."""
    x, y = two_nodes
    cid = ran_once(y, "Compacted elsewhere")
    assert cid in y.supervisor.cluster.held and live_agent(y, cid)
    response = x.http.post(f"/api/conversations/{cid}/messages", json={"text": "/compact"})
    assert response.status_code == 201, response.text
    new = response.json()["compacted_into"]["id"]
    until(lambda: not live_agent(y, cid), "y's agent of the compacted conversation still runs")
    assert not live_agent(x, cid)
    assert x.send(new, "in the successor").status_code == 202
    x.wait_idle(new)


def test_an_archive_on_another_node_stops_the_owners_agent(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """x archives a conversation y runs: y's agent stops (before: it lived out the idle timeout)."""
    x, y = two_nodes
    cid = ran_once(y, "Archived elsewhere")
    assert cid in y.supervisor.cluster.held and live_agent(y, cid)
    response = x.http.post(f"/api/conversations/{cid}/archive")
    assert response.status_code == 200, response.text
    until(lambda: not live_agent(y, cid), "y's agent of the archived conversation still runs")


def test_the_context_modal_on_another_node_says_a_turn_runs(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """y runs a turn; the 🧠 modal opened through x says the change waits for it."""
    x, y = two_nodes
    cid = y.create(title="Modal elsewhere")["id"]
    assert y.send(cid, "slow please").status_code == 202
    y.wait_for(cid, lambda view: view["turn"]["state"] == "running")
    note = x.http.get(f"/api/conversations/{cid}/context").json()["note"]
    assert note == "Applies after the current turn."
    y.wait_idle(cid)
    note = x.http.get(f"/api/conversations/{cid}/context").json()["note"]
    assert note == "Applies on the next message (the session restarts once)."


def test_the_context_modal_on_another_node_shows_the_owners_agent_report(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """y's agent is live; the 🧠 modal opened through x shows what that agent reports (before:
    nothing of it, as for an agent that is not running)."""
    x, y = two_nodes
    cid = ran_once(y, "Modal of y's agent")
    owners = y.http.get(f"/api/conversations/{cid}/context").json()
    assert owners["agent"] is not None
    seen = x.http.get(f"/api/conversations/{cid}/context").json()
    assert seen == owners


def test_the_context_modal_on_another_node_without_the_control_channel(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """Nobody may publish on the control channel: the modal opened through x still answers,
    without the agent's part."""
    x, y = two_nodes
    cid = ran_once(y, "Modal without a channel")
    with control_forbidden(y.settings.redis_url or ""):
        response = x.http.get(f"/api/conversations/{cid}/context")
    assert response.status_code == 200, response.text
    modal = response.json()
    assert (modal["agent"], modal["used"]) == (None, y.get(cid)["context_tokens"])


def test_an_archive_on_another_node_refuses_a_turn_begun_after_its_read(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """x read the conversation idle; y begins a turn before x's archive job runs: 409."""
    x, y = two_nodes
    cid = ran_once(y, "Archived too late")
    pause = Pause(x, lambda statement, _params: "FOR UPDATE" in statement or "count(" in statement)
    pause.armed = True
    answers: list[httpx.Response] = []
    archiving = threading.Thread(
        target=lambda: answers.append(x.http.post(f"/api/conversations/{cid}/archive"))
    )
    archiving.start()
    try:
        assert pause.reached.wait(TIMEOUT), "x's archive never came to its check"
        assert y.send(cid, "slow please").status_code == 202
        y.wait_for(cid, lambda view: view["turn"]["state"] == "running")
    finally:
        pause.release.set()
    archiving.join(TIMEOUT)
    assert (answers[0].status_code, answers[0].json()) == (
        409,
        {"detail": "A turn is running in this conversation; stop it before you archive it."},
    )
    assert y.wait_idle(cid)["status"] == "active"


def test_a_delete_on_another_node_makes_the_owner_forget_the_conversation(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """x deletes a conversation y runs: y drops runner and agent; its tab gets nothing more."""
    x, y = two_nodes
    cid = y.create(title="Deleted elsewhere")["id"]
    other = y.create(title="Stays")["id"]
    assert y.send(cid, "hello").status_code == 202
    y.wait_idle(cid)
    assert cid in y.supervisor.cluster.held and live_agent(y, cid)
    with y.socket() as ws:
        receive(ws)  # hello
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
        receive_until(ws, lambda e: e["type"] == "snapshot")
        response = x.http.delete(f"/api/conversations/{cid}")
        assert response.status_code in (200, 204), response.text
        receive_until(ws, lambda e: e["type"] == "conversation_removed", timeout=TIMEOUT)
        until(lambda: cid not in y.supervisor.runners, "y still has the deleted one's runner")
        assert cid not in y.supervisor.cluster.held
        # A marker through the same paths (y's stream reader, then the broadcast channel):
        # whatever y made of the deleted conversation before it would come first.
        ws.send(json.dumps({"type": "subscribe", "conversation_id": other}))
        assert y.send(other, "marker").status_code == 202
        seen = receive_until(
            ws,
            lambda e: (
                e["type"] == "turn"
                and e.get("conversation_id") == other
                and e["turn"] == {"state": "idle", "queued": 0}
            ),
            timeout=TIMEOUT,
        )
    assert [e for e in seen if e.get("conversation_id") == cid] == []
    client = redis.Redis.from_url(y.settings.redis_url or "")
    try:  # nothing of it is made again in Redis (its stream and counter went with it)
        assert client.exists(stream_key(cid), seq_key(cid)) == 0
    finally:
        client.close()


class SlowStart(StandIn):
    """An agent whose start waits for the test; it records its close."""

    go = threading.Event()
    closed: ClassVar[list[StandIn]] = []

    async def start(self) -> None:
        """Wait for go."""
        await asyncio.to_thread(SlowStart.go.wait, TIMEOUT)

    async def close(self) -> None:
        """Note it."""
        SlowStart.closed.append(self)


def starting(relay: LiveRelay, cid: int) -> bool:
    """Whether the relay is starting the conversation's agent."""
    runner = relay.supervisor.runners.get(cid)
    return runner is not None and runner.starting


def test_a_delete_on_another_node_while_the_owner_warms_up_stops_that_agent(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """y's warm-up is starting the agent when x deletes the conversation: y closes the agent
    once started (before: y forgot the runner, and the agent came after, owned by nobody)."""
    x, y = two_nodes
    y.supervisor.agent_factory = lambda _p, spec, _s: SlowStart(spec)
    SlowStart.go.clear()
    SlowStart.closed.clear()
    cid = y.create(title="Deleted while warming")["id"]
    try:
        with y.socket() as ws:
            receive(ws)  # hello
            ws.send(json.dumps({"type": "warm", "conversation_id": cid}))
            until(lambda: starting(y, cid), "y's warm-up never started the agent")
            runner = y.supervisor.runners[cid]
            assert cid in y.supervisor.cluster.held
            assert x.http.delete(f"/api/conversations/{cid}").status_code == 204
            until(lambda: cid not in y.supervisor.runners, "y still has the deleted one's runner")
    finally:
        SlowStart.go.set()
    until(lambda: len(SlowStart.closed) == 1, "the warmed-up agent was never closed")
    assert runner.agent is None


def test_a_lease_lost_while_the_warm_up_starts_the_agent_stops_that_agent(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """y's warm-up is starting the agent when y's renewal finds the lease lost: the renewal
    ends at once (the next one is due a third of a lease later), and the agent is closed once
    started."""
    _x, y = two_nodes
    y.supervisor.agent_factory = lambda _p, spec, _s: SlowStart(spec)
    SlowStart.go.clear()
    SlowStart.closed.clear()
    cid = y.create(title="Handed on while warming")["id"]
    node = y.supervisor.cluster
    try:
        with y.socket() as ws:
            receive(ws)  # hello
            ws.send(json.dumps({"type": "warm", "conversation_id": cid}))
            until(lambda: starting(y, cid), "y's warm-up never started the agent")
        with y.supervisor.engine.begin() as connection:  # another node's now
            connection.execute(
                sql("UPDATE lease SET node = 'z' WHERE conversation_id = :c"), {"c": cid}
            )
        renewal = asyncio.run_coroutine_threadsafe(node._renew_now(), y.supervisor.storage.loop)
        renewal.result(TIMEOUT)  # (before: it waited for the agent's start)
        assert cid not in node.held
    finally:
        SlowStart.go.set()
    until(lambda: len(SlowStart.closed) == 1, "the warmed-up agent was never closed")
    assert y.supervisor.runners[cid].agent is None


def delete_held_at_its_lock(
    x: LiveRelay, cid: int, meanwhile: Callable[[], httpx.Response], status: int
) -> httpx.Response:
    """x's DELETE, held just before its deletion locks the row while `meanwhile` runs (and
    answers `status`); x's answer."""
    pause = Pause(x, lambda statement, _params: "FOR UPDATE" in statement)
    pause.armed = True
    with ThreadPoolExecutor(1) as pool:
        deleting = pool.submit(x.http.delete, f"/api/conversations/{cid}")
        assert pause.reached.wait(TIMEOUT), "x's deletion never locked the conversation"
        assert meanwhile().status_code == status
        pause.release.set()
        return deleting.result(TIMEOUT)


def test_a_message_another_node_stores_during_a_delete_is_not_deleted(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """x deletes a conversation y runs; y stores a message after x's first check: x's deletion
    looks again, locked, and refuses (before: the acknowledged message went with the rows)."""
    x, y = two_nodes
    cid = ran_once(y, "Deleted while y takes a message")
    deleted = delete_held_at_its_lock(x, cid, lambda: y.send(cid, "sent on y meanwhile"), 202)
    assert deleted.status_code == 409, deleted.text
    view = y.wait_idle(cid, timeout=TIMEOUT)
    assert [e["text"] for e in view["timeline"] if e["kind"] == "user"][-1] == "sent on y meanwhile"
    assert view["timeline"][-1]["kind"] == "agent"  # and answered


def test_two_nodes_deleting_one_conversation_at_once(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """x's delete is held just before its deletion while y deletes the same conversation: x
    answers 409, not a 500."""
    x, y = two_nodes
    cid = ran_once(y, "Deleted twice")
    deleted = delete_held_at_its_lock(
        x, cid, lambda: y.http.delete(f"/api/conversations/{cid}"), 204
    )
    assert (deleted.status_code, deleted.json()) == (409, {"detail": DELETING})


def test_a_turn_is_notified_once_whichever_node_took_its_messages(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """y runs the turns, some of whose messages come through x: one "Turn finished" a turn."""
    x, y = two_nodes
    cid = y.create(title="Notified once")["id"]
    with x.socket() as ws:
        receive(ws)  # hello
        assert y.send(cid, "slow please").status_code == 202
        y.wait_for(cid, lambda view: view["turn"]["state"] == "running")
        assert x.send(cid, "queued through x").status_code == 202  # x sees it running
        y.wait_idle(cid)
        assert x.send(cid, "through x while idle").status_code == 202
        y.wait_idle(cid)
        seen = []
        while True:  # until nothing more comes
            try:
                seen.append(receive(ws, timeout=3))
            except TimeoutError:
                break
    notified = [e for e in seen if e["type"] == "notify"]
    # Three turns ran, each ended once (before: x told of a fourth when its idle message came).
    assert [(e["title"], e["body"]) for e in notified] == [("Notified once", "Turn finished")] * 3


def test_failed_tokens_are_counted_over_every_node(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """Ten wrong tokens spread over x and y: the eleventh, on either, gets 429."""
    x, y = two_nodes
    answers = []
    for n in range(11):
        with httpx.Client(base_url=(x, y)[n % 2].base, timeout=30) as client:
            wrong = {"Authorization": f"Bearer no{n}"}
            answers.append(client.get("/api/conversations", headers=wrong))
    assert [r.status_code for r in answers] == [401] * 10 + [429]
    assert answers[-1].json() == {"detail": "Too many failed attempts; wait a minute."}
    right = {"Authorization": f"Bearer {TOKEN}"}  # still gets in
    with httpx.Client(base_url=y.base, timeout=30) as client:
        assert client.get("/api/conversations", headers=right).status_code == 200


def test_backups_on_shared_storage_are_seen_through_every_node(tmp_path: Path) -> None:
    """OARLOCK_BACKUPS_DIR shared: the backup y wrote is listed and read through x."""
    shared = tmp_path / "shared-backups"
    with started_nodes(tmp_path, LEASE_SECONDS, backups_dir=shared) as (x, y):
        cid = y.create(title="Backed up")["id"]
        for n in range(1, 5):  # the demo reaches 57k on turn 4: the tokens_50k backup
            assert y.send(cid, f"turn {n}").status_code == 202
            y.wait_idle(cid)

        def listed() -> list[dict[str, Any]]:
            response = x.http.get(f"/api/conversations/{cid}/backups")
            assert response.status_code == 200, response.text
            return list(response.json()["backups"])

        until(lambda: len(listed()) == 1, "x never listed the backup y wrote")
        (backup,) = listed()
        assert backup["trigger"] == "tokens_50k"
        response = x.http.get(f"/api/conversations/{cid}/backups/{backup['name']}")
        assert response.status_code == 200, response.text
        assert "turn 1" in response.text
        assert y.http.get(f"/api/conversations/{cid}/backups").json()["backups"] == [backup]
