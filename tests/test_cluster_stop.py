"""Stop pressed on a node that does not run the turn (PostgreSQL + Redis, started by the test).

The Stop reaches the owner on the control channel, which delivers at most once, so it is also
recorded in Redis with the turn it is for (its prompt's id): the owner's heartbeat finds a
Stop whose notice was lost, and a Stop that comes late never stops the turn after.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from app import store
from app.agents.demo import DemoAgent
from app.cluster import ENGINE_DOWN
from app.cluster.node import CONTROL, STOPS
from tests.crash import TIMEOUT
from tests.redis import acl, control_forbidden
from tests.relay import LiveRelay
from tests.test_api import has_agent_text
from tests.test_cluster_control import ran_once, until
from tests.test_cluster_races import LEASE_SECONDS, Pause, started_nodes

DEMO_DELAY = 0.05  # seconds between the demo's pieces: a slow turn takes about 12 s
# A heartbeat every 2 s: several in a slow turn, and a lease long enough that a loaded
# machine's pauses do not make it lapse mid-turn (then the other node takes the turn over).
QUICK_LEASE = 6.0
BEAT = QUICK_LEASE / 3


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[LiveRelay, LiveRelay]]:
    """Nodes x and y whose heartbeats are 20 s apart: none during a test's turn."""
    with started_nodes(tmp_path, LEASE_SECONDS, demo_delay=DEMO_DELAY) as started:
        yield started


@pytest.fixture
def quick_nodes(tmp_path: Path) -> Iterator[tuple[LiveRelay, LiveRelay]]:
    """Nodes x and y whose heartbeats come every BEAT seconds."""
    with started_nodes(tmp_path, QUICK_LEASE, demo_delay=DEMO_DELAY) as started:
        yield started


def stopped(view: dict[str, Any]) -> bool:
    """Whether the timeline says that a turn was stopped (the interrupted line)."""
    return any(entry["data"].get("type") == "interrupted" for entry in view["timeline"])


def slow_turn(owner: LiveRelay, title: str) -> int:
    """A conversation whose slow demo turn (about 12 s) runs on the owner."""
    cid = owner.create(title=title)["id"]
    assert owner.send(cid, "slow please").status_code == 202
    owner.wait_for(cid, has_agent_text)
    assert cid in owner.supervisor.cluster.held
    return cid


def ends(view: dict[str, Any]) -> list[tuple[str, str, Any, str]]:
    """The timeline's last entries, for a failing assertion: kind, state, type, end of text."""
    return [
        (e["kind"], e["state"], e["data"].get("type"), e["text"][-20:])
        for e in view["timeline"][-3:]
    ]


def ran_to_its_end(owner: LiveRelay, cid: int) -> None:
    """The turn ends unstopped, its reply whole (the slow reply's last word is word200)."""
    view = owner.wait_idle(cid, timeout=TIMEOUT)
    assert not stopped(view)
    assert view["timeline"][-1]["text"].endswith("word200"), ends(view)


def prompt_id(relay: LiveRelay, cid: int) -> str:
    """The stored prompt id of the conversation's last delivered message."""
    with relay.supervisor.session() as session:
        entry = store.last_sent_message(session=session, conversation_id=cid)
        assert entry is not None
        return str(entry.data["prompt_uuid"])


def stop(relay: LiveRelay, cid: int) -> dict[str, Any]:
    response = relay.http.post(f"/api/conversations/{cid}/interrupt")
    assert response.status_code == 202, response.text
    return dict(response.json())


def test_a_stop_on_another_node_stops_the_owners_turn(
    nodes: tuple[LiveRelay, LiveRelay],
) -> None:
    """x takes the Stop of y's turn: the notice stops it (no heartbeat for 20 s), then the
    record is gone."""
    x, y = nodes
    cid = slow_turn(y, "Stopped from x")
    assert stop(x, cid) == {"interrupted": True}
    view = y.wait_idle(cid, timeout=TIMEOUT)
    assert stopped(view), [entry["text"] for entry in view["timeline"]]
    client = redis.Redis.from_url(y.settings.redis_url or "")
    try:
        until(lambda: not client.exists(STOPS + str(cid)), "the Stop's record stayed in Redis")
    finally:
        client.close()


