"""Several relay nodes: PostgreSQL + Redis started by the test, three `oarlock serve` processes.

Events of a conversation reach every node in order, a tab that reconnects to another node gets
exactly what it missed, one node runs each conversation, and a kill -9 of that node hands the
conversation to another: every acknowledged message stored once, answered or marked as cut.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from websockets.sync.client import ClientConnection, connect

from app.cluster import ENGINE_DOWN, same_redis
from app.cluster.node import MOVED_LINE
from app.db import make_engine
from app.questions import EXPIRED_TAKEOVER
from app.supervisor import SHUTDOWN_LINE
from tests.cluster import LEASE_SECONDS, Nodes, cluster
from tests.crash import ROOT, TIMEOUT, RelayProcess, entry, of_kind
from tests.fake_anthropic import FakeAnthropic
from tests.relay import TOKEN, receive, receive_until
from tests.test_api import first as first_of
from tests.test_api import has_pending_question, is_permission
from tests.test_cli_entry import refused


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    """A cluster of three nodes."""
    with cluster(tmp_path) as running:
        running.start(3)
        yield running


def cookie(node: RelayProcess) -> str:
    """A logged-in browser session on a node (a login by URL)."""
    base = str(node.client.base_url)
    with httpx.Client(base_url=base, timeout=30) as client:
        response = client.get(f"/?token={TOKEN}")
    assert response.status_code == 303, response.text
    return response.headers["set-cookie"].split(";")[0]


def open_socket(node: RelayProcess) -> ClientConnection:
    """A WebSocket to a node, logged in, from the node's own origin."""
    base = str(node.client.base_url).rstrip("/")
    headers = {"Cookie": cookie(node), "Origin": base}
    url = base.replace("http://", "ws://") + "/ws"
    return connect(url, additional_headers=headers, open_timeout=10)


def follow(ws: ClientConnection, cid: int, **resume: Any) -> dict[str, Any]:
    """Subscribe (with epoch and seq to resume); the first answer."""
    hello = receive(ws)
    assert hello["type"] == "hello"
    ws.send(json.dumps({"type": "subscribe", "conversation_id": cid, **resume}))
    return receive(ws)


def answered(view: dict[str, Any], text: str) -> bool:
    """Whether the demo's finished answer to text is in the timeline."""
    return any(
        e["state"] == "done" and f"You said: “{text}" in e["text"] for e in of_kind(view, "agent")
    )


def test_a_cluster_node_refuses_sqlite(tmp_path: Path) -> None:
    """OARLOCK_REDIS_URL without a PostgreSQL database: a clear error, nothing served."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OARLOCK_TOKEN": TOKEN,
        "OARLOCK_REDIS_URL": "redis://127.0.0.1:1/0",
    }
    env.pop("OARLOCK_DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--data-dir", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode != 0
    assert "OARLOCK_REDIS_URL (several relay nodes) needs a PostgreSQL database" in result.stderr
    assert not (tmp_path / "data" / "oarlock.db").exists()  # nothing was created


def test_events_reach_every_node_in_order_and_a_resume_elsewhere_gets_what_it_missed(
    nodes: Nodes,
) -> None:
    """A tab on node 2 follows a message posted to node 3; node 1 resumes from the middle."""
    first, second, third = nodes.nodes
    cid = third.create(provider="demo", title="Across nodes")
    with open_socket(second) as ws:
        answer = follow(ws, cid, epoch=None, seq=None)
        assert answer["type"] == "snapshot"
        epoch = answer["conversation"]["epoch"]
        start = answer["conversation"]["seq"]
        third.send(cid, "hello from node three")
        seen = receive_until(
            ws,
            lambda e: e["type"] == "turn" and e["turn"] == {"state": "idle", "queued": 0},
            timeout=TIMEOUT,
        )
    events = [e for e in seen if "seq" in e]  # not the conversation list's events
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(start + 1, start + 1 + len(events)))  # one order, no hole
    texts = [e["entry"]["text"] for e in events if e["type"] == "entry"]
    assert "hello from node three" in texts
    assert any(e["type"] == "delta" for e in events)
    view = first.wait_idle(cid)
    assert answered(view, "hello from node three")
    assert view["epoch"] == epoch  # one epoch for the whole cluster

    middle = events[len(events) // 2 - 1]["seq"]
    with open_socket(first) as ws:
        replayed = follow(ws, cid, epoch=epoch, seq=middle)
        got = [replayed]
        while got[-1].get("seq", 0) < events[-1]["seq"]:
            got.append(receive(ws))
        got = [e for e in got if "seq" in e]
    assert [e["seq"] for e in got] == [e["seq"] for e in events if e["seq"] > middle]
    assert [e["type"] for e in got] == [e["type"] for e in events if e["seq"] > middle]


def test_each_node_counts_the_list_events_it_passes_to_its_tabs(nodes: Nodes) -> None:
    """A list and a hello of one node compare (Hub.feed); another node's counts are its own."""
    first, second, third = nodes.nodes
    with open_socket(second) as ws:
        hello = receive(ws)
        cid = third.create(provider="demo", title="Counted")  # broadcast by another node
        receive_until(
            ws,
            lambda e: e["type"] == "conversation" and e["conversation"]["id"] == cid,
            timeout=TIMEOUT,
        )
        listed = second.client.get("/api/conversations").json()
    elsewhere = first.client.get("/api/conversations").json()["feed"]
    assert [c["id"] for c in listed["conversations"]] == [cid]
    assert listed["feed"] == {"id": hello["feed"]["id"], "count": hello["feed"]["count"] + 1}
    assert elsewhere["id"] != listed["feed"]["id"]  # a page whose list came from there rereads


