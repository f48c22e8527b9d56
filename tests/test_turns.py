"""Turns and compaction (issue 12): queued messages across /compact, Stop while an agent starts,
the archived conversation's agent, database failures mid-turn, Copilot resume failures.

The demo agent through a real relay, the real `claude` CLI against tests/fake_anthropic.py and
the real Copilot CLI against tests/fake_openai.py; assertions on what the relay stored, what
the fake APIs received and which processes run.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from app.agents.copilot import RESUME_FAILED as COPILOT_RESUME_FAILED
from app.agents.demo import reply_text
from app.summary import compose_first_message
from tests.claude_env import use_fake_anthropic
from tests.fake_anthropic import FakeAnthropic
from tests.fake_openai import FakeOpenAI
from tests.relay import LiveRelay, make_settings
from tests.test_claude_relay import (
    TIMEOUT,
    agent_pid,
    create_claude,
    last_message_texts,
    process_alive,
    shape,
    streaming_words,
    turn,
)

StartRelay = Callable[..., LiveRelay]
INTERRUPTED = ("line", "done", "Interrupted by the user.")


@pytest.fixture
def anthropic() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


@pytest.fixture
def start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anthropic: FakeAnthropic
) -> Iterator[StartRelay]:
    """Start relays whose claude agents talk to the fake Messages API from a fresh HOME."""
    use_fake_anthropic(monkeypatch, tmp_path / "home", anthropic.base_url)
    running: list[LiveRelay] = []

    def start_relay(**overrides: Any) -> LiveRelay:
        live = LiveRelay(make_settings(tmp_path / "data", **overrides)).start()
        running.append(live)
        return live

    yield start_relay
    for live in running:
        if live.thread.is_alive():
            live.stop()


def wait_until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    """Poll until condition() holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def texts(view: dict[str, Any], kind: str) -> list[str]:
    return [e["text"] for e in view["timeline"] if e["kind"] == kind]


def compact(live: LiveRelay, cid: int) -> dict[str, Any]:
    response = live.send(cid, "/compact")
    assert response.status_code == 201, response.text
    return dict(response.json()["compacted_into"])


# 12: messages queued before /compact ------------------------------------------------------------


def test_demo_queued_message_moves_into_new_conversation(tmp_path: Path) -> None:
    live = LiveRelay(make_settings(tmp_path / "data", demo_delay=0.03)).start()
    try:
        cid = live.create(title="Queue")["id"]
        assert live.send(cid, "slow please").status_code == 202
        live.wait_for(cid, lambda v: any(e["kind"] == "agent" for e in v["timeline"]))
        queued = live.send(cid, "queued before compact").json()
        assert queued["state"] == "queued"
        new = compact(live, cid)
        summary = new["pending_summary"]
        assert summary.startswith("Conversation: Queue\nUser: slow please")
        assert "queued" not in summary

        view = live.wait_idle(new["id"])
        assert [(e["id"], e["kind"], e["state"]) for e in view["timeline"]] == [
            (queued["id"], "user", "sent"),
            (view["timeline"][1]["id"], "agent", "done"),
        ]
        assert texts(view, "user") == ["queued before compact"]
        prompt = compose_first_message(summary, "queued before compact")
        assert texts(view, "agent") == [reply_text(prompt)]
        assert view["pending_summary"] is None

        old = live.wait_idle(cid)
        assert old["status"] == "archived"
        assert texts(old, "user") == ["slow please"]  # the archived one never ran it
        assert len(texts(old, "agent")) == 1
    finally:
        live.stop()


