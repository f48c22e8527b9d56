"""The supervisor with the demo agent: turns, queue, compaction lines, window restarts, recovery."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from app import store
from app.agents.demo import DemoAgent
from app.db import get_session, make_engine
from app.supervisor import RESTART_LINE, is_compact_command
from tests.relay import LiveRelay, make_settings


def texts(view: dict[str, Any], kind: str) -> list[str]:
    """The texts of one kind of entry, in timeline order."""
    return [entry["text"] for entry in view["timeline"] if entry["kind"] == kind]


def test_is_compact_command_only_whole_message() -> None:
    assert is_compact_command("  /compact \n")
    assert not is_compact_command("/compact now")
    assert not is_compact_command("please /compact")
    assert not is_compact_command("/compactx")


def test_turn_stores_user_agent_and_result(relay: LiveRelay) -> None:
    conversation = relay.create(title="t")
    assert relay.send(conversation["id"], "hello").status_code == 202
    view = relay.wait_idle(conversation["id"])
    assert [(e["kind"], e["state"]) for e in view["timeline"]] == [
        ("user", "sent"),
        ("agent", "done"),
    ]
    agent = view["timeline"][1]
    assert agent["text"].startswith("You said: “hello”")
    assert agent["html"].startswith("<p>You said: “hello”</p>")
    assert agent["data"]["result"]["cost_usd"] is None  # the demo costs nothing
    assert agent["data"]["result"]["duration_ms"] >= 0
    assert view["context_tokens"] == 9_000 + 12_000 + len("hello") // 4
    assert view["session_id"] == f"demo-{conversation['id']}"


def test_messages_during_a_turn_are_queued_then_delivered_in_order(relay: LiveRelay) -> None:
    conversation = relay.create()
    cid = conversation["id"]
    relay.send(cid, "slow one")
    relay.wait_for(cid, lambda v: any(e["kind"] == "agent" for e in v["timeline"]))
    second = relay.send(cid, "second").json()
    third = relay.send(cid, "third").json()
    assert (second["state"], third["state"]) == ("queued", "queued")
    busy = relay.get(cid)
    assert busy["turn"] == {"state": "running", "queued": 2}
    assert [e["text"] for e in busy["timeline"][-2:]] == ["second", "third"]
    view = relay.wait_idle(cid, timeout=60)
    kinds = [(e["kind"], e["text"].split("”")[0]) for e in view["timeline"]]
    assert kinds == [
        ("user", "slow one"),
        ("agent", "You said: “slow one"),
        ("user", "second"),
        ("agent", "You said: “second"),
        ("user", "third"),
        ("agent", "You said: “third"),
    ]


def test_demo_compaction_line_and_meter(tmp_path: Path) -> None:
    live = LiveRelay(make_settings(tmp_path / "data")).start()
    try:
        cid = live.create()["id"]
        live.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 100_000})
        # 9k + 12k per turn: the 6th turn starts at 69k ≥ 67k and compacts first.
        for n in range(6):
            live.send(cid, f"m{n}")
            live.wait_idle(cid)
        view = live.get(cid)
        lines = [e for e in view["timeline"] if e["kind"] == "line"]
        assert [line["text"] for line in lines] == ["Context compacted · 69k → 3k tokens"]
        # (its link to the backup written before it: tests/test_backups_relay.py)
        assert {k: v for k, v in lines[0]["data"].items() if k != "backup"} == {
            "level": "info",
            "type": "compaction",
            "trigger": "auto",
            "pre_tokens": 69_000,
            "post_tokens": 3_000,
            "duration_ms": lines[0]["data"]["duration_ms"],
            "summary": (
                "The demo agent's summary of its first 5 turns: it quoted each message back."
            ),
        }
        assert lines[0]["data"]["duration_ms"] >= 0
        kinds = [e["kind"] for e in view["timeline"]]
        assert kinds[-3:] == ["user", "line", "agent"]  # above the turn's reply
        assert view["context_tokens"] == 3_000 + 12_000
    finally:
        live.stop()


def test_message_sent_during_compaction_is_queued(tmp_path: Path) -> None:
    live = LiveRelay(make_settings(tmp_path / "data", demo_delay=0.3)).start()
    try:
        cid = live.create()["id"]
        live.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 100_000})
        engine = make_engine(live.settings.db_url)
        with get_session(engine) as session:
            conversation = store.get_conversation(session=session, conversation_id=cid)
            assert conversation is not None
            store.update_conversation(
                session=session, conversation=conversation, context_tokens=90_000
            )
        engine.dispose()  # PostgreSQL's connection would otherwise close only when collected
        live.send(cid, "go")
        # The state is set in the job that stores the line: a view read between the two has
        # the state first (the line then reaches a tab as an event); wait for both.
        compacting = live.wait_for(
            cid,
            lambda v: (
                v["turn"]["state"] == "compacting"
                and any(e["kind"] == "line" for e in v["timeline"])
            ),
        )
        assert [e["text"] for e in compacting["timeline"] if e["kind"] == "line"] == [
            "Compacting context…"
        ]
        queued = live.send(cid, "while compacting").json()
        assert queued["state"] == "queued"
        assert live.get(cid)["turn"] == {"state": "compacting", "queued": 1}
        view = live.wait_idle(cid, timeout=60)
        assert [e["text"] for e in view["timeline"] if e["kind"] == "user"] == [
            "go",
            "while compacting",
        ]
        assert texts(view, "line") == ["Context compacted · 90k → 3k tokens"]
    finally:
        live.stop()


def test_window_change_restarts_once_with_old_and_final_values(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    relay.send(cid, "first")
    relay.wait_idle(cid)
    for value in (300_000, 500_000, 100_000):
        relay.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": value})
    context = relay.http.get(f"/api/conversations/{cid}/context").json()
    assert context["pending_restart"] is True
    assert context["note"] == "Applies on the next message (the session restarts once)."
    relay.send(cid, "second")
    view = relay.wait_idle(cid)
    assert texts(view, "line") == [
        "Restarted the session to apply the compaction window (Auto → 100k)"
    ]
    assert view["session_id"] == f"demo-{cid}"
    assert relay.http.get(f"/api/conversations/{cid}/context").json()["pending_restart"] is False


def test_window_changed_back_restarts_nothing(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    relay.send(cid, "first")
    relay.wait_idle(cid)
    relay.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 200_000})
    relay.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": None})
    relay.send(cid, "second")
    assert texts(relay.wait_idle(cid), "line") == []


Row = tuple[str, str, str, dict[str, Any]]  # kind, text, state, data


def after_a_crash(tmp_path: Path, rows: list[Row]) -> tuple[LiveRelay, int]:
    """A relay started on what a crash mid-turn left: a conversation holding rows, its turn
    marked active; and the conversation's id."""
    settings = make_settings(tmp_path / "data")
    first = LiveRelay(settings).start()
    cid = first.create()["id"]
    first.stop()
    engine = make_engine(settings.db_url)
    with get_session(engine) as session:
        conversation = store.get_conversation(session=session, conversation_id=cid)
        assert conversation is not None
        for seq, (kind, text, state, data) in enumerate(rows, start=1):
            store.add_entry(
                session=session,
                conversation=conversation,
                seq=seq,
                kind=kind,
                text=text,
                state=state,
                data=data,
            )
        store.update_conversation(session=session, conversation=conversation, turn_active=True)
    engine.dispose()
    return LiveRelay(settings).start(), cid