def test_kill_9_of_the_owner_mid_turn_hands_the_conversation_to_another_node(
    nodes: Nodes,
) -> None:
    """Owner killed while streaming: the turn is marked cut, the queued message answered."""
    first, second, third = nodes.nodes
    cid = third.create(provider="demo", title="Takeover")
    with open_socket(second) as ws:
        follow(ws, cid)
        slow = third.send(cid, "slow story please")
        receive_until(ws, lambda e: e["type"] == "delta", timeout=TIMEOUT)
        queued = first.send(cid, "after the crash")  # stored on node 1, owner is node 3
        assert queued["state"] == "queued"
        nodes.kill(third)
        view = first.wait_for(
            cid, lambda v: answered(v, "after the crash") and v["turn"]["queued"] == 0
        )
    users = of_kind(view, "user")
    assert [u["text"] for u in users].count("slow story please") == 1  # stored once
    assert [u["text"] for u in users].count("after the crash") == 1
    cut = next(u for u in users if u["id"] == slow["id"])
    assert cut["data"].get("cut") in ("received", "unknown", "missed")  # marked as cut
    assert not answered(view, "slow story please")
    assert not [e for e in view["timeline"] if e["state"] == "streaming"]
    lines = [e["text"] for e in of_kind(view, "line")]
    # Another node took it over: the lines say so (before: "The relay restarted…").
    assert any(line.startswith("The node running this turn stopped or stalled") for line in lines)
    assert not any("relay restarted" in line for line in lines), lines
    # The other node answers the same
    assert answered(second.get(cid), "after the crash")


def test_a_question_open_when_its_owner_is_killed_expires_saying_the_node_stopped(
    nodes: Nodes,
) -> None:
    """The node that took the conversation over says why the question expired: before, "the
    relay restarted", which no relay had."""
    first, _second, third = nodes.nodes
    cid = third.create(provider="demo", title="Asked")
    third.send(cid, "ask permission")
    third.wait_for(cid, has_pending_question)
    nodes.kill(third)
    view = first.wait_for(
        cid, lambda v: first_of(v, is_permission)["state"] != "pending", timeout=TIMEOUT
    )
    asked = first_of(view, is_permission)
    assert (asked["state"], asked["data"]["expired"]) == ("expired", EXPIRED_TAKEOVER)