def test_claude_queued_message_gets_summary_in_new_conversation(
    start: StartRelay, anthropic: FakeAnthropic
) -> None:
    anthropic.long_word_delay = 0.02
    live = start()
    cid = create_claude(live, title="Queue")
    turn(live, cid, "first")
    # the marker lies past the summary's 260 characters: the carry-over does not repeat it
    long = "talk " + "x" * 300 + " [[LONG:300]]"
    assert live.send(cid, long).status_code == 202
    live.wait_for(cid, streaming_words, timeout=TIMEOUT)
    assert live.send(cid, "queued one").json()["state"] == "queued"
    assert live.send(cid, "queued two").json()["state"] == "queued"
    old_view = live.get(cid)
    new = compact(live, cid)
    summary = new["pending_summary"]
    assert summary.startswith(
        "Conversation: Queue\nUser: first\nAgent: You said: first\nUser: talk"
    )
    assert "[[LONG" not in summary
    assert "queued" not in summary and "queued" not in str(old_view["pending_summary"])

    view = live.wait_idle(new["id"], timeout=TIMEOUT)
    composed = compose_first_message(summary, "queued one")
    assert composed == (
        "[Carry-over context from previous compacted conversation]\n"
        f"{summary}\n\n[New user request]\nqueued one"
    )
    assert shape(view) == [
        ("user", "sent", "queued one"),
        ("agent", "done", f"You said: {composed}"),
        ("user", "sent", "queued two"),
        ("agent", "done", "You said: queued two"),
    ]
    bodies = anthropic.message_bodies()
    asked = [last_message_texts(b)[-1] for b in bodies]
    assert asked.count(composed) == 1  # the first queued message, carrying the summary
    assert "queued one" not in asked  # never delivered bare (by the archived conversation)
    assert asked.count("queued two") == 1

    old = live.wait_idle(cid, timeout=TIMEOUT)
    assert texts(old, "user") == ["first", long]
    assert len(texts(old, "agent")[-1].split()) == 300  # the running turn was not stopped


def test_message_left_queued_in_an_archived_conversation_moves_on(tmp_path: Path) -> None:
    """A database from an older relay: an archived conversation still holds a queued message."""
    settings = make_settings(tmp_path / "data")
    first = LiveRelay(settings).start()
    try:
        old = first.create(title="Old relay")["id"]
        first.send(old, "hello")
        first.wait_idle(old)
        new = compact(first, old)
    finally:
        first.stop()
    db = sqlite3.connect(tmp_path / "data" / "oarlock.db")
    with db:
        db.execute(
            "INSERT INTO entry (conversation_id, seq, kind, text, state, data, created_at) "
            "VALUES (?, 100, 'user', 'left behind', 'queued', '{}', '2026-01-01 00:00:00')",
            (old,),
        )
        db.execute("UPDATE conversation SET last_seq = 100 WHERE id = ?", (old,))
    db.close()

    second = LiveRelay(make_settings(tmp_path / "data")).start()
    try:
        view = second.wait_for(new["id"], lambda v: len(v["timeline"]) == 2)
        view = second.wait_idle(new["id"])
        prompt = compose_first_message(new["pending_summary"], "left behind")
        assert shape(view) == [
            ("user", "sent", "left behind"),
            ("agent", "done", reply_text(prompt)),
        ]
        assert texts(second.get(old), "user") == ["hello"]
    finally:
        second.stop()


# 18: titles through several compactions -------------------------------------------------------


def test_titles_count_compactions_within_the_limit(relay: LiveRelay) -> None:
    cid = relay.create(title="Fix the parser")["id"]
    titles = []
    for _ in range(3):
        new = compact(relay, cid)
        titles.append(new["title"])
        cid = new["id"]
    assert titles == [
        "Fix the parser (compacted)",
        "Fix the parser (compacted ×2)",
        "Fix the parser (compacted ×3)",
    ]
    long = relay.create(title="y" * 200)["id"]
    new = compact(relay, long)
    assert new["title"] == "y" * 187 + "… (compacted)"
    # the API takes the title back as it is: within its own 200-character limit
    renamed = relay.http.patch(f"/api/conversations/{new['id']}", json={"title": new["title"]})
    assert renamed.status_code == 200, renamed.text


# 14: the archived conversation's agent process ------------------------------------------------


def test_compact_when_idle_stops_the_old_agent_at_once(start: StartRelay) -> None:
    live = start()
    cid = create_claude(live)
    turn(live, cid, "hello")
    pid = agent_pid(live, cid)
    compact(live, cid)
    wait_until(lambda: not process_alive(pid), "the archived conversation's CLI exited")