def test_a_stop_whose_notice_is_lost_still_reaches_the_owner(
    quick_nodes: tuple[LiveRelay, LiveRelay],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """x takes the Stop while nobody may publish on the control channel: y's heartbeat (every
    2 s) stops the turn, long before its 12 s are over."""
    x, y = quick_nodes
    cid = slow_turn(y, "Stop lost on the way")
    with control_forbidden(y.settings.redis_url or ""):
        with caplog.at_level(logging.WARNING, logger="app.cluster.node"):
            assert stop(x, cid) == {"interrupted": True}
        assert f"cannot send interrupt for conversation {cid}" in caplog.text
    view = y.wait_idle(cid, timeout=TIMEOUT)
    assert stopped(view), [entry["text"] for entry in view["timeline"]]


def late_stop(relay: LiveRelay, cid: int, turn: str, caplog: pytest.LogCaptureFixture) -> None:
    """Send the owner the notice of a Stop for that turn, as another node would; wait until the
    owner has acted on it."""
    client = redis.Redis.from_url(relay.settings.redis_url or "")
    try:
        with caplog.at_level(logging.INFO, logger="app.cluster.node"):
            late = {"op": "interrupt", "cid": cid, "from": "x", "turn": turn}
            client.publish(CONTROL, json.dumps(late))
            acted = f"conversation {cid}: a Stop from another node"
            until(lambda: acted in caplog.text, "the owner never acted on the Stop")
    finally:
        client.close()
    assert f"{acted} found no such turn running" in caplog.text


def test_a_late_stop_never_stops_the_next_turn(
    quick_nodes: tuple[LiveRelay, LiveRelay], caplog: pytest.LogCaptureFixture
) -> None:
    """A Stop for a turn that has ended (recorded, and its notice coming late) while y runs the
    next turn: that turn runs to its end."""
    _x, y = quick_nodes
    cid = ran_once(y, "Stopped too late")
    ended = prompt_id(y, cid)
    assert y.send(cid, "slow please").status_code == 202
    y.wait_for(cid, lambda view: len(view["timeline"]) == 4 and view["timeline"][3]["text"])
    client = redis.Redis.from_url(y.settings.redis_url or "")
    try:
        client.set(STOPS + str(cid), ended)  # the record: left to y's heartbeats
    finally:
        client.close()
    late_stop(y, cid, ended, caplog)
    time.sleep(2 * BEAT + 0.5)  # two of y's heartbeats
    assert y.get(cid)["turn"]["state"] == "running"
    ran_to_its_end(y, cid)


def test_a_late_stop_between_turns_never_stops_the_next_one(
    nodes: tuple[LiveRelay, LiveRelay], caplog: pytest.LogCaptureFixture
) -> None:
    """The late Stop lands while y, its turn over, reads the queue for the next message: the
    next turn was not asked to stop, and runs to its end."""
    _x, y = nodes
    cid = ran_once(y, "Stopped between turns")
    ended = prompt_id(y, cid)
    pause = Pause(y)
    pause.armed = True
    sending = threading.Thread(target=lambda: y.send(cid, "slow please"))
    sending.start()
    try:
        assert pause.reached.wait(TIMEOUT), "y never looked at its queue"
        assert y.supervisor.runners[cid].state == "running"
        late_stop(y, cid, ended, caplog)
    finally:
        pause.release.set()
    sending.join(TIMEOUT)
    ran_to_its_end(y, cid)


def test_a_stop_that_redis_cannot_record_is_refused(
    nodes: tuple[LiveRelay, LiveRelay], caplog: pytest.LogCaptureFixture
) -> None:
    """Redis refuses x's record of the Stop (SET forbidden by an ACL for that moment): 503 with
    the reason, and the turn runs on, as the answer says."""
    x, y = nodes
    cid = slow_turn(y, "Stop not recorded")
    with acl(y.settings.redis_url or "", ["-set"], ["+set"]), caplog.at_level(logging.ERROR):
        response = x.http.post(f"/api/conversations/{cid}/interrupt")
    assert (response.status_code, response.json()) == (503, {"detail": ENGINE_DOWN})
    assert "no permissions to run the 'set' command" in caplog.text  # the record's SET
    view = y.wait_idle(cid, timeout=TIMEOUT)
    assert not stopped(view)


SLOW_TO_STOP = 10.0  # seconds the agent below takes to stop: longer than QUICK_LEASE


class SlowToStop(DemoAgent):
    """The demo agent, slow to stop as a busy CLI can be (Claude Code is allowed 15 s)."""

    async def interrupt(self) -> None:
        await asyncio.sleep(SLOW_TO_STOP)
        await super().interrupt()


def test_an_agent_slow_to_stop_never_costs_the_owner_its_lease(
    tmp_path: Path,
) -> None:
    """The heartbeat carries out a Stop (its notice lost) on an agent that takes longer than a
    lease to stop: the owner goes on renewing its lease meanwhile, and the Stop takes effect
    there (before: the heartbeat waited for the agent, the lease lapsed and x took the
    conversation over mid-turn)."""
    with started_nodes(tmp_path, QUICK_LEASE, demo_delay=0.1) as (x, y):  # slow: about 23 s
        y.supervisor.agent_factory = lambda _p, spec, settings: SlowToStop(
            spec, delay=settings.demo_delay
        )
        cid = slow_turn(y, "Slow to stop")
        with control_forbidden(y.settings.redis_url or ""):
            assert stop(x, cid) == {"interrupted": True}
        view = y.wait_idle(cid, timeout=TIMEOUT)
        assert stopped(view), ends(view)
        lines = [e["data"].get("type") for e in view["timeline"] if e["kind"] == "line"]
        assert lines == ["interrupted"]  # no line of a turn cut by a takeover
        assert cid in y.supervisor.cluster.held and cid not in x.supervisor.cluster.held
