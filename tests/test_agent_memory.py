"""Agents warm when needed and asleep otherwise (issue 18): the memory budget and `warm`.

The real Claude Code CLI against tests/fake_anthropic.py, as in test_claude_relay.py; the
pids are the CLIs' own, their sizes are read from /proc as the relay reads them.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from app.agent_memory import (
    AGENT_SIZE,
    MIB,
    Live,
    default_budget,
    fits,
    parse_size,
    starting_size,
    to_stop,
    tree_rss,
)
from tests import test_claude_relay as claude_relay
from tests.fake_anthropic import FakeAnthropic
from tests.relay import LiveRelay, gone_error, receive, receive_until
from tests.test_claude_relay import (
    TIMEOUT,
    StartRelay,
    agent_pid,
    create_claude,
    process_alive,
    turn,
    wait_question,
)

# The fixture of test_claude_relay.py: relays on one data dir (home and fake: conftest).
start = claude_relay.start


def wait_gone(pid: int) -> None:
    """Wait until a process has ended (or is a zombie)."""
    deadline = time.monotonic() + TIMEOUT
    while process_alive(pid):
        assert time.monotonic() < deadline, f"process {pid} is still running"
        time.sleep(0.1)


def follow(ws: Any, cid: int) -> dict[str, Any]:
    """Subscribe to a conversation; its snapshot."""
    assert receive(ws)["type"] == "hello"
    ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
    snapshot = receive(ws)
    assert snapshot["type"] == "snapshot", snapshot
    return snapshot["conversation"]


def warm(ws: Any, cid: int) -> None:
    """Tell the relay the user is about to write in a conversation."""
    ws.send(json.dumps({"type": "warm", "conversation_id": cid}))


def agent_events(seen: list[dict[str, Any]]) -> list[str]:
    return [m["agent"] for m in seen if m.get("type") == "agent"]


# pure parts ----------------------------------------------------------------------------------


def test_to_stop_picks_least_recently_used_idle_agents() -> None:
    agents = [
        Live(1, 200, last_used=1.0, stoppable=False),  # the oldest, but busy
        Live(2, 200, last_used=2.0, stoppable=True),
        Live(3, 200, last_used=3.0, stoppable=True),
    ]
    assert to_stop(agents, budget=600) == []
    assert to_stop(agents, budget=600, incoming=200) == [2]
    assert to_stop(agents, budget=250, incoming=200) == [2, 3]  # busy 1 is never chosen
    assert to_stop(agents, budget=0) == [2, 3]


def test_agents_starting_are_counted_and_only_idle_ones_make_room() -> None:
    agents = [Live(1, 200, 1.0, stoppable=False), Live(2, 300, 2.0, stoppable=True)]
    assert starting_size([200, 300], 2) == 600  # each as the largest live agent
    assert starting_size([], 2) == 2 * AGENT_SIZE  # none live: each as a CLI
    assert starting_size([], 0) == 0
    assert fits(agents, budget=500, incoming=300)  # agent 2 stopped: 200 + 300
    assert not fits(agents, budget=500, incoming=301)  # agent 1 runs: no room for more


def test_sizes_and_default_budget() -> None:
    assert parse_size("1500") == 1500 * MIB
    assert parse_size("800M") == parse_size("800mib") == 800 * MIB
    assert parse_size("1.5G") == 1536 * MIB
    for bad in ("abc", "-1", "nan", "inf", "2X"):
        with pytest.raises(ValueError, match="not a memory size"):
            parse_size(bad)
    assert default_budget(24 * 1024 * MIB) == 30 * 200 * MIB  # a quarter, whole agents
    assert default_budget(512 * MIB) == 2 * 200 * MIB  # never fewer than two
    assert tree_rss(None) == 0


# the budget with real CLIs -------------------------------------------------------------------


def test_budget_stops_least_recently_used_idle_agent_never_one_asking(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # One CLI's size on this machine, to set a budget two fit in and three do not.
    first = start()
    a = create_claude(first)
    turn(first, a, "measure")
    size = tree_rss(agent_pid(first, a))
    assert size > 50 * MIB  # a real process tree was counted
    first.stop()

    live = start(agent_memory=int(size * 2.5))
    b, c = create_claude(live), create_claude(live)
    turn(live, a, "one")
    turn(live, b, "one")
    pid_a, pid_b = agent_pid(live, a), agent_pid(live, b)

    # A asks a permission question (its turn runs), then B is used: A is the least recent.
    assert live.send(a, "[[BASH:touch asked.txt]]").status_code == 202
    question = wait_question(live, a)
    turn(live, b, "two")
    assert agent_pid(live, b) == pid_b

    # C's start needs room: B goes, the idle one, not A with its open question.
    view = turn(live, c, "one")
    assert view["agent"] == "ready"
    pid_c = agent_pid(live, c)
    wait_gone(pid_b)
    assert live.supervisor.runners[b].agent is None
    assert live.get(b)["agent"] == "asleep"
    assert process_alive(pid_a) and process_alive(pid_c)
    assert agent_pid(live, a) == pid_a
    assert live.get(a)["turn"]["state"] == "running"

    # A's question is still answerable; its turn ends normally.
    answer = live.http.post(
        f"/api/conversations/{a}/permissions/{question['id']}", json={"allow": True}
    )
    assert answer.status_code == 200, answer.text
    live.wait_idle(a, timeout=TIMEOUT)

    # B comes back (resumed, a new process); now C is the least recently used idle agent.
    view = turn(live, b, "three")
    assert "You said: three" in view["timeline"][-1]["text"]
    wait_gone(pid_c)
    assert agent_pid(live, a) == pid_a


def test_warm_ups_at_once_start_only_the_agents_the_budget_holds(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Until the fix each warm-up made room for itself alone, before any of them was live:
    # more CLIs started than the budget holds (two stayed live in the run that showed it).
    live = start(agent_memory=int(AGENT_SIZE * 1.5))  # one CLI fits, two do not
    cids = [create_claude(live) for _ in range(4)]
    with live.socket() as ws:
        assert receive(ws)["type"] == "hello"
        for cid in cids:
            warm(ws, cid)
        replies = receive_until(
            ws, lambda m: m.get("type") == "warm" and m["conversation_id"] == cids[-1]
        )
        assert [m["agent"] for m in replies if m.get("type") == "warm"] == ["starting"] * 4
    runners = live.supervisor.runners
    deadline = time.monotonic() + TIMEOUT
    while any(runners[cid].warming is not None and not runners[cid].warming.done() for cid in cids):
        assert time.monotonic() < deadline, "the warm-ups did not end"
        time.sleep(0.05)
    states = [live.get(cid)["agent"] for cid in cids]
    assert sorted(states) == ["asleep", "asleep", "asleep", "ready"], states
    warmed = cids[states.index("ready")]
    pid = agent_pid(live, warmed)
    assert fake.message_bodies() == []

    # A message to one that was not warmed still starts its agent: the idle one makes room.
    other = next(cid for cid in cids if cid != warmed)
    assert "You said: now" in turn(live, other, "now")["timeline"][-1]["text"]
    wait_gone(pid)
    assert [live.get(cid)["agent"] == "ready" for cid in cids].count(True) == 1


# warming -------------------------------------------------------------------------------------


def test_warm_starts_the_agent_and_the_next_turn_uses_it(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live)
    with live.socket() as ws:
        assert follow(ws, cid)["agent"] == "asleep"
        assert cid not in live.supervisor.runners or live.supervisor.runners[cid].agent is None
        warm(ws, cid)
        seen = receive_until(ws, lambda m: m.get("agent") == "ready", timeout=TIMEOUT)
        assert {"type": "warm", "conversation_id": cid, "agent": "starting"} in seen
        assert agent_events(seen) == ["starting", "ready"]
        pid = agent_pid(live, cid)
        assert process_alive(pid)
        assert fake.message_bodies() == []  # started, nothing sent to the model yet

        assert live.send(cid, "after warming").status_code == 202
        seen = receive_until(
            ws,
            lambda m: m.get("type") == "turn" and m["turn"] == {"state": "idle", "queued": 0},
            timeout=TIMEOUT,
        )
        assert agent_events(seen) == []  # no second start
        assert agent_pid(live, cid) == pid
        warm(ws, cid)  # live: nothing to do
        assert receive(ws) == {"type": "warm", "conversation_id": cid, "agent": "ready"}
    view = live.get(cid)
    assert view["timeline"][-1]["text"] == "You said: after warming"


def test_message_during_warm_up_waits_for_that_agent(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live)
    turn(live, cid, "before")  # a session to resume
    old = agent_pid(live, cid)
    live.stop()
    wait_gone(old)

    live = start()
    with live.socket() as ws:
        assert follow(ws, cid)["agent"] == "asleep"
        warm(ws, cid)
        assert live.send(cid, "right away").status_code == 202  # before the CLI is up
        seen = receive_until(
            ws,
            lambda m: m.get("type") == "turn" and m["turn"] == {"state": "idle", "queued": 0},
            timeout=TIMEOUT,
        )
        assert agent_events(seen) == ["starting", "ready"]  # one start, shared
    runner = live.supervisor.runners[cid]
    assert runner.agent is not None and process_alive(runner.agent.pid)
    assert live.get(cid)["timeline"][-1]["text"] == "You said: right away"


def test_unused_warm_up_goes_back_to_sleep(start: StartRelay, fake: FakeAnthropic) -> None:
    live = start(agent_idle_timeout=1.0)
    cid = create_claude(live)
    with live.socket() as ws:
        follow(ws, cid)
        warm(ws, cid)
        receive_until(ws, lambda m: m.get("agent") == "ready", timeout=TIMEOUT)
        pid = agent_pid(live, cid)
        seen = receive_until(ws, lambda m: m.get("agent") == "asleep", timeout=TIMEOUT)
        assert agent_events(seen) == ["asleep"]
    wait_gone(pid)
    assert live.get(cid)["agent"] == "asleep"
    assert fake.message_bodies() == []


def test_warm_is_refused_for_archived_and_unknown_conversations(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    assert relay.send(cid, "/compact").status_code in (200, 201, 202)
    relay.wait_for(cid, lambda v: v["status"] == "archived")
    with relay.socket() as ws:
        receive(ws)  # hello
        warm(ws, cid)
        assert receive(ws) == {
            "type": "error",
            "detail": "This conversation is archived; its agent is not started.",
        }
        ws.send('{"type": "warm", "conversation_id": 999999}')
        assert receive(ws) == gone_error(999999)
        ws.send('{"type": "warm", "conversation_id": "1"}')
        assert receive(ws)["detail"] == "warm needs an integer conversation_id."
    runner = relay.supervisor.runners.get(cid)
    assert runner is None or (runner.agent is None and runner.warming is None)