def test_compact_during_a_turn_stops_the_old_agent_when_it_ends(
    start: StartRelay, anthropic: FakeAnthropic
) -> None:
    anthropic.long_word_delay = 0.02
    live = start()
    cid = create_claude(live)
    assert live.send(cid, "talk [[LONG:200]]").status_code == 202
    live.wait_for(cid, streaming_words, timeout=TIMEOUT)
    pid = agent_pid(live, cid)
    compact(live, cid)
    assert process_alive(pid)  # SPEC §2: /compact neither waits for nor stops the turn
    old = live.wait_idle(cid, timeout=TIMEOUT)
    assert len(texts(old, "agent")[0].split()) == 200
    wait_until(lambda: not process_alive(pid), "the CLI exited after its last turn")


# 13: Stop while the agent starts -------------------------------------------------------------


def stop_now(live: LiveRelay, cid: int, text: str) -> None:
    """Send a message and press Stop at once, while its agent is still starting."""
    assert live.send(cid, text).status_code == 202
    response = live.http.post(f"/api/conversations/{cid}/interrupt")
    assert (response.status_code, response.json()) == (202, {"interrupted": True})


def test_stop_during_cold_start_sends_nothing(start: StartRelay, anthropic: FakeAnthropic) -> None:
    live = start()
    cid = create_claude(live)
    stop_now(live, cid, "never answered")
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert shape(view) == [("user", "sent", "never answered"), INTERRUPTED]
    assert anthropic.message_bodies() == []

    view = turn(live, cid, "and now?")
    assert shape(view)[2:] == [
        ("user", "sent", "and now?"),
        ("agent", "done", "You said: and now?"),
    ]


def test_stop_during_window_restart_sends_nothing(
    start: StartRelay, anthropic: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live)
    turn(live, cid, "turn 1")
    sent = len(anthropic.message_bodies())
    patched = live.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 100_000})
    assert patched.status_code == 200
    stop_now(live, cid, "turn 2")
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert shape(view)[2:] == [
        ("user", "sent", "turn 2"),
        ("line", "done", "Restarted the session to apply the compaction window (Auto → 100k)"),
        INTERRUPTED,
    ]
    assert len(anthropic.message_bodies()) == sent


def test_stop_during_restart_after_crash_sends_nothing(
    start: StartRelay, anthropic: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live)
    assert live.send(cid, "talk [[LONG:400]]").status_code == 202
    live.wait_for(cid, streaming_words, timeout=TIMEOUT)
    os.kill(agent_pid(live, cid), signal.SIGKILL)  # the next turn restarts the CLI itself
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert view["timeline"][-1]["text"].startswith("The Claude Code process exited unexpectedly")
    sent = len(anthropic.message_bodies())
    stop_now(live, cid, "turn 2")
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert shape(view)[3:] == [("user", "sent", "turn 2"), INTERRUPTED]
    assert len(anthropic.message_bodies()) == sent
    view = turn(live, cid, "turn 3")
    assert shape(view)[5:] == [("user", "sent", "turn 3"), ("agent", "done", "You said: turn 3")]


def test_stop_before_first_message_keeps_the_summary(
    start: StartRelay, anthropic: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live, title="Keep")
    turn(live, cid, "hello")
    new = compact(live, cid)
    summary = new["pending_summary"]
    stop_now(live, new["id"], "stopped")  # the new conversation's CLI is still starting
    view = live.wait_idle(new["id"], timeout=TIMEOUT)
    assert shape(view) == [("user", "sent", "stopped"), INTERRUPTED]
    assert view["pending_summary"] == summary  # never reached the agent: the next one carries it

    view = turn(live, new["id"], "again")
    composed = compose_first_message(summary, "again")
    assert last_message_texts(anthropic.message_bodies()[-1])[-1] == composed
    assert view["pending_summary"] is None


# 15: a database failure in the middle of a turn ------------------------------------------------