def test_restart_marks_cut_turn_and_delivers_queue(tmp_path: Path) -> None:
    # Streamed text, and a message queued behind the cut turn.
    rows = [("user", "a", "sent", {}), ("agent", "par", "streaming", {})]
    second, cid = after_a_crash(tmp_path, [*rows, ("user", "b", "queued", {})])
    try:
        view = second.wait_idle(cid)
        shown = [(e["kind"], e["state"], e["text"].split("”")[0]) for e in view["timeline"]]
        assert shown == [
            ("user", "sent", "a"),
            ("agent", "interrupted", "par"),
            ("line", "done", RESTART_LINE),  # its streamed text says the agent got "a"
            ("user", "sent", "b"),
            ("agent", "done", "You said: “b"),
        ]
    finally:
        second.stop()


def test_restart_drops_a_compaction_left_running_and_ends_a_tool_call(tmp_path: Path) -> None:
    """A crash mid-compaction and mid-tool: "A compaction that ends without a result leaves no
    line" (SPEC §3), and the call shows it got no result, not a spinner for ever."""
    second, cid = after_a_crash(
        tmp_path,
        [
            ("user", "a", "sent", {}),
            ("activity", "ls", "running", {"type": "tool", "tool": "Bash", "tool_id": "t1"}),
            ("line", "Compacting context…", "running", {"type": "compaction", "trigger": "auto"}),
        ],
    )
    try:
        view = second.wait_idle(cid)
        assert [(e["kind"], e["state"], e["text"]) for e in view["timeline"]] == [
            ("user", "sent", "a"),
            ("activity", "interrupted", "ls"),
            ("line", "done", RESTART_LINE),  # the tool call says the agent got "a"
        ]
    finally:
        second.stop()