def test_a_message_withdrawn_on_another_node_is_never_delivered_by_the_owner(
    nodes: Nodes,
) -> None:
    """Edit on node 1 while node 3 runs the turn: gone from node 2's tab, not delivered."""
    first, second, third = nodes.nodes
    cid = third.create(provider="demo", title="Withdrawn")
    with open_socket(second) as ws:
        follow(ws, cid)
        third.send(cid, "slow story please")
        receive_until(ws, lambda e: e["type"] == "delta", timeout=TIMEOUT)
        taken = first.send(cid, "take me back")
        kept = first.send(cid, "keep me")
        response = first.client.delete(f"/api/conversations/{cid}/messages/{taken['id']}")
        assert (response.status_code, response.json()) == (200, taken)
        seen = receive_until(ws, lambda e: e.get("entry_id") == taken["id"], timeout=TIMEOUT)
        assert seen[-1]["type"] == "entry_removed"
        first.client.post(f"/api/conversations/{cid}/interrupt")  # the queue moves on now
        view = second.wait_idle(cid)
    assert [u["text"] for u in of_kind(view, "user")] == ["slow story please", "keep me"]
    assert (answered(view, "keep me"), answered(view, "take me back")) == (True, False)
    late = first.client.delete(f"/api/conversations/{cid}/messages/{kept['id']}")
    assert late.status_code == 409


def test_tabs_see_the_turn_idle_once_another_node_closed_a_killed_owner_s_turn(
    nodes: Nodes,
) -> None:
    """Nothing queued behind the cut turn: the takeover itself tells the tabs the turn is
    over (before, they showed it running, Stop and all, until a reload: a hostile review)."""
    first, second, third = nodes.nodes
    cid = third.create(provider="demo", title="Cut alone")
    with open_socket(second) as ws:
        follow(ws, cid)
        third.send(cid, "slow story please")
        receive_until(ws, lambda e: e["type"] == "delta", timeout=TIMEOUT)
        nodes.kill(third)
        idle = {"turn": False, "sidebar": False}  # the header's Stop, the sidebar's "running"
        lines: list[str] = []

        def over(event: dict[str, Any]) -> bool:
            if event["type"] == "resync":  # a number the killed node took and never used
                ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))  # as a tab
            elif event["type"] == "snapshot":
                idle["turn"] = event["conversation"]["turn"]["state"] == "idle"
                lines.extend(e["text"] for e in event["conversation"]["timeline"])
            elif event["type"] == "turn":
                idle["turn"] = event["turn"]["state"] == "idle"
            elif event["type"] == "entry":
                lines.append(event["entry"]["text"])
            elif event["type"] == "conversation" and "seq" not in event:  # (every tab's)
                idle["sidebar"] = not event["conversation"]["running"]
            return all(idle.values())

        receive_until(ws, over, timeout=TIMEOUT)
    # Another node took it over: the lines say so (before: "The relay restarted…").
    assert any(line.startswith("The node running this turn stopped or stalled") for line in lines)
    assert not any("relay restarted" in line for line in lines), lines
    assert first.get(cid)["turn"] == {"state": "idle", "queued": 0}


@contextlib.contextmanager
def claude_nodes(root: Path) -> Iterator[tuple[FakeAnthropic, RelayProcess, RelayProcess]]:
    """Two nodes whose Claude Code talks to one fake Messages API: the API and the nodes."""
    home = root / "home"
    (home / "tmp").mkdir(parents=True)
    with FakeAnthropic() as api, cluster(root) as running:
        owner, other = running.start(
            2,
            HOME=str(home),
            ANTHROPIC_BASE_URL=api.base_url,
            ANTHROPIC_API_KEY="sk-test",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            CLAUDE_CODE_TMPDIR=str(home / "tmp"),
        )
        yield api, owner, other