def test_database_failure_mid_turn_leaves_error_and_queue_moves(
    start: StartRelay, anthropic: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.supervisor")
    anthropic.long_word_delay = 0.002
    live = start()
    engine = live.app.state.engine
    cid = create_claude(live)
    assert live.send(cid, "talk [[LONG:4000]]").status_code == 202
    assert live.send(cid, "after the failure").json()["state"] == "queued"
    live.wait_for(cid, streaming_words, timeout=TIMEOUT)

    def full(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")  # no room to grow: "disk full"
        cursor.close()

    event.listen(engine, "connect", full)
    engine.dispose()
    try:
        wait_until(
            lambda: "could not close the turn" in caplog.text,
            "the runner logged that the database refused the end of the turn",
        )
        during = live.get(cid)  # reading works meanwhile; nothing queued is lost
        assert [(e["text"], e["state"]) for e in during["timeline"] if e["kind"] == "user"] == [
            ("talk [[LONG:4000]]", "sent"),
            ("after the failure", "queued"),
        ]
    finally:
        event.remove(engine, "connect", full)
        engine.dispose()

    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert [(e["kind"], e["state"]) for e in view["timeline"]] == [
        ("user", "sent"),
        ("agent", "interrupted"),
        ("line", "done"),
        ("user", "sent"),
        ("agent", "done"),
    ]
    error = view["timeline"][2]
    assert error["text"] == (
        "The relay could not store this turn (database or disk is full); the turn was stopped."
    )
    assert error["data"] == {"level": "error"}
    assert shape(view)[3:] == [
        ("user", "sent", "after the failure"),
        ("agent", "done", "You said: after the failure"),
    ]
    assert "database or disk is full" in caplog.text


# 15: a Copilot session that cannot be resumed --------------------------------------------------


@pytest.fixture
def openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def copilot_relay(
    cli: str,
    openai: FakeOpenAI,
    shared_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[LiveRelay]:
    """A relay whose openai conversations run the real Copilot CLI; idle agents stop after 1 s."""
    monkeypatch.setenv("HOME", str(shared_home))
    settings = make_settings(
        tmp_path / "data",
        copilot_cli=cli,
        openai_base_url=openai.base_url,
        openai_api_key="sk-test",
        openai_model="gpt-4.1",
        agent_idle_timeout=1.0,
    )
    with LiveRelay(settings) as live:
        yield live


def copilot_turn_then_idle(live: LiveRelay, shared_home: Path) -> tuple[int, str, Path]:
    """A conversation with one turn whose agent was stopped; its session's state directory."""
    cid = live.create(provider="openai")["id"]
    live.send(cid, "remember pineapple")
    session_id = live.wait_idle(cid, timeout=TIMEOUT)["session_id"]
    pid = agent_pid(live, cid)
    wait_until(lambda: not process_alive(pid), "the idle agent's CLI exited")
    state = shared_home / ".copilot" / "session-state" / session_id
    assert state.is_dir()
    return cid, session_id, state


def test_copilot_resume_of_removed_session_says_so(
    copilot_relay: LiveRelay, shared_home: Path
) -> None:
    live = copilot_relay
    cid, session_id, state = copilot_turn_then_idle(live, shared_home)
    shutil.rmtree(state)

    live.send(cid, "which word?")
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert [(e["kind"], e["text"]) for e in view["timeline"][2:]] == [
        ("user", "which word?"),
        ("line", COPILOT_RESUME_FAILED),
        ("agent", "You said: which word?"),
    ]
    assert view["timeline"][3]["data"] == {"level": "warning", "session_id": session_id}
    assert view["session_id"] != session_id


def test_copilot_resume_failure_keeps_the_session(
    copilot_relay: LiveRelay, openai: FakeOpenAI, shared_home: Path
) -> None:
    live = copilot_relay
    cid, session_id, state = copilot_turn_then_idle(live, shared_home)
    events = state / "events.jsonl"
    aside = state.parent / "events.jsonl.aside"
    events.rename(aside)
    events.mkdir()  # reading the session's events fails: an I/O error, not a missing session

    live.send(cid, "which word?")
    view = live.wait_idle(cid, timeout=TIMEOUT)
    (line,) = view["timeline"][3:]
    assert line["data"] == {"level": "error"}
    assert line["text"].startswith(
        "The agent could not start: Could not resume the Copilot session: "
    )
    assert "Is a directory" in line["text"]
    assert view["session_id"] == session_id  # no new session: its history is kept

    events.rmdir()
    aside.rename(events)
    live.send(cid, "and now?")
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert [(e["kind"], e["text"]) for e in view["timeline"][4:]] == [
        ("user", "and now?"),
        ("agent", "You said: and now?"),
    ]
    assert view["session_id"] == session_id
    assert openai.user_texts_sent()[0] == "remember pineapple"  # resumed with its history