@pytest.mark.parametrize("state", ["running", "done"])
def test_restart_takes_a_compaction_after_the_message_for_its_receipt(
    tmp_path: Path, state: str
) -> None:
    """A crash during the compaction the agent began on getting the message (or after it):
    the agent had the message, which is not delivered again. Before, a compaction line left
    running was dropped before the turn was judged, and a finished one was not looked at."""
    compaction = {"type": "compaction", "trigger": "auto"}
    second, cid = after_a_crash(
        tmp_path,
        [("user", "a", "sent", {}), ("line", "Compacting context…", state, compaction)],
    )
    try:
        view = second.wait_idle(cid)
        shown = [(e["kind"], e["text"]) for e in view["timeline"]]
        kept = [("line", "Compacting context…")] if state == "done" else []
        assert shown == [("user", "a"), *kept, ("line", RESTART_LINE)]
    finally:
        second.stop()


class BackgroundDemo(DemoAgent):
    """The demo agent, with background work switched on and off by the test."""

    busy = True

    def background_work(self) -> bool:
        """What the test says."""
        return BackgroundDemo.busy


def test_the_idle_timeout_spares_an_agent_running_background_work(tmp_path: Path) -> None:
    # Found by a hostile review: the idle timeout stopped an agent whose background shell
    # still ran (the job killed, without a word); the memory budget already spared it.
    with LiveRelay(make_settings(tmp_path / "data", agent_idle_timeout=1)) as relay:
        relay.supervisor.agent_factory = lambda _provider, spec, _settings: BackgroundDemo(spec)
        BackgroundDemo.busy = True
        cid = relay.create()["id"]
        relay.send(cid, "first")
        relay.wait_idle(cid)
        runner = relay.supervisor.runners[cid]
        time.sleep(3)  # three idle timeouts, six passes of the reaper
        assert runner.agent is not None
        BackgroundDemo.busy = False  # its work ended: the timeout applies again
        deadline = time.monotonic() + 10
        while runner.agent is not None:
            assert time.monotonic() < deadline, "the idle agent was never stopped"
            time.sleep(0.1)


def test_window_change_waits_for_background_work(relay: LiveRelay) -> None:
    relay.supervisor.agent_factory = lambda _provider, spec, _settings: BackgroundDemo(spec)
    BackgroundDemo.busy = True
    cid = relay.create()["id"]
    relay.send(cid, "first")
    relay.wait_idle(cid)
    relay.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 100_000})
    context = relay.http.get(f"/api/conversations/{cid}/context").json()
    assert context["note"] == "Applies when background work has finished."
    relay.send(cid, "second")
    assert texts(relay.wait_idle(cid), "line") == []  # no restart: it would kill the work
    assert relay.http.get(f"/api/conversations/{cid}/context").json()["pending_restart"] is True
    BackgroundDemo.busy = False
    relay.send(cid, "third")
    assert texts(relay.wait_idle(cid), "line") == [
        "Restarted the session to apply the compaction window (Auto → 100k)"
    ]