def test_tabs_on_other_nodes_see_a_stopped_node_s_unanswered_turn_end(tmp_path: Path) -> None:
    """SIGTERM while Claude Code waits on the API: the owner reads the stopped CLI's record
    before it says the turn ended (the prompt is there: the shutdown line); the tabs on the
    other node see that line and the conversation not running any more."""
    with claude_nodes(tmp_path) as (api, owner, other):
        cid = owner.create(provider="claude", title="Stopped")
        with open_socket(other) as ws:
            follow(ws, cid)
            owner.send(cid, "wait for me [[SLOW:600]]")
            deadline = time.monotonic() + TIMEOUT
            while not any("wait for me" in str(r.body) for r in api.requests):
                assert time.monotonic() < deadline, "the CLI never asked the API"
                time.sleep(0.05)
            assert owner.kill(signal.SIGTERM) == 0
            shown = {"line": False, "running": True}

            def ended(event: dict[str, Any]) -> bool:
                if event["type"] == "entry" and event["entry"]["text"] == SHUTDOWN_LINE:
                    shown["line"] = True
                elif event["type"] == "conversation" and "seq" not in event:  # the sidebar's
                    shown["running"] = event["conversation"]["running"]
                return shown["line"] and not shown["running"]

            receive_until(ws, ended, timeout=TIMEOUT)


def test_a_mode_changed_on_another_node_reaches_the_running_turn(tmp_path: Path) -> None:
    """Changed to acceptEdits on node 2 while Claude Code on node 1 waits for the model: the
    write the model then asks for is done without a question (before: asked, in default)."""
    with claude_nodes(tmp_path) as (api, owner, other):
        cid = owner.create(provider="claude", title="Mode", permission_mode="default")
        work = Path(owner.get(cid)["cwd"])
        owner.send(cid, "hello")  # node 1 runs it from here on
        owner.wait_idle(cid)
        owner.send(cid, "[[WRITE:one.txt|1]] [[SLOW:2]]")
        deadline = time.monotonic() + TIMEOUT
        while not any("one.txt" in str(r.body) for r in api.requests):
            assert time.monotonic() < deadline, "the CLI never asked the API"
            time.sleep(0.05)
        changed = other.client.patch(
            f"/api/conversations/{cid}", json={"permission_mode": "acceptEdits"}
        )
        assert changed.status_code == 200, changed.text
        view = owner.wait_for(cid, idle_or_asking)
    asked = [e["text"] for e in view["timeline"] if e["data"].get("type") == "permission"]
    assert (asked, view["turn"]["state"]) == ([], "idle")
    assert (work / "one.txt").read_text() == "1"


def test_a_plan_approved_or_a_model_chosen_on_another_node_reaches_the_running_turn(
    tmp_path: Path,
) -> None:
    """Claude Code runs on node 1, the user answers on node 2. A plan approved there goes on
    in the mode chosen with it. A model chosen there while a write waits for its answer is
    the model of the request after the answer, in the same turn."""
    with claude_nodes(tmp_path) as (api, owner, other):
        cid = owner.create(provider="claude", title="Plan", permission_mode="plan")
        work = Path(owner.get(cid)["cwd"])
        api.tool_calls.append(("ExitPlanMode", {"plan": "1. Write one.txt"}))
        owner.send(cid, "make a plan")  # node 1 runs it
        question = pending(other, cid)
        answer = other.client.post(
            f"/api/conversations/{cid}/permissions/{question['id']}",
            json={"allow": True, "mode": "acceptEdits"},
        )
        assert answer.status_code == 200, answer.text
        other.wait_for(cid, lambda v: v["permission_mode"] == "acceptEdits")
        owner.wait_idle(cid)
        owner.send(cid, "[[WRITE:one.txt|1]]")
        view = owner.wait_for(cid, idle_or_asking)
        assert [e["data"]["tool"] for e in view["timeline"] if e["state"] == "pending"] == []
        assert (work / "one.txt").read_text() == "1"

        model = owner.create(provider="claude", title="Model")
        owner.send(model, "[[WRITE:two.txt|2]]")  # node 1 runs it; the write is asked about
        question = pending(owner, model)
        chosen = other.client.patch(f"/api/conversations/{model}", json={"chosen_model": "haiku"})
        assert chosen.status_code == 200, chosen.text
        time.sleep(1)  # the control message's way to node 1 (Redis pub/sub: milliseconds)
        answer = other.client.post(
            f"/api/conversations/{model}/permissions/{question['id']}", json={"allow": True}
        )
        assert answer.status_code == 200, answer.text
        owner.wait_idle(model)
        # One the agent will not take (the API's 404): node 2 stored it; node 1 puts it back
        # and says so in the timeline.
        refused = other.client.patch(
            f"/api/conversations/{model}", json={"chosen_model": "no-such-model"}
        )
        assert refused.status_code == 200, refused.text
        view = other.wait_for(
            model,
            lambda v: (
                v["chosen_model"] == "haiku"
                and any("did not take the model" in e["text"] for e in of_kind(v, "line"))
            ),
        )
    bodies = [body for body in api.message_bodies() if "two.txt" in json.dumps(body)]
    models = [str(body.get("model")) for body in bodies]
    assert ["haiku" in model for model in models] == [False, True], models
    (line,) = [e for e in of_kind(view, "line") if "did not take the model" in e["text"]]
    assert line["text"].startswith("Claude Code did not take the model “no-such-model”: ")


def idle_or_asking(view: dict[str, Any]) -> bool:
    """The turn ended, or it waits for an answer to a question."""
    return view["turn"]["state"] == "idle" or any(e["state"] == "pending" for e in view["timeline"])


def pending(node: RelayProcess, cid: int) -> dict[str, Any]:
    """The question a conversation waits on, once it asks."""
    view = node.wait_for(cid, lambda v: any(e["state"] == "pending" for e in v["timeline"]))
    (question,) = [e for e in view["timeline"] if e["state"] == "pending"]
    return question


def test_a_node_takes_only_conversations_whose_directory_it_has(
    nodes: Nodes, tmp_path: Path
) -> None:
    """A conversation in a directory only node 4 has runs on node 4, whichever node got it."""
    own = tmp_path / "only-here"
    (own / "project").mkdir(parents=True)
    roots = f"{nodes.workspace},{own}"
    (fourth,) = nodes.start(1, OARLOCK_WORKSPACE_ROOTS=roots)
    first = nodes.nodes[0]
    cid = fourth.create(provider="demo", title="Own dir", cwd=str(own / "project"))
    first.send(cid, "only node four can run me")  # node 1 cannot: it wakes the others
    # The answer, not only idle: node 1 once said idle with the answer not yet in its view
    # (a guess at why: its view is read statement by statement under READ COMMITTED).
    view = first.wait_for(cid, lambda v: answered(v, "only node four can run me"))
    assert first.wait_idle(cid)["turn"] == {"state": "idle", "queued": 0}
    assert answered(view, "only node four can run me")
    deadline = time.monotonic() + TIMEOUT
    while "node4" not in (owner := _log_owner(nodes, cid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "node4" in owner


def _log_owner(nodes: Nodes, cid: int) -> str:
    """The node whose log says it ran the conversation."""
    for node in nodes.nodes:
        if f"runs conversation {cid}\n" in node.log.read_text(errors="replace"):
            return node.data_dir.name
    return ""


def test_a_session_this_node_cannot_reach_starts_anew_with_the_carry_over_summary(
    tmp_path: Path,
) -> None:
    """Claude Code's session files are not here: a new session, the summary, one line."""
    with cluster(tmp_path) as running:
        config = tmp_path / "claude-config"  # empty: no session of any conversation
        config.mkdir()
        (node,) = running.start(
            1,
            OARLOCK_CLAUDE_CLI="/bin/false",  # the turn itself fails: the prompt is what counts
            CLAUDE_CONFIG_DIR=str(config),
            ANTHROPIC_API_KEY="not-used",
        )
        cid = node.create(provider="claude", title="Moved here")
        with psycopg.connect(running.database_url.replace("+psycopg", "")) as db:
            db.execute("UPDATE conversation SET session_id = 'elsewhere' WHERE id = %s", (cid,))
        sent = node.send(cid, "carry on please")
        view = node.wait_for(cid, lambda v: entry(v, sent["id"])["state"] != "queued")
        with psycopg.connect(running.database_url.replace("+psycopg", "")) as db:
            row = db.execute("SELECT session_id FROM conversation WHERE id = %s", (cid,))
            assert row.fetchone() == (None,)  # the lost session is not resumed
    lines = [e["text"] for e in of_kind(view, "line")]
    assert lines.count(MOVED_LINE) == 1
    message = entry(view, sent["id"])
    assert message["data"]["summary"].startswith("Conversation: Moved here")


def test_a_tab_opening_mid_stream_gets_the_streamed_text_once_on_any_node(
    nodes: Nodes,
) -> None:
    """The snapshot's streaming text and the deltas after its seq join without a gap or a copy,
    on a node that does not run the conversation and on the one that does."""
    first, second, third = nodes.nodes
    cid = third.create(provider="demo", title="Mid-stream")
    with open_socket(second) as watch:
        follow(watch, cid)
        third.send(cid, "slow words please")
        receive_until(watch, lambda e: e["type"] == "delta" and e.get("text"), timeout=TIMEOUT)
        # Past a checkpoint of the partial text (once a second): the database lags the stream.
        receive_until(watch, lambda e: e["type"] == "delta" and "word30 " in e["text"])
    views = [first.get(cid), third.get(cid)]  # node 1 never followed it; node 3 runs it
    with open_socket(first) as one, open_socket(third) as three:
        for ws, view in zip((one, three), views, strict=True):
            (live,) = [e for e in of_kind(view, "agent") if e["state"] == "streaming"]
            text = live["text"]
            event = follow(ws, cid, epoch=view["epoch"], seq=view["seq"])
            while not (event["type"] == "entry" and event["entry"]["id"] == live["id"]):
                if event["type"] == "delta" and event.get("entry_id") == live["id"]:
                    text += event["text"]
                event = receive(ws, timeout=TIMEOUT)
            assert event["entry"]["state"] == "done"
            assert text == event["entry"]["text"]


def test_without_redis_a_message_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    """No event number can be taken: 503 with a reason, and the message is not in the database."""
    with cluster(tmp_path) as running:
        (node,) = running.start(1)
        cid = node.create(provider="demo", title="No engine")
        running.redis.stop()
        response = node.client.post(f"/api/conversations/{cid}/messages", json={"text": "lost?"})
        assert response.status_code == 503
        assert response.json() == {"detail": ENGINE_DOWN}
        with psycopg.connect(running.database_url.replace("+psycopg", "")) as db:
            count = db.execute("SELECT count(*) FROM entry WHERE conversation_id = %s", (cid,))
            assert count.fetchone() == (0,)


def test_redis_losing_its_data_gives_tabs_a_new_epoch_and_a_snapshot(tmp_path: Path) -> None:
    """FLUSHALL (a restart without persistence): tabs are told, resubscribe, follow on."""
    with cluster(tmp_path) as running:
        (node,) = running.start(1)
        cid = node.create(provider="demo", title="Flushed")
        node.send(cid, "before the flush")
        node.wait_idle(cid)
        with open_socket(node) as ws:
            answer = follow(ws, cid)
            old_epoch, seq = answer["conversation"]["epoch"], answer["conversation"]["seq"]
            client = redis.Redis.from_url(running.redis_url)
            client.flushall()
            client.close()
            hello = receive_until(ws, lambda e: e["type"] == "hello", timeout=TIMEOUT)[-1]
            assert hello["epoch"] != old_epoch
            ws.send(
                json.dumps(
                    {"type": "subscribe", "conversation_id": cid, "epoch": old_epoch, "seq": seq}
                )
            )
            snapshot = receive_until(ws, lambda e: e["type"] == "snapshot", timeout=TIMEOUT)[-1]
            assert snapshot["conversation"]["epoch"] == hello["epoch"]
            start = snapshot["conversation"]["seq"]
            node.send(cid, "after the flush")
            seen = receive_until(
                ws,
                lambda e: e["type"] == "turn" and e["turn"] == {"state": "idle", "queued": 0},
                timeout=TIMEOUT,
            )
    events = [e for e in seen if "seq" in e]
    assert [e["seq"] for e in events] == list(range(start + 1, start + 1 + len(events)))
    entries = [e["entry"] for e in events if e["type"] == "entry"]
    assert answered({"timeline": entries}, "after the flush")


def test_a_second_live_node_under_one_name_or_another_token_is_refused(tmp_path: Path) -> None:
    # A self-hoster's review: two processes with one OARLOCK_NODE_ID started without a word;
    # both would hold that node's leases and run the same conversations' agents.
    with cluster(tmp_path) as nodes:
        (first,) = nodes.start(1, OARLOCK_NODE_ID="twin")
        client = redis.Redis.from_url(nodes.redis_url)
        deadline = time.monotonic() + TIMEOUT
        while not client.exists("oarlock:node:twin"):  # its first heartbeat wrote its name
            assert time.monotonic() < deadline, "the node never wrote its name"
            time.sleep(0.1)
        # A twin started at the same moment (past the check) writes the name too: logged.
        mark = client.get("oarlock:node:twin").decode().rpartition(":")[2]
        client.set("oarlock:node:twin", f"another-process:{mark}", ex=LEASE_SECONDS)
        said = "another live relay runs as node 'twin': OARLOCK_NODE_ID must differ"
        while said not in first.log.read_text():
            assert time.monotonic() < deadline, "the pair was never logged"
            time.sleep(0.1)
        env = nodes.env(OARLOCK_NODE_ID="twin", OARLOCK_TOKEN=TOKEN)
        command = ["serve", "--port", "1", "--data-dir", str(tmp_path / "twin")]
        assert refused(command, env, ROOT) == (
            "OARLOCK_NODE_ID: another live relay runs as node 'twin'; give each node its own "
            "name (two would both run the same conversations' agents)."
        )
        nodes.kill(first)  # its key is no longer renewed: a new process takes the name
        (again,) = nodes.start(1, OARLOCK_NODE_ID="twin")
        assert again.http.get("/healthz").status_code == 200
        # Another token than the running nodes': refused (they would refuse its logins).
        env = nodes.env(OARLOCK_TOKEN="another-token-0123456789")
        command = ["serve", "--port", "1", "--data-dir", str(tmp_path / "other")]
        assert refused(command, env, ROOT) == (
            "OARLOCK_TOKEN is not the token of the nodes running now (node 'twin'): give every "
            "node the same one; to change it, stop every node first (a stopped node's name is "
            "forgotten a lease after it stops)."
        )
        client.close()


def node_rows(nodes: Nodes) -> dict[str, str]:
    """The cluster_node rows: each node's name and its Redis epoch."""
    with psycopg.connect(nodes.database_url.replace("+psycopg", "")) as db:
        return dict(db.execute("SELECT name, epoch FROM cluster_node").fetchall())


def write_row(nodes: Nodes, name: str, lease: float, age: float) -> None:
    """Write a node's row with epoch 'x' (another Redis's), as written age seconds ago."""
    with psycopg.connect(nodes.database_url.replace("+psycopg", "")) as db:
        db.execute(
            "INSERT INTO cluster_node (name, epoch, lease, seen_at)"
            " VALUES (%s, 'x', %s, now() - make_interval(secs => %s))"
            " ON CONFLICT (name) DO UPDATE SET seen_at = EXCLUDED.seen_at",
            (name, lease, age),
        )


def test_a_node_on_another_redis_database_is_refused(tmp_path: Path) -> None:
    # An operator's review: nodes whose OARLOCK_REDIS_URL named different databases (/0 and
    # /1) started without a word, sharing the conversations but not the events: a tab on one
    # never saw what the other's agents did.
    with cluster(tmp_path) as nodes:
        (first,) = nodes.start(1, OARLOCK_NODE_ID="first")
        deadline = time.monotonic() + TIMEOUT
        while "first" not in node_rows(nodes):  # its first heartbeat wrote its row
            assert time.monotonic() < deadline, "the node never wrote its row"
            time.sleep(0.1)
        assert nodes.redis_url.endswith("/0")
        other = nodes.redis_url.removesuffix("/0") + "/1"
        # A live node's row counts for its own lease, not the starting node's (a second review:
        # one with a 30 s lease, writing every 10 s, was not seen by a start with a 2 s lease).
        keep = threading.Event()

        def write_slow() -> None:
            while not keep.is_set():
                write_row(nodes, "slow", lease=8, age=3)  # older than the 3 s lease below
                time.sleep(0.3)

        def start_as(name: str, redis_url: str) -> str:
            """A start's refusal (each waits up to 1.5 leases: they run at once)."""
            command = ["serve", "--port", "1", "--data-dir", str(tmp_path / name)]
            env = nodes.env(OARLOCK_REDIS_URL=redis_url, OARLOCK_TOKEN=TOKEN, OARLOCK_NODE_ID=name)
            return refused(command, env, ROOT)

        writer = threading.Thread(target=write_slow)
        writer.start()
        try:
            with ThreadPoolExecutor() as pool:
                # Another Redis database; the same name on another (a second review: its own
                # row was left out, and the name check looks in its own Redis only); the right
                # Redis beside a long-lease node of another.
                starts = [("second", other), ("first", other), ("fourth", nodes.redis_url)]
                said = list(pool.map(lambda start: start_as(*start), starts))
        finally:
            keep.set()
            writer.join()
        assert said[0] == (
            "OARLOCK_REDIS_URL: node 'first' uses another Redis server or database than node "
            "'second': give every node the same one (on different ones, a node's tabs never "
            "see what the others' agents do)."
        )
        assert said[1] == (
            "OARLOCK_REDIS_URL: another live relay runs as node 'first' on another Redis server "
            "or database: give every node the same Redis and its own name."
        )
        assert said[2].startswith(
            "OARLOCK_REDIS_URL: node 'slow' uses another Redis server or database"
        )
        # A Redis that cannot be reached while it checks: one line, no traceback.
        assert same_redis.start_error(nodes.database_url, "redis://127.0.0.1:1/0", "x", 3) == (
            "OARLOCK_REDIS_URL cannot be used: Error 111 connecting to 127.0.0.1:1. "
            "Connection refused."
        )
        # Redis losing its data (a restart without persistence) is not another Redis: a start
        # right after waits for the live node to see the new epoch, then runs.
        client = redis.Redis.from_url(nodes.redis_url)
        client.flushall()
        (second,) = nodes.start(1, OARLOCK_NODE_ID="second")
        assert second.http.get("/healthz").status_code == 200
        # Two nodes that started at one moment (neither row written yet) pass the check: the
        # running ones log it. A row of another Redis, written as a live node writes it:
        write_row(nodes, "gone", lease=3, age=7200)  # forgotten at the next beat
        deadline = time.monotonic() + TIMEOUT
        said = "OARLOCK_REDIS_URL: node 'third' uses another Redis server or database"
        while said not in first.log.read_text():
            assert time.monotonic() < deadline, "the other Redis was never logged"
            write_row(nodes, "third", lease=3, age=0)
            time.sleep(0.2)
        assert set(node_rows(nodes)) == {"first", "second", "third", "slow"}
        client.close()
        # A row gone an hour that another node writes now (back after an outage) is left to a
        # later beat: two such nodes each waited on the other's row (a second review).
        write_row(nodes, "back", lease=3, age=7200)
        engine = make_engine(nodes.database_url)
        with psycopg.connect(nodes.database_url.replace("+psycopg", "")) as db:
            db.execute("UPDATE cluster_node SET lease = 3 WHERE name = 'back'")  # locked
            began = time.monotonic()
            same_redis.beat(engine, "fifth", "e", None, 3)
            assert time.monotonic() - began < 1  # (else: the lock timeout's error)
        # Two processes under one name on two Redis databases write one row: each beat finds
        # it holding what it did not write, and names its own name first (logged as a twin).
        assert "twin" not in same_redis.beat(engine, "twin", "e1", None, 3)
        assert "twin" not in same_redis.beat(engine, "twin", "e2", None, 3)  # the other one
        assert same_redis.beat(engine, "twin", "e1", "e1", 3)[0] == "twin"
        engine.dispose()
