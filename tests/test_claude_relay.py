"""The relay with the real Claude Code CLI (providers claude and deepseek) against the fake API.

Each test runs a real relay (uvicorn in a thread) whose agent environment comes from
os.environ: HOME is a fresh directory, ANTHROPIC_BASE_URL points at tests/fake_anthropic.py.
Assertions are on what the relay stored (GET /api/conversations/{id}) and what the fake got.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from app import store
from app.agents.claude_code import RESUME_FAILED
from app.agents.common import DENIED
from app.compaction import finished_text
from app.routes.api import MODEL_FIXED
from app.summary import HEADER, SummaryMessage, build_summary, compose_first_message
from app.supervisor.pool import ARCHIVED_WORK_LINE, SHUTDOWN_WORK_LINE
from tests.fake_anthropic import SUMMARY_MARKER, FakeAnthropic, last_user_text, user_texts
from tests.images import png
from tests.relay import LiveRelay, make_settings, receive, receive_until
from tests.test_cluster_races import started_nodes

TIMEOUT = 60  # the longest any wait may take
STDIO_MCP = Path(__file__).parent / "stdio_mcp.py"  # a project's MCP server
MODEL = "claude-opus-5-5"  # the bundled CLI's default model
APPLY_NOTE = "Applies on the next message (the session restarts once)."
COMPACT_WARNING = "The conversation will be compacted on the next message."
StartRelay = Callable[..., LiveRelay]


@pytest.fixture
def start(tmp_path: Path, home: Path) -> Iterator[StartRelay]:
    """Start relays on tmp_path/data (the same settings each time unless told otherwise)."""
    running: list[LiveRelay] = []
    settings: dict[str, Any] = {}

    def start_relay(**overrides: Any) -> LiveRelay:
        if overrides or "default" not in settings:
            settings["default"] = make_settings(tmp_path / "data", **overrides)
        live = LiveRelay(settings["default"]).start()
        running.append(live)
        return live

    yield start_relay
    for live in running:
        if live.thread.is_alive():
            live.stop()


# helpers -----------------------------------------------------------------------------------


def of_kind(view: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [entry for entry in view["timeline"] if entry["kind"] == kind]


def shape(view: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The timeline as (kind, state, text)."""
    return [(e["kind"], e["state"], e["text"]) for e in view["timeline"]]


def create_claude(live: LiveRelay, **body: Any) -> int:
    conversation = live.create(provider="claude", **body)
    assert conversation["provider"] == "claude"
    return int(conversation["id"])


def turn(live: LiveRelay, cid: int, text: str) -> dict[str, Any]:
    """Send a message and wait until the conversation is idle again."""
    response = live.send(cid, text)
    assert response.status_code == 202, response.text
    assert response.json()["text"] == text
    return live.wait_idle(cid, timeout=TIMEOUT)


def streaming_words(view: dict[str, Any], words: int = 3) -> bool:
    """True once an agent entry is streaming with at least that many words."""
    return any(
        e["kind"] == "agent" and e["state"] == "streaming" and len(e["text"].split()) >= words
        for e in view["timeline"]
    )


def context(live: LiveRelay, cid: int) -> dict[str, Any]:
    response = live.http.get(f"/api/conversations/{cid}/context")
    assert response.status_code == 200, response.text
    return response.json()


def wait_context(live: LiveRelay, cid: int, predicate: Any) -> dict[str, Any]:
    """Poll the 🧠 data until predicate holds (the agent's report arrives after the turn)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        data = context(live, cid)
        if predicate(data):
            return data
        if time.monotonic() > deadline:
            raise TimeoutError(f"context never matched: {json.dumps(data)[:2000]}")
        time.sleep(0.05)


def agent_pid(live: LiveRelay, cid: int) -> int:
    pid = live.supervisor.runners[cid].agent.pid
    assert isinstance(pid, int)
    return pid


def is_summary_request(body: dict[str, Any]) -> bool:
    return SUMMARY_MARKER in json.dumps(last_user_message(body))


def last_user_message(body: dict[str, Any]) -> dict[str, Any]:
    """The last user message of a request (the CLI also sends role "system" messages)."""
    return [m for m in body["messages"] if m["role"] == "user"][-1]


def last_message_texts(body: dict[str, Any]) -> list[str]:
    """The text blocks (system reminders removed) of the last user message of a request."""
    return user_texts(last_user_message(body))


# Issue 3: provider claude through the relay ---------------------------------------------------


def test_streamed_reply_reaches_socket_and_usage_is_stored(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    fake.cache_read, fake.cache_creation = 200, 300
    live = start()
    cid = create_claude(live, title="Stream")
    text = "please repeat this rather long sentence back to me"
    expected = f"You said: {text}"
    with live.socket() as ws:
        assert receive(ws)["type"] == "hello"
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
        assert receive(ws)["type"] == "snapshot"
        assert live.send(cid, text).status_code == 202
        seen = receive_until(
            ws,
            lambda m: (
                m["type"] == "entry"
                and m["entry"]["kind"] == "agent"
                and m["entry"]["state"] == "done"
            ),
            timeout=TIMEOUT,
        )
    agent_events = [m for m in seen if m["type"] == "entry" and m["entry"]["kind"] == "agent"]
    entry_id = agent_events[0]["entry"]["id"]
    # Streamed, or (when the whole reply came in one burst) stored once, done, with no deltas.
    assert agent_events[0]["entry"]["state"] in ("streaming", "done")
    assert agent_events[-1]["entry"]["id"] == entry_id
    assert agent_events[-1]["entry"]["text"] == expected
    deltas = [m["text"] for m in seen if m["type"] == "delta" and m["entry_id"] == entry_id]
    if agent_events[0]["entry"]["state"] == "streaming":
        assert len(deltas) >= 3  # the fake streams 20 characters at a time
        assert "".join(deltas) == expected
    else:
        assert deltas == []

    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert shape(view) == [("user", "sent", text), ("agent", "done", expected)]
    agent = view["timeline"][1]
    assert agent["id"] == entry_id
    assert agent["html"] == f"<p>{expected}</p>\n"
    assert set(agent["data"]["result"]) == {"cost_usd", "duration_ms"}
    assert agent["data"]["result"]["cost_usd"] > 0
    # context used = input + cache read + cache creation of the last API reply
    assert view["context_tokens"] == 1000 + 200 + 300
    assert view["model"] == MODEL
    assert view["model_window"] == 1_000_000
    projects = Path(os.environ["HOME"]) / ".claude" / "projects"
    assert len(list(projects.glob(f"*/{view['session_id']}.jsonl"))) == 1
    data = context(live, cid)
    assert (data["used"], data["model"], data["model_window"]) == (1500, MODEL, 1_000_000)
    assert (data["window"], data["source"], data["line"]) == (
        1_000_000,
        "model",
        "1M · model default",
    )
    (request,) = fake.message_bodies()
    assert request["model"] == MODEL
    assert last_user_text(request) == text


def test_bash_tool_call_is_an_activity_entry(start: StartRelay, fake: FakeAnthropic) -> None:
    live = start()
    cid = create_claude(live)
    view = turn(live, cid, "run it [[BASH:echo hi]]")
    assert shape(view) == [
        ("user", "sent", "run it [[BASH:echo hi]]"),
        ("agent", "done", "I will run the command."),
        ("activity", "done", "echo hi"),
        ("agent", "done", "The tool returned: hi"),
    ]
    (activity,) = of_kind(view, "activity")
    assert activity["data"] == {
        "type": "tool",
        "tool": "Bash",
        "tool_id": "toolu_fake_0001",
        "output": "hi",
        "is_error": False,
    }
    results = [
        block
        for block in last_user_message(fake.message_bodies()[-1])["content"]
        if block.get("type") == "tool_result"
    ]
    assert [(r["tool_use_id"], r["content"], r["is_error"]) for r in results] == [
        ("toolu_fake_0001", "hi", False)
    ]


def wait_question(live: LiveRelay, cid: int) -> dict[str, Any]:
    view = live.wait_for(
        cid,
        lambda v: any(
            e["data"].get("type") == "permission" and e["state"] == "pending" for e in v["timeline"]
        ),
        timeout=TIMEOUT,
    )
    (question,) = [e for e in view["timeline"] if e["state"] == "pending"]
    return question


def backgrounded(
    live: LiveRelay, fake: FakeAnthropic, command: str, *then: tuple[str, Any], **body: Any
) -> int:
    """A Claude conversation whose first turn started command as a background shell (then:
    the fake model's next tool calls, for the turn the CLI runs when it ends); its id."""
    cid = create_claude(live, **body)
    shell = {"command": command, "description": "Nap", "run_in_background": True}
    fake.tool_calls.extend([("Bash", shell), *then])
    turn(live, cid, "start it in the background")
    return cid


def test_permission_allow_then_deny(start: StartRelay, fake: FakeAnthropic) -> None:
    live = start()
    cid = create_claude(live)
    work = Path(live.get(cid)["cwd"])

    # Allow: the tool runs.
    assert live.send(cid, "[[BASH:touch created.txt]]").status_code == 202
    question = wait_question(live, cid)
    assert question["kind"] == "activity"
    assert question["text"] == "Bash wants permission"
    assert question["data"] == {
        "type": "permission",
        "tool": "Bash",
        "input": {"command": "touch created.txt", "description": "Run the requested command"},
        "tool_id": "toolu_fake_0001",
    }
    answer = live.http.post(
        f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": True}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "allowed"
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert (work / "created.txt").is_file()
    entries = {e["id"]: e for e in view["timeline"]}
    assert entries[question["id"]]["state"] == "allowed"
    tools = [e for e in of_kind(view, "activity") if e["data"]["type"] == "tool"]
    assert [(t["state"], t["text"], t["data"]["is_error"]) for t in tools] == [
        ("done", "touch created.txt", False)
    ]
    again = live.http.post(
        f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": False}
    )
    assert again.status_code == 409

    # Deny: the tool is refused with the relay's message.
    assert live.send(cid, "[[BASH:touch denied.txt]]").status_code == 202
    question = wait_question(live, cid)
    assert question["data"]["input"]["command"] == "touch denied.txt"
    answer = live.http.post(
        f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": False}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "denied"
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert not (work / "denied.txt").exists()
    entries = {e["id"]: e for e in view["timeline"]}
    assert entries[question["id"]]["state"] == "denied"
    tools = [e for e in of_kind(view, "activity") if e["data"]["type"] == "tool"]
    assert [(t["state"], t["text"], t["data"]["is_error"]) for t in tools] == [
        ("done", "touch created.txt", False),
        ("error", "touch denied.txt", True),
    ]
    assert DENIED in tools[1]["data"]["output"]
    assert DENIED in json.dumps(last_user_message(fake.message_bodies()[-1]))
    assert of_kind(view, "line") == []


def test_a_permission_mode_changed_reaches_the_live_agent(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Found by a hostile review: a conversation's mode changed from acceptEdits to default
    # said "default", yet its live CLI went on writing files without asking.
    live = start()
    cid = create_claude(live, permission_mode="acceptEdits")
    work = Path(live.get(cid)["cwd"])
    turn(live, cid, "[[WRITE:one.txt|1]]")  # accepted without a question
    assert (work / "one.txt").read_text() == "1"
    pid = agent_pid(live, cid)
    changed = live.http.patch(f"/api/conversations/{cid}", json={"permission_mode": "default"})
    assert changed.status_code == 200, changed.text
    assert changed.json()["permission_mode"] == "default"
    assert live.send(cid, "[[WRITE:two.txt|2]]").status_code == 202
    question = wait_question(live, cid)  # asked now
    assert question["data"]["tool"] == "Write"
    answer = live.http.post(
        f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": False}
    )
    assert answer.status_code == 200, answer.text
    live.wait_idle(cid, timeout=TIMEOUT)
    assert not (work / "two.txt").exists()
    assert agent_pid(live, cid) == pid  # switched in place, not restarted
    # And back: accepted again without a question.
    changed = live.http.patch(f"/api/conversations/{cid}", json={"permission_mode": "acceptEdits"})
    assert changed.status_code == 200, changed.text
    view = turn(live, cid, "[[WRITE:three.txt|3]]")
    assert (work / "three.txt").read_text() == "3"
    asked = [e["id"] for e in view["timeline"] if e["data"].get("type") == "permission"]
    assert asked == [question["id"]]  # the one question, of the default mode's turn


def test_an_approved_plan_leaves_plan_mode_in_the_conversation_too(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Claude Code leaves plan mode when its plan is approved (to the mode before it, or
    # default). The conversation said "plan" still, and the next start resumed in plan mode.
    live = start()
    cid = create_claude(live, permission_mode="plan")
    work = Path(live.get(cid)["cwd"])
    fake.tool_calls.append(("ExitPlanMode", {"plan": "1. Write one.txt"}))
    with live.socket() as ws:
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
        assert live.send(cid, "make a plan").status_code == 202
        question = wait_question(live, cid)
        assert question["data"]["tool"] == "ExitPlanMode"
        answer = live.http.post(
            f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": True}
        )
        assert answer.status_code == 200, answer.text
        told = receive_until(
            ws,
            lambda m: (
                m["type"] == "conversation" and m["conversation"]["permission_mode"] != "plan"
            ),
            timeout=TIMEOUT,
        )
    assert told[-1]["conversation"]["permission_mode"] == "default"
    live.wait_idle(cid, timeout=TIMEOUT)
    assert live.get(cid)["permission_mode"] == "default"
    # As the CLI now is: a write is asked about (in plan mode it would be refused).
    assert live.send(cid, "[[WRITE:one.txt|1]]").status_code == 202
    assert wait_question(live, cid)["data"]["tool"] == "Write"
    # A mode the relay switched to itself is not undone by the CLI's echo of it.
    changed = live.http.patch(f"/api/conversations/{cid}", json={"permission_mode": "acceptEdits"})
    assert changed.status_code == 200, changed.text
    question = wait_question(live, cid)
    live.http.post(f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": True})
    live.wait_idle(cid, timeout=TIMEOUT)
    assert (work / "one.txt").read_text() == "1"
    assert live.get(cid)["permission_mode"] == "acceptEdits"


def test_the_echoes_of_the_relay_s_own_mode_switches_change_nothing(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Between turns the CLI's echo of each switch waits for the next turn. Taken for the
    # agent's own changes, the first (acceptEdits) set the conversation back to it there,
    # until the second (plan) came: every tab saw the mode flip.
    live = start()
    cid = create_claude(live)
    turn(live, cid, "hello")  # a live agent, idle
    with live.socket() as ws:
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
        for mode in ("acceptEdits", "plan"):
            changed = live.http.patch(f"/api/conversations/{cid}", json={"permission_mode": mode})
            assert changed.status_code == 200, changed.text
        assert live.send(cid, "after").status_code == 202
        seen = receive_until(
            ws, lambda m: m["type"] == "turn" and m["turn"]["state"] == "idle" and m["seq"] > 1
        )
    modes = [m["conversation"]["permission_mode"] for m in seen if m["type"] == "conversation"]
    assert modes[modes.index("plan") :] == ["plan"] * len(modes[modes.index("plan") :]), modes
    assert live.get(cid)["permission_mode"] == "plan"


def requested_models(fake: FakeAnthropic) -> list[str]:
    """The model of each Messages request, in order."""
    return [str(body.get("model")) for body in fake.message_bodies()]


def test_a_chosen_model_is_used_from_the_next_request_and_by_the_next_conversation(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live)
    demo = live.create()["id"]
    answers = [
        live.http.patch(f"/api/conversations/{cid}", json={"chosen_model": name})
        for name in ("opus; rm -rf /", "--dangerously-skip-permissions", "x" * 101)
    ] + [live.http.patch(f"/api/conversations/{demo}", json={"chosen_model": "sonnet"})]
    assert [r.status_code for r in answers] == [422, 422, 422, 409]
    assert answers[3].json()["detail"] == MODEL_FIXED

    turn(live, cid, "hello")
    default = requested_models(fake)[-1]
    pid = agent_pid(live, cid)
    changed = live.http.patch(f"/api/conversations/{cid}", json={"chosen_model": "haiku"})
    assert (changed.status_code, changed.json()["chosen_model"]) == (200, "haiku")
    turn(live, cid, "again")
    used = requested_models(fake)[-1]
    assert ("haiku" in used, "haiku" in default) == (True, False), (default, used)
    assert agent_pid(live, cid) == pid  # switched in place: the session goes on
    # /compact carries the choice on; the new conversation's agent starts with it.
    new = live.send(cid, "/compact").json()["compacted_into"]
    assert new["chosen_model"] == "haiku"
    turn(live, new["id"], "in the new one")
    assert "haiku" in requested_models(fake)[-1]
    back = live.http.patch(f"/api/conversations/{new['id']}", json={"chosen_model": ""})
    assert (back.status_code, back.json()["chosen_model"]) == (200, None)
    turn(live, new["id"], "default again")
    assert requested_models(fake)[-1] == default


def test_a_model_claude_code_will_not_take_is_refused_and_put_back(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Found by a review: the PATCH answered 500 with the name stored, and every turn after it
    # failed with "The agent could not start" although the agent ran on.
    live = start()
    cid = create_claude(live)
    turn(live, cid, "hello")
    # Claude Code checks a name that is not an alias with a one-token request: the API's 404.
    refused = live.http.patch(f"/api/conversations/{cid}", json={"chosen_model": "no-such-model"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"].startswith(
        "Claude Code did not take the model “no-such-model”: "
    )
    assert live.get(cid)["chosen_model"] is None
    view = turn(live, cid, "still here?")
    assert shape(view)[-1] == ("agent", "done", "You said: still here?")
    assert of_kind(view, "line") == []


def plan_question(live: LiveRelay, fake: FakeAnthropic, cid: int, plan: str) -> dict[str, Any]:
    """Have the agent ask for its plan's approval (ExitPlanMode); the question."""
    fake.tool_calls.append(("ExitPlanMode", {"plan": plan}))
    assert live.send(cid, "make a plan").status_code == 202
    question = wait_question(live, cid)
    assert question["data"]["tool"] == "ExitPlanMode"
    return question


def test_a_plan_is_approved_into_the_mode_chosen_or_kept_in_planning(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live, permission_mode="plan")
    work = Path(live.get(cid)["cwd"])
    question = plan_question(live, fake, cid, "1. Write one.txt\n2. Check it")
    assert question["data"]["input"]["plan"] == "1. Write one.txt\n2. Check it"  # the plan file's
    url = f"/api/conversations/{cid}/permissions/{question['id']}"
    refused = [
        live.http.post(url, json={"allow": False, "mode": "acceptEdits"}),
        live.http.post(url, json={"allow": True, "mode": "plan"}),
        live.http.post(url, json={"allow": True, "mode": "bogus"}),
    ]
    assert [r.status_code for r in refused] == [400, 400, 422]
    assert [r.json()["detail"] for r in refused[:2]] == [
        "A plan kept in planning takes no mode.",
        "An approved plan goes on in mode default or acceptEdits.",
    ]
    kept = live.http.post(url, json={"allow": False, "message": "Keep planning: add tests."})
    assert (kept.status_code, kept.json()["state"]) == (200, "denied")
    live.wait_idle(cid, timeout=TIMEOUT)
    assert live.get(cid)["permission_mode"] == "plan"
    assert "Keep planning: add tests." in json.dumps(fake.message_bodies()[-1]["messages"][-1])

    question = plan_question(live, fake, cid, "1. Write one.txt")
    url = f"/api/conversations/{cid}/permissions/{question['id']}"
    approved = live.http.post(url, json={"allow": True, "mode": "acceptEdits"})
    assert (approved.status_code, approved.json()["data"]["approved_mode"]) == (200, "acceptEdits")
    live.wait_idle(cid, timeout=TIMEOUT)
    assert live.get(cid)["permission_mode"] == "acceptEdits"
    view = turn(live, cid, "[[WRITE:one.txt|1]]")  # accepted without a question
    assert (work / "one.txt").read_text() == "1"
    assert [e for e in view["timeline"] if e["state"] == "pending"] == []

    # Back in plan mode from acceptEdits, approved as "ask before edits": default, not the
    # mode it was in before planning.
    changed = live.http.patch(f"/api/conversations/{cid}", json={"permission_mode": "plan"})
    assert changed.status_code == 200, changed.text
    question = plan_question(live, fake, cid, "1. Write two.txt")
    url = f"/api/conversations/{cid}/permissions/{question['id']}"
    assert live.http.post(url, json={"allow": True, "mode": "default"}).status_code == 200
    live.wait_idle(cid, timeout=TIMEOUT)
    assert live.get(cid)["permission_mode"] == "default"
    assert live.send(cid, "[[WRITE:two.txt|2]]").status_code == 202
    assert wait_question(live, cid)["data"]["tool"] == "Write"  # asked, as in default
    write = wait_question(live, cid)
    other = live.http.post(
        f"/api/conversations/{cid}/permissions/{write['id']}",
        json={"allow": True, "mode": "default"},
    )
    assert (other.status_code, other.json()["detail"]) == (
        400,
        "Only the approval of a plan (ExitPlanMode) takes a mode.",
    )


def test_the_agent_s_own_turn_after_a_background_task_is_shown_as_it_comes(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # When a background shell ends between turns, the CLI tells the model and runs a turn of
    # its own. Found by a hostile review: unread, its result ended the next message's turn and
    # every reply after it came one message late. Then it was read but shown only with the
    # user's next message: a user waiting for the task's outcome saw nothing.
    live = start()
    cid = create_claude(live)
    command = "sleep 2; echo bg-done"
    tool = {"command": command, "description": "Wait", "run_in_background": True}
    fake.tool_calls.append(("Bash", tool))
    with live.socket() as ws:
        assert receive(ws)["type"] == "hello"
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
        assert receive(ws)["type"] == "snapshot"
        assert live.send(cid, "start it in the background").status_code == 202
        receive_until(  # (sleep and echo need no permission)
            ws, lambda m: m["type"] == "turn" and m["turn"]["state"] == "idle", timeout=TIMEOUT
        )
        asked = len(fake.message_bodies())
        # Nothing sent: the task's end, then the agent's own turn, come to the tab as they do.
        seen = receive_until(
            ws, lambda m: m["type"] == "turn" and m["turn"]["state"] == "idle", timeout=TIMEOUT
        )
    assert len(fake.message_bodies()) == asked + 1  # the model was told of the task's end
    states = [m["turn"]["state"] for m in seen if m["type"] == "turn"]
    assert states[0] == "running"
    entries = [m["entry"] for m in seen if m["type"] == "entry"]
    line = next(e for e in entries if e["kind"] == "line")
    assert line["text"] == 'Background command "Wait" completed (exit code 0)'
    assert line["data"] == {"level": "info", "type": "task", "status": "completed"}
    reply = [e for e in entries if e["kind"] == "agent"][-1]
    assert (reply["state"], reply["text"]) == ("done", "You said: ")  # (the fake quotes none)
    assert reply["data"]["result"]["cost_usd"] > 0  # its own cost, on its reply
    view = live.get(cid)
    kinds = [e["kind"] for e in view["timeline"]]
    assert kinds.count("user") == 1 and kinds[-2:] == ["line", "agent"], kinds
    assert view["turn"] == {"state": "idle", "queued": 0}
    agent = live.supervisor.runners[cid].agent
    assert agent is not None and not agent.background_work()
    for word in ("APPLE", "BANANA"):  # and no reply is shifted
        view = turn(live, cid, word)
        assert of_kind(view, "user")[-1]["text"] == word
        asked = next(i for i, e in enumerate(view["timeline"]) if e["text"] == word)
        replies = [e["text"] for e in view["timeline"][asked + 1 :] if e["kind"] == "agent"]
        assert replies == [f"You said: {word}"], replies


def test_the_agent_s_own_turn_asks_queues_a_message_and_stops_on_stop(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # The own turn runs as any turn does: its permission question shows at once, a message
    # sent meanwhile waits for it, Stop stops it.
    live = start()
    cid = backgrounded(live, fake, "sleep 1", ("Bash", {"command": "touch own.txt"}))
    work = Path(live.get(cid)["cwd"])
    question = wait_question(live, cid)  # asked by the own turn
    assert question["data"]["input"]["command"] == "touch own.txt"
    assert live.get(cid)["turn"] == {"state": "running", "queued": 0}
    assert live.send(cid, "APPLE").status_code == 202
    assert live.get(cid)["turn"] == {"state": "running", "queued": 1}
    response = live.http.post(f"/api/conversations/{cid}/interrupt")
    assert (response.status_code, response.json()) == (202, {"interrupted": True})
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert not (work / "own.txt").exists()
    texts = [e["text"] for e in view["timeline"]]
    stopped = texts.index("Interrupted by the user.")
    assert texts.index("touch own.txt") < stopped < texts.index("APPLE")
    assert texts[-1] == "You said: APPLE"


def test_the_agent_s_own_turn_stops_on_a_stop_taken_by_another_node(
    tmp_path: Path, home: Path, fake: FakeAnthropic
) -> None:
    # Several nodes: y runs the agent and its own turn; the Stop is pressed in a tab on x,
    # which knows the turn only from the database (the last message's turn id).
    (tmp_path / "x" / "work").mkdir(parents=True)
    with started_nodes(tmp_path, 10.0) as (x, y):
        cid = backgrounded(y, fake, "sleep 1", ("Bash", {"command": "touch own.txt"}))
        assert cid in y.supervisor.cluster.held
        question = wait_question(y, cid)  # asked by the own turn, on y
        assert question["data"]["input"]["command"] == "touch own.txt"
        assert x.get(cid)["turn"]["state"] == "running"
        response = x.http.post(f"/api/conversations/{cid}/interrupt")
        assert (response.status_code, response.json()) == (202, {"interrupted": True})
        view = y.wait_idle(cid, timeout=TIMEOUT)
        assert not (tmp_path / "x" / "work" / "own.txt").exists()
        texts = [e["text"] for e in view["timeline"]]
        assert texts.index("touch own.txt") < texts.index("Interrupted by the user.")
        expired = [e for e in view["timeline"] if e["id"] == question["id"]]
        assert [(e["state"], e["data"]["expired"]) for e in expired] == [
            ("expired", "the turn was stopped")
        ]
        assert x.get(cid)["turn"] == {"state": "idle", "queued": 0}


@pytest.mark.parametrize("action", ["archive", "delete"])
def test_archiving_or_deleting_stops_the_agent_with_its_background_work(
    start: StartRelay, fake: FakeAnthropic, action: str
) -> None:
    # Found by a hostile review: archived (or deleted) while a background shell ran, the
    # conversation's agent lived on; when the shell ended it ran a turn of its own, unshown,
    # and wrote a file (a delete waited 4 s for it).
    live = start()
    work = Path(live.settings.default_cwd)
    write = ("Write", {"file_path": str(work / "after.txt"), "content": "x"})
    cid = backgrounded(live, fake, "sleep 3", write, permission_mode="acceptEdits")
    assert live.get(cid)["cwd"] == str(work)
    agent = live.supervisor.runners[cid].agent
    assert agent is not None and agent.background_work()
    asked = len(fake.message_bodies())
    if action == "archive":
        assert live.http.post(f"/api/conversations/{cid}/archive").status_code == 200
    else:
        assert live.http.delete(f"/api/conversations/{cid}").status_code == 204
    deadline = time.monotonic() + TIMEOUT
    while agent.is_alive():
        assert time.monotonic() < deadline, "the agent outlived its conversation"
        time.sleep(0.1)
    time.sleep(4)  # past the shell's end
    assert len(fake.message_bodies()) == asked  # no turn of its own
    assert not (work / "after.txt").exists()
    if action == "archive":
        view = live.get(cid)
        assert view["agent"] == "asleep"
        (line,) = of_kind(view, "line")  # (said: the shell ended with it)
        assert (line["text"], line["data"]["level"]) == (ARCHIVED_WORK_LINE, "warning")


def test_a_relay_stop_says_the_agent_s_background_work_ended(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Found by a hostile review: a restart killed a running background shell without a word;
    # the user, waiting for its end, learnt of it only from the CLI after another message.
    live = start()
    cid = backgrounded(live, fake, "sleep 30")
    assert live.supervisor.runners[cid].agent.background_work()
    live.stop()
    live = start()
    (line,) = of_kind(live.get(cid), "line")
    assert (line["text"], line["data"]["level"]) == (SHUTDOWN_WORK_LINE, "warning")


def test_a_project_mcp_server_named_like_the_relay_s_is_asked_about(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Found by a security review: a repository's MCP server named "oarlock__tools" gave tool
    # names beginning "mcp__oarlock__", which the relay allowed without a question.
    live = start()
    work = live.settings.cwd_default
    work.mkdir(parents=True, exist_ok=True)
    server = {"type": "stdio", "command": sys.executable, "args": [str(STDIO_MCP)]}
    (work / ".mcp.json").write_text(json.dumps({"mcpServers": {"oarlock__tools": server}}))
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.json").write_text('{"enableAllProjectMcpServers": true}')
    cid = create_claude(live, trust_project=True)  # (its folder's own server: trusted)
    target = work / "touched.txt"
    fake.tool_calls.append(("mcp__oarlock__tools__run", {"path": str(target)}))
    assert live.send(cid, "hello").status_code == 202
    question = wait_question(live, cid)
    assert question["data"]["tool"] == "mcp__oarlock__tools__run"
    url = f"/api/conversations/{cid}/permissions/{question['id']}"
    assert live.http.post(url, json={"allow": False}).status_code == 200
    live.wait_idle(cid, timeout=TIMEOUT)
    assert not target.exists()


def test_a_folder_s_own_settings_act_only_once_the_user_trusts_them(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # Found by a security review: a repository's .claude/settings.json ran its hooks and
    # sent the API key where its "env" said, at the first message, without a question (in a
    # terminal, Claude Code first asks whether to trust the folder).
    live = start()
    repo = tmp_path / "data" / "repo"
    (repo / ".claude").mkdir(parents=True)
    ran = tmp_path / "hook-ran"
    hook = {"hooks": [{"type": "command", "command": f"touch {ran}"}]}
    settings = {"hooks": {"UserPromptSubmit": [hook]}}
    (repo / ".claude" / "settings.json").write_text(json.dumps(settings))
    turn(live, created_once_trusted(live, repo, ".claude/settings.json"), "hello")
    assert ran.exists()  # trusted: its hook runs, as in Claude Code


def created_once_trusted(live: LiveRelay, cwd: Path, found: str) -> int:
    """A Claude Code conversation in cwd: refused (409 naming found, nothing made), then
    created once trusted; its id."""
    body = {"provider": "claude", "cwd": str(cwd)}
    refused = live.http.post("/api/conversations", json=body)
    assert refused.status_code == 409
    assert refused.json()["detail"].startswith(
        f"This folder has Claude Code settings ({found}) that can run commands"
    )
    assert live.http.get("/api/conversations").json()["conversations"] == []  # nothing made
    created = live.http.post("/api/conversations", json=body | {"trust_project": True})
    assert created.status_code == 201, created.text
    return int(created.json()["id"])


def answered_once(live: LiveRelay) -> tuple[int, Path]:
    """A Claude Code conversation in the default folder, its agent live after one turn; its
    id and folder."""
    cid = create_claude(live)
    turn(live, cid, "hello")
    return cid, Path(live.get(cid)["cwd"])


def marking_server(folder: Path, tmp_path: Path, name: str) -> Path:
    """A .mcp.json in folder whose one server's command touches a file: that file."""
    ran = tmp_path / "server-ran"
    server = {"command": "sh", "args": ["-c", f"touch {ran}"]}
    (folder / ".mcp.json").write_text(json.dumps({"mcpServers": {name: server}}))
    return ran


def test_a_mcp_json_above_the_folder_is_asked_about_too(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # Found by a security review: Claude Code starts the servers of a .mcp.json in any folder
    # above its working directory; the relay asked only about the folder's own, so a
    # repository's .mcp.json ran its command for a conversation in one of its subfolders.
    live = start()
    repo = tmp_path / "data" / "repo"
    work = repo / "src"
    work.mkdir(parents=True)
    ran = marking_server(repo, tmp_path, "repo")
    turn(live, created_once_trusted(live, work, "../.mcp.json"), "hello")
    assert ran.exists()  # trusted: Claude Code starts it from the folder above, as it did


SKILL_WITH_HOOK = """---
name: helper
description: Use this skill first.
hooks:
  Stop:
    - hooks:
        - type: command
          command: touch {ran}
---
Answer the user.
"""


def test_a_folder_s_skills_are_asked_about_for_the_hooks_they_carry(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # Seen with the real CLI in session 45: a project skill's front matter hooks (Stop,
    # PreToolUse) ran their commands once the model used the skill, which the relay's card
    # showed only as "Skill wants permission" ({"skill": "helper"}).
    live = start()
    repo = tmp_path / "data" / "repo"
    skill = repo / ".claude" / "skills" / "helper"
    skill.mkdir(parents=True)
    ran = tmp_path / "hook-ran"
    (skill / "SKILL.md").write_text(SKILL_WITH_HOOK.format(ran=ran))
    cid = created_once_trusted(live, repo, ".claude/skills")
    fake.tool_calls.append(("Skill", {"skill": "helper"}))
    assert live.send(cid, "do it").status_code == 202
    question = wait_question(live, cid)
    url = f"/api/conversations/{cid}/permissions/{question['id']}"
    assert live.http.post(url, json={"allow": True}).status_code == 200
    live.wait_idle(cid, timeout=TIMEOUT)
    assert ran.exists()  # trusted: the skill's hook runs, as in Claude Code


def test_settings_that_appear_after_the_question_are_asked_about_at_the_next_start(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # Found by session 44's note: the relay asked only when the conversation was created; a
    # .mcp.json that came later (a git pull) ran its command at the agent's next start.
    live = start()
    cid, work = answered_once(live)
    ran = marking_server(work, tmp_path, "pulled")
    live.stop()  # the agent's next start: after a restart (or its sleep)
    live = start()
    asked = len(fake.message_bodies())
    turn(live, cid, "again")
    line = of_kind(live.get(cid), "line")[-1]
    assert line["text"].startswith(
        "The agent could not start: Claude Code settings appeared in this folder since it was"
        " trusted (.mcp.json)."
    )
    assert (line["data"]["level"], line["data"]["trust"]) == ("error", [".mcp.json"])
    assert not ran.exists() and len(fake.message_bodies()) == asked  # nothing started
    trust = f"/api/conversations/{cid}/lines/{line['id']}/trust"
    trusted = live.http.post(trust)
    assert trusted.status_code == 202, trusted.text
    assert trusted.json()["message"]["text"] == "again"  # sent again, as a new message
    live.wait_idle(cid, timeout=TIMEOUT)
    assert ran.exists()  # trusted: Claude Code starts it
    assert fake.user_texts_sent()[-1] == "again" and len(fake.message_bodies()) > asked
    assert live.http.post(trust).status_code == 409  # once
    (*_, again, resent) = of_kind(live.get(cid), "user")
    assert (again["data"]["resent"], resent["data"]["resent_from"]) == (True, again["id"])
    live.stop()
    live = start()  # trusted for good: the next start asks nothing
    turn(live, cid, "later")
    assert of_kind(live.get(cid), "line")[-1]["id"] == line["id"]


def test_a_trust_line_the_database_refused_is_written_later_with_its_button(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # A line the database refuses is kept and written before the next look at the queue; it
    # was kept as text alone, so the refused start's line came back without the files it names
    # (data.trust): no Trust and resend button, and the route answered 404.
    live = start()
    cid = create_claude(live)  # its folder had no settings then
    ran = marking_server(Path(live.get(cid)["cwd"]), tmp_path, "pulled")
    refused: list[str] = []

    def refuse(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        line = statement.startswith("INSERT INTO entry") and "could not start" in str(parameters)
        if line and not refused:  # the first time only
            refused.append(statement)
            raise RuntimeError("injected: the database refused the line")

    engine = live.supervisor.engine
    event.listen(engine, "before_cursor_execute", refuse)
    try:
        assert live.send(cid, "hello").status_code == 202
        live.wait_idle(cid, timeout=TIMEOUT)
    finally:
        event.remove(engine, "before_cursor_execute", refuse)
    assert refused  # the first write failed; the line is there all the same
    (line,) = trust_lines(live, cid)
    assert line["data"]["trust"] == [".mcp.json"]
    trusted = live.http.post(f"/api/conversations/{cid}/lines/{line['id']}/trust")
    assert trusted.status_code == 202, trusted.text
    live.wait_idle(cid, timeout=TIMEOUT)
    assert ran.exists() and fake.user_texts_sent()[-1] == "hello"


def hook_settings(folder: Path, name: str, ran: Path) -> None:
    """A project settings file (folder/.claude/name) whose UserPromptSubmit hook touches ran."""
    hook = {"hooks": [{"type": "command", "command": f"touch {ran}"}]}
    (folder / ".claude").mkdir(exist_ok=True)
    (folder / ".claude" / name).write_text(json.dumps({"hooks": {"UserPromptSubmit": [hook]}}))


def trust_lines(live: LiveRelay, cid: int) -> list[dict[str, Any]]:
    return trust_lines_of(live.get(cid))


def trust_lines_of(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [line for line in of_kind(view, "line") if "trust" in line["data"]]


def test_settings_written_while_the_agent_lives_stop_it_before_they_act(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # Found by a security review: a live Claude Code CLI reads its settings files again when
    # they change, so a hook written between two turns (a git pull) ran at the next message,
    # in the same process, with nobody asked: the check at the agent's start never saw it.
    live = start()
    cid, work = answered_once(live)
    ran = tmp_path / "hook-ran"
    hook_settings(work, "settings.json", ran)
    turn(live, cid, "at once")  # (before the watch's next look, or after it: either stops it)
    assert not ran.exists()
    refused = trust_lines(live, cid)[-1]  # the message's start, refused
    assert refused["text"].startswith("The agent could not start: Claude Code settings appeared")
    assert refused["data"]["trust"] == [".claude/settings.json"]
    trust = f"/api/conversations/{cid}/lines/{refused['id']}/trust"
    assert live.http.post(trust).json()["message"]["text"] == "at once"
    live.wait_idle(cid, timeout=TIMEOUT)
    assert ran.exists()  # trusted: its hook runs
    # Between turns, the watch stops the live agent by itself, and its line only trusts.
    ran.unlink()
    hook_settings(work, "settings.local.json", ran)
    deadline = time.monotonic() + TIMEOUT
    while len(trust_lines(live, cid)) < 2:
        assert time.monotonic() < deadline, "the live agent's new settings were not seen"
        time.sleep(0.1)
    stopped = trust_lines(live, cid)[-1]
    assert stopped["text"].startswith("Claude Code settings appeared in this folder since it")
    assert "while it runs, so it was stopped" in stopped["text"]
    assert (stopped["data"]["trust"], stopped["data"]["again"]) == (
        [".claude/settings.local.json"],
        False,
    )
    assert live.get(cid)["agent"] == "asleep" and not ran.exists()
    asked = len(fake.message_bodies())
    trusted = live.http.post(f"/api/conversations/{cid}/lines/{stopped['id']}/trust")
    assert trusted.status_code == 202 and trusted.json() == {"message": None}  # nothing resent
    assert len(fake.message_bodies()) == asked
    turn(live, cid, "later")
    assert ran.exists() and len(trust_lines(live, cid)) == 2


def test_settings_written_during_a_running_turn_stop_it_with_its_agent(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # README and docs/security.md: the watch stops the agent "a running turn with it" (the
    # tests above wrote the settings between turns only).
    live = start()
    cid, work = answered_once(live)
    pid = agent_pid(live, cid)
    assert live.send(cid, "talk [[LONG:2000]]").status_code == 202  # ~100 s of words
    live.wait_for(cid, streaming_words, timeout=TIMEOUT)
    ran = tmp_path / "hook-ran"
    hook_settings(work, "settings.json", ran)
    # The turn ends long before its reply would, with the watch's line, not "Interrupted by
    # the user." (the line a closed agent's turn gave before).
    live.wait_for(cid, trust_lines_of, timeout=TIMEOUT)
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert [(e["kind"], e["state"]) for e in view["timeline"][-3:]] == [
        ("user", "sent"),
        ("agent", "interrupted"),
        ("line", "done"),
    ]
    stopped = view["timeline"][-1]
    assert "while it runs, so it was stopped" in stopped["text"]
    assert (stopped["data"]["trust"], stopped["data"]["again"]) == (
        [".claude/settings.json"],
        False,
    )
    assert len(of_kind(view, "agent")[-1]["text"].split()) < 2000
    assert view["agent"] == "asleep" and not process_alive(pid) and not ran.exists()


def test_a_folder_claude_code_trusts_keeps_its_live_agent_when_settings_appear(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path, home: Path
) -> None:
    # Claude Code's own record of the folder's trust (its terminal question) covers files
    # that appear later too: the watch leaves the live agent running, and its hook acts.
    live = start()
    # Written before the CLI starts: it rewrites this file as it runs (a CI run saw the
    # record written mid-conversation gone, and the agent stopped).
    accepted = {"projects": {str(live.settings.cwd_default): {"hasTrustDialogAccepted": True}}}
    (home / ".claude.json").write_text(json.dumps(accepted))
    cid, work = answered_once(live)
    assert str(work) == str(live.settings.cwd_default)
    assert json.loads((home / ".claude.json").read_text())["projects"][str(work)][
        "hasTrustDialogAccepted"
    ]
    agent = live.supervisor.runners[cid].agent
    ran = tmp_path / "hook-ran"
    hook_settings(work, "settings.json", ran)
    time.sleep(2.5)  # past two of the watch's looks
    assert live.supervisor.runners[cid].agent is agent and not trust_lines(live, cid)
    turn(live, cid, "again")
    assert ran.exists() and live.supervisor.runners[cid].agent is agent


def test_a_git_repository_s_local_settings_act_in_its_subfolders_and_are_asked_about(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # Found by a security review: Claude Code loads the .claude/settings.local.json of the git
    # repository a subfolder is in; a conversation in repo/src was created without a question
    # and that file's hook ran at its first message.
    live = start()
    repo = tmp_path / "data" / "repo"
    work = repo / "src" / "deep"
    work.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    ran = tmp_path / "hook-ran"
    hook_settings(repo, "settings.local.json", ran)
    turn(live, created_once_trusted(live, work, "../../.claude/settings.local.json"), "hello")
    assert ran.exists()  # trusted: its hook runs, as Claude Code runs it there


def test_a_conversation_made_before_the_record_trusts_what_its_folder_has(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # Conversations created before migration 0015 have no record (NULL): they were asked at
    # creation, so their next start records what it finds and asks nothing.
    live = start()
    cid = create_claude(live)
    ran = marking_server(Path(live.get(cid)["cwd"]), tmp_path, "old")
    with live.supervisor.session() as session:
        session.execute(text("UPDATE conversation SET trusted_settings = NULL"))
        session.commit()
    turn(live, cid, "hello")
    assert ran.exists() and not of_kind(live.get(cid), "line")
    with live.supervisor.session() as session:
        conversation = store.get_conversation(session=session, conversation_id=cid)
        assert conversation is not None and conversation.trusted_settings == [".mcp.json"]


def subagent_asking(live: LiveRelay, fake: FakeAnthropic) -> tuple[int, dict[str, Any]]:
    """A Claude conversation whose background subagent asks to run `touch sub.txt`, its main
    turn over: its id and the question."""
    cid = create_claude(live)
    task = {"description": "sub task", "prompt": "[[BASH:touch sub.txt]]"}
    fake.tool_calls.append(("Agent", task | {"subagent_type": "general-purpose"}))
    assert live.send(cid, "have a subagent do it").status_code == 202
    question = wait_question(live, cid)
    assert question["data"]["input"]["command"] == "touch sub.txt"
    live.wait_idle(cid, timeout=TIMEOUT)  # the main turn is over; the question waits
    return cid, question


def test_a_subagent_s_question_outlives_the_turn_that_started_it(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Found by a hostile review: a subagent (which this CLI runs in the background) asking
    # before the main turn ended had its question denied by that end ("The turn ended."):
    # whether it could work was a race against the main agent's last reply.
    live = start()
    cid, question = subagent_asking(live, fake)
    work = Path(live.get(cid)["cwd"])
    view = live.get(cid)
    assert {e["id"]: e["state"] for e in view["timeline"]}[question["id"]] == "pending"
    answer = live.http.post(
        f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": True}
    )
    assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + TIMEOUT
    while not (work / "sub.txt").exists():
        assert time.monotonic() < deadline, "the subagent's allowed command never ran"
        time.sleep(0.1)


def test_a_subagent_s_question_ends_with_its_agent(start: StartRelay, fake: FakeAnthropic) -> None:
    # Found by a hostile review: archived while a background subagent's question waited, the
    # conversation said "needs you" until the relay restarted (its agent was gone).
    live = start()
    cid, question = subagent_asking(live, fake)
    assert live.get(cid)["questions"] == 1
    assert live.http.post(f"/api/conversations/{cid}/archive").status_code == 200
    view = live.wait_for(cid, lambda v: v["questions"] == 0, timeout=TIMEOUT)  # (stopped soon)
    expired = {e["id"]: e for e in view["timeline"]}[question["id"]]
    assert (expired["state"], expired["data"]["expired"]) == ("expired", "the agent was stopped")
    late = live.http.post(
        f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": True}
    )
    assert late.status_code == 409


QUESTIONS = {
    "questions": [
        {
            "question": "Which database should I use?",
            "header": "Database",
            "options": [
                {"label": "PostgreSQL", "description": "Relational, server"},
                {"label": "SQLite", "description": "One file"},
            ],
            "multiSelect": False,
        },
        {
            "question": "Which tests should I write?",
            "header": "Tests",
            "options": [
                {"label": "Unit", "description": "Pure functions"},
                {"label": "Browser", "description": "Chromium"},
            ],
            "multiSelect": True,
        },
    ]
}


def test_the_agent_s_questions_are_answered_with_a_form_s_answers(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Found by a hostile review: AskUserQuestion came as a permission card of raw JSON whose
    # Allow told the model "The user did not answer the questions." Now the answers go back.
    live = start()
    cid = create_claude(live)
    fake.tool_calls.append(("AskUserQuestion", QUESTIONS))
    assert live.send(cid, "set up the project").status_code == 202
    question = wait_question(live, cid)
    assert question["data"]["tool"] == "AskUserQuestion"
    assert question["text"] == (
        "The agent asks: Which database should I use? · Which tests should I write?"
    )
    url = f"/api/conversations/{cid}/permissions/{question['id']}"
    first = "Which database should I use?"
    for wrong, error in (
        ({first: "SQLite"}, "Answer every question (or skip them all)."),
        ({first: "SQLite", "Which tests should I write?": "  "}, "Answer every question"),
        ({first: "SQLite", "Why?": "no"}, "The agent did not ask: Why?"),
    ):
        refused = live.http.post(url, json={"allow": True, "answers": wrong})
        assert refused.status_code == 400 and error in refused.json()["detail"], refused.text
    too_long = {first: "x" * 5001, "Which tests should I write?": "Unit"}
    assert live.http.post(url, json={"allow": True, "answers": too_long}).status_code == 422
    # Found by a hostile review: a NUL reached the agent (a message's text refuses one).
    second = "Which tests should I write?"
    for nul in ({first: "SQL\x00ite", second: "Unit"}, {first + "\x00": "x"}):
        refused = live.http.post(url, json={"allow": True, "answers": nul})
        assert refused.status_code == 422 and "NUL" in refused.text, refused.text
    answers = {first: "SQLite", "Which tests should I write?": "Unit, Browser, and a load test"}
    # Found by the same review: the agent got the answers as typed, the tabs them trimmed.
    padded = {question: f"  {answer}\n" for question, answer in answers.items()}
    answered = live.http.post(url, json={"allow": True, "answers": padded})
    assert answered.status_code == 200, answered.text
    assert (answered.json()["state"], answered.json()["data"]["answers"]) == ("allowed", answers)
    view = live.wait_idle(cid, timeout=TIMEOUT)
    reply = of_kind(view, "agent")[-1]["text"]  # the fake quotes the tool's result
    assert reply.startswith("The tool returned:")
    for question_text, answer in answers.items():
        assert f'"{question_text}"="{answer}"' in reply, reply  # as shown, trimmed
    again = live.http.post(url, json={"allow": False})
    assert again.status_code == 409


def test_a_skipped_question_tells_the_model_and_answers_fit_only_questions(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live)
    fake.tool_calls.extend([("Bash", {"command": "touch x.txt"}), ("AskUserQuestion", QUESTIONS)])
    assert live.send(cid, "make a file").status_code == 202
    bash = wait_question(live, cid)
    url = f"/api/conversations/{cid}/permissions/{bash['id']}"
    refused = live.http.post(url, json={"allow": True, "answers": {"a": "b"}})
    assert refused.status_code == 400
    assert refused.json()["detail"] == (
        "Only a question of the agent's (AskUserQuestion) takes answers."
    )
    assert live.http.post(url, json={"allow": False}).status_code == 200
    live.wait_idle(cid, timeout=TIMEOUT)
    assert live.send(cid, "set up the project").status_code == 202
    question = wait_question(live, cid)
    url = f"/api/conversations/{cid}/permissions/{question['id']}"
    refused = live.http.post(url, json={"allow": False, "answers": {"a": "b"}})
    assert refused.status_code == 400, refused.text
    skipped = live.http.post(url, json={"allow": False})
    assert skipped.status_code == 200 and skipped.json()["state"] == "denied"
    view = live.wait_idle(cid, timeout=TIMEOUT)
    (call,) = [
        e
        for e in of_kind(view, "activity")
        if e["data"].get("tool") == "AskUserQuestion" and e["data"]["type"] == "tool"
    ]
    assert call["text"] == "Which database should I use? · Which tests should I write?"
    assert (call["state"], call["data"]["output"]) == ("error", DENIED)


def stopped(live: LiveRelay, cid: int) -> dict[str, Any]:
    """Press Stop on the conversation's running turn; its view once idle."""
    response = live.http.post(f"/api/conversations/{cid}/interrupt")
    assert (response.status_code, response.json()) == (202, {"interrupted": True})
    return live.wait_idle(cid, timeout=TIMEOUT)


def test_stop_interrupts_and_next_message_continues(start: StartRelay, fake: FakeAnthropic) -> None:
    live = start()
    cid = create_claude(live)
    assert live.send(cid, "talk [[LONG:400]]").status_code == 202
    live.wait_for(cid, streaming_words, timeout=TIMEOUT)
    pid = agent_pid(live, cid)
    session_id = live.get(cid)["session_id"]
    view = stopped(live, cid)

    user, agent, line = view["timeline"]
    assert (user["kind"], user["state"], user["text"]) == ("user", "sent", "talk [[LONG:400]]")
    assert agent["kind"] == "agent"
    assert 3 <= len(agent["text"].split()) < 400
    assert "lorem ipsum dolor sit amet".startswith(" ".join(agent["text"].split()[:5]))
    assert {k: line[k] for k in ("kind", "state", "text", "data")} == {
        "kind": "line",
        "state": "done",
        "text": "Interrupted by the user.",
        "data": {"level": "info", "type": "interrupted"},
    }
    idle = live.http.post(f"/api/conversations/{cid}/interrupt")
    assert (idle.status_code, idle.json()) == (202, {"interrupted": False})

    view = turn(live, cid, "after the stop")
    assert shape(view)[3:] == [
        ("user", "sent", "after the stop"),
        ("agent", "done", "You said: after the stop"),
    ]
    assert view["session_id"] == session_id
    assert agent_pid(live, cid) == pid  # the same process went on
    sent = fake.user_texts_sent()
    assert sent[0] == "talk [[LONG:400]]" and sent[-1] == "after the stop"
    assert "[Request interrupted by user]" in sent


def test_killed_cli_shows_error_and_next_message_resumes(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live)
    turn(live, cid, "my name is Bob")
    session_id = live.get(cid)["session_id"]
    assert session_id
    assert live.send(cid, "now talk [[LONG:400]]").status_code == 202
    live.wait_for(cid, streaming_words, timeout=TIMEOUT)
    os.kill(agent_pid(live, cid), signal.SIGKILL)
    view = live.wait_idle(cid, timeout=TIMEOUT)

    kinds = [(e["kind"], e["state"]) for e in view["timeline"]]
    assert kinds[:3] == [("user", "sent"), ("agent", "done"), ("user", "sent")]
    # The cut reply keeps its streamed text, marked interrupted (it read "done" before).
    assert kinds[3] == ("agent", "interrupted") and kinds[4:] == [("line", "done")]
    live.wait_for(cid, lambda v: v["agent"] == "asleep", timeout=TIMEOUT)  # it said "ready"
    assert 3 <= len(view["timeline"][3]["text"].split()) < 400
    error = view["timeline"][4]
    assert error["data"] == {"level": "error"}
    assert error["text"].startswith(
        "The Claude Code process exited unexpectedly (killed by SIGKILL)."
    )

    view = turn(live, cid, "what is my name?")
    assert shape(view)[5:] == [
        ("user", "sent", "what is my name?"),
        ("agent", "done", "You said: what is my name?"),
    ]
    assert view["session_id"] == session_id
    sent = fake.user_texts_sent()
    assert sent[0] == "my name is Bob"
    assert "now talk [[LONG:400]]" in sent
    assert sent[-1] == "what is my name?"


def test_a_cli_killed_between_turns_shows_asleep_and_the_next_message_resumes(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Found by a hostile review: the header said "ready" with no process, and typing (which
    # warms an asleep agent) started nothing.
    live = start()
    cid = create_claude(live)
    turn(live, cid, "my name is Bob")
    assert live.get(cid)["agent"] == "ready"
    os.kill(agent_pid(live, cid), signal.SIGKILL)
    live.wait_for(cid, lambda v: v["agent"] == "asleep", timeout=TIMEOUT)  # the reaper's pass
    view = turn(live, cid, "what is my name?")
    assert shape(view)[-1] == ("agent", "done", "You said: what is my name?")
    assert of_kind(view, "line") == []
    assert "my name is Bob" in json.dumps(fake.message_bodies()[-1])  # resumed


def test_a_tool_call_cut_by_a_killed_cli_shows_it_got_no_result(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = create_claude(live)
    assert live.send(cid, "wait [[BASH:echo on && sleep 30]]").status_code == 202

    def calling(view: dict[str, Any]) -> bool:
        return [e["state"] for e in of_kind(view, "activity")] == ["running"]

    live.wait_for(cid, calling, timeout=TIMEOUT)
    os.kill(agent_pid(live, cid), signal.SIGKILL)
    view = live.wait_idle(cid, timeout=TIMEOUT)
    (activity,) = of_kind(view, "activity")
    assert (activity["state"], activity["text"]) == (
        "interrupted",
        "echo on && sleep 30",
    )  # no spinner


def test_relay_restart_resumes_then_lost_transcript_starts_anew(
    start: StartRelay, fake: FakeAnthropic, home: Path
) -> None:
    first = start()
    cid = create_claude(first, title="Restart")
    turn(first, cid, "remember the number 42")
    session_id = first.get(cid)["session_id"]
    assert session_id
    first.stop()

    second = start()
    view = turn(second, cid, "which number?")
    assert view["session_id"] == session_id
    assert shape(view) == [
        ("user", "sent", "remember the number 42"),
        ("agent", "done", "You said: remember the number 42"),
        ("user", "sent", "which number?"),
        ("agent", "done", "You said: which number?"),
    ]
    sent = fake.user_texts_sent()
    assert sent[0] == "remember the number 42" and sent[-1] == "which number?"
    second.stop()

    projects = home / ".claude" / "projects"
    transcripts = list(projects.glob(f"*/{session_id}.jsonl"))
    assert len(transcripts) == 1
    for directory in projects.iterdir():
        shutil.rmtree(directory)

    third = start()
    view = turn(third, cid, "hello again")
    assert shape(view)[4:] == [
        ("user", "sent", "hello again"),
        ("line", "done", RESUME_FAILED),
        ("agent", "done", "You said: hello again"),
    ]
    assert RESUME_FAILED == (
        "Could not resume the previous Claude Code session (its transcript is gone); "
        "started a new session."
    )
    assert view["timeline"][5]["data"] == {"level": "warning", "session_id": session_id}
    assert view["session_id"] and view["session_id"] != session_id
    assert fake.user_texts_sent() == ["hello again"]


def test_api_errors_become_warning_lines(
    start: StartRelay, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "1")
    live = start()
    cid = create_claude(live)
    fake.fail(429, 429)
    view = turn(live, cid, "first")
    lines = of_kind(view, "line")
    assert [(e["data"]["level"], e["text"]) for e in lines[:2]] == [
        ("warning", "API error 429 (rate_limit), retrying (attempt 1 of 1)"),
        ("error", "API Error: Request rejected (429) · fake rate_limit_error (429)"),
    ]
    retry = lines[0]["data"]
    assert {k: retry[k] for k in ("status", "attempt", "max_retries", "error")} == {
        "status": 429,
        "attempt": 1,
        "max_retries": 1,
        "error": "rate_limit",
    }
    assert lines[1]["data"] == {"level": "error", "status": 429, "error": "rate_limit"}
    assert of_kind(view, "agent") == []

    fake.fail(500)
    view = turn(live, cid, "second")
    user = next(e for e in view["timeline"] if e["text"] == "second")
    after = [e for e in view["timeline"] if e["seq"] > user["seq"]]
    assert [(e["kind"], e["text"]) for e in after] == [
        ("line", "API error 500 (server_error), retrying (attempt 1 of 1)"),
        ("agent", "You said: second"),
    ]
    assert after[0]["data"]["level"] == "warning" and after[0]["data"]["status"] == 500


def test_api_error_is_one_error_line(
    start: StartRelay, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "1")
    live = start()
    cid = create_claude(live)
    fake.fail(429, 429)
    view = turn(live, cid, "first")
    assert [(e["data"]["level"], e["text"]) for e in of_kind(view, "line")] == [
        ("warning", "API error 429 (rate_limit), retrying (attempt 1 of 1)"),
        ("error", "API Error: Request rejected (429) · fake rate_limit_error (429)"),
    ]


# DeepSeek -------------------------------------------------------------------------------------


@pytest.mark.parametrize("anthropic_key", [None, "sk-ant-must-not-leak"])
def test_deepseek_request_uses_deepseek_key_and_model(
    start: StartRelay,
    fake: FakeAnthropic,
    monkeypatch: pytest.MonkeyPatch,
    anthropic_key: str | None,
) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-key")
    monkeypatch.delenv("ANTHROPIC_BASE_URL")  # only deepseek_base_url leads to the fake
    if anthropic_key is None:
        monkeypatch.delenv("ANTHROPIC_API_KEY")
    else:
        monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_key)
    live = start(deepseek_base_url=fake.base_url)
    conversation = live.create(provider="deepseek")
    assert conversation["provider"] == "deepseek"
    view = turn(live, conversation["id"], "hello deepseek")
    assert shape(view) == [
        ("user", "sent", "hello deepseek"),
        ("agent", "done", "You said: hello deepseek"),
    ]
    messages = [r for r in fake.requests if r.path.split("?")[0] == "/v1/messages"]
    assert messages
    for request in fake.requests:
        assert request.headers.get("authorization") == "Bearer ds-key"
        assert "x-api-key" not in request.headers
        assert "sk-ant-must-not-leak" not in json.dumps(request.headers)
    assert {r.body["model"] for r in messages} == {"deepseek-chat"}
    assert view["model"] == "deepseek-chat"


def test_providers_offer_deepseek_only_with_its_key(
    start: StartRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = start()

    def deepseek() -> dict[str, Any]:
        answer = live.http.get("/api/providers")
        assert answer.status_code == 200
        found = next(p for p in answer.json()["providers"] if p["id"] == "deepseek")
        # As root, bypassPermissions is marked (test_agent_processes.py): not this test's point.
        assert set(found.pop("refused_modes")) <= {"bypassPermissions"}
        return dict(found)

    assert deepseek() == {
        "id": "deepseek",
        "name": "DeepSeek",
        "available": False,
        "reason": "Set DEEPSEEK_API_KEY first.",
        "compact_window": True,
        "images": False,
    }
    refused = live.http.post("/api/conversations", json={"provider": "deepseek"})
    assert refused.status_code == 409
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-key")
    assert deepseek() == {
        "id": "deepseek",
        "name": "DeepSeek",
        "available": True,
        "reason": "",
        "compact_window": True,
        "images": False,
    }
    assert live.http.post("/api/conversations", json={"provider": "deepseek"}).status_code == 201


# Issue 4: /compact ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["/compact keep only the plan", "/clear now please", "/reset", "/new\u00a0start"]
)
def test_compact_or_clear_with_more_words_is_text_for_the_model(
    start: StartRelay, fake: FakeAnthropic, text: str
) -> None:
    """Not the relay's command (not the whole message), and not the CLI's either: the CLI ran
    `/compact …` as its own compaction (the model never answered) and `/clear …`, `/reset` and
    `/new …` as its /clear, wiping what the agent remembered without a line (SPEC §2)."""
    live = start()
    cid = create_claude(live)
    turn(live, cid, "first hello")
    view = turn(live, cid, text)
    assert shape(view)[2:] == [("user", "sent", text), ("agent", "done", f"You said: {text}")]
    view = turn(live, cid, "third hello")
    assert fake.user_texts_sent()[-1] == "third hello"
    request = fake.message_bodies()[-1]
    history = [t for m in request["messages"] if m["role"] == "user" for t in user_texts(m)]
    assert history == ["first hello", text, "third hello"]  # remembered, none run by the CLI
    assert [e["kind"] for e in view["timeline"]] == ["user", "agent"] * 3  # no line of its own


def test_compact_carries_summary_into_a_new_session(start: StartRelay, fake: FakeAnthropic) -> None:
    live = start()
    cid = create_claude(live, title="Compact me")
    turn(live, cid, "first")
    old = turn(live, cid, "second")
    old_session = old["session_id"]
    assert old_session

    response = live.send(cid, "/compact")
    assert response.status_code == 201, response.text
    new = response.json()["compacted_into"]
    expected = build_summary(
        "Compact me",
        [
            SummaryMessage("user" if e["kind"] == "user" else "agent", e["text"])
            for e in old["timeline"]
            if e["kind"] in ("user", "agent")
        ],
    )
    assert expected == (
        "Conversation: Compact me\nUser: first\nAgent: You said: first\n"
        "User: second\nAgent: You said: second"
    )
    assert new["title"] == "Compact me (compacted)"
    assert new["pending_summary"] == expected
    assert new["compacted_from_id"] == cid
    assert new["session_id"] is None
    archived = live.get(cid)
    assert (archived["status"], archived["compacted_into_id"]) == ("archived", new["id"])
    fresh = live.get(new["id"])
    assert (fresh["timeline"], fresh["pending_summary"]) == ([], expected)

    sent_before = len(fake.message_bodies())
    view = turn(live, new["id"], "third")
    composed = compose_first_message(expected, "third")
    assert composed == (
        "[Carry-over context from previous compacted conversation]\n"
        f"{expected}\n\n[New user request]\nthird"
    )
    (request,) = fake.message_bodies()[sent_before:]
    assert last_message_texts(request)[-1] == composed
    assert fake.user_texts_sent() == [composed]  # a new session: no old history
    assert shape(view) == [("user", "sent", "third"), ("agent", "done", f"You said: {composed}")]
    assert view["pending_summary"] is None
    assert view["session_id"] and view["session_id"] != old_session

    view = turn(live, new["id"], "fourth")
    (request,) = fake.message_bodies()[sent_before + 1 :]
    assert last_message_texts(request)[-1] == "fourth"
    assert HEADER not in json.dumps(last_user_message(request))
    assert [t for t in fake.user_texts_sent() if HEADER in t] == [composed]
    assert view["session_id"] == live.get(new["id"])["session_id"]
    assert shape(view)[2:] == [("user", "sent", "fourth"), ("agent", "done", "You said: fourth")]


# Issue 5: auto-compaction by the CLI ----------------------------------------------------------


def test_auto_compaction_line_and_queue_during_compaction(
    start: StartRelay, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000")
    fake.input_tokens = 70_000
    live = start()
    cid = create_claude(live)
    turn(live, cid, "turn 1")
    view = turn(live, cid, "turn 2")  # the CLI tries and fails (too_few_groups): no line
    assert of_kind(view, "line") == []
    assert [e["kind"] for e in view["timeline"]] == ["user", "agent", "user", "agent"]
    assert not any(is_summary_request(b) for b in fake.message_bodies())  # refused up front

    with live.socket() as ws:
        assert receive(ws)["type"] == "hello"
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
        assert receive(ws)["type"] == "snapshot"
        view = turn(live, cid, "turn 3")
        events = receive_until(
            ws, lambda m: m["type"] == "turn" and m["turn"]["state"] == "idle", timeout=TIMEOUT
        )
    (line,) = of_kind(view, "line")
    pre, post = line["data"]["pre_tokens"], line["data"]["post_tokens"]
    assert 70_000 <= pre <= 70_100
    assert post > 0
    assert line["state"] == "done"
    # (its link to the backup written before it: tests/test_backups_relay.py; its time and
    # summary: tests/test_compaction_details.py)
    assert {
        k: v for k, v in line["data"].items() if k not in ("backup", "duration_ms", "summary")
    } == {
        "level": "info",
        "type": "compaction",
        "trigger": "auto",
        "pre_tokens": pre,
        "post_tokens": post,
    }
    assert line["text"] == finished_text("line", pre_tokens=pre, post_tokens=post)
    assert line["text"].startswith("Context compacted · 70k → ")
    assert [e["kind"] for e in view["timeline"][4:]] == ["user", "line", "agent"]
    assert view["timeline"][6]["text"] == "You said: turn 3"
    states = [m["turn"]["state"] for m in events if m["type"] == "turn"]
    assert "compacting" in states
    updates = [
        m["conversation"]["context_tokens"]
        for m in events
        if m["type"] == "conversation" and "seq" in m
    ]
    assert post in updates  # the meter dropped to the compacted size...
    assert view["context_tokens"] == 70_000  # ...then rose with the reply's usage

    # A message sent while the CLI compacts is held until the compaction (and turn) is over.
    fake.summary_delay = 4
    assert live.send(cid, "turn 4").status_code == 202
    live.wait_for(cid, lambda v: v["turn"]["state"] == "compacting", timeout=TIMEOUT)
    summaries_so_far = len(fake.message_bodies())
    queued = live.send(cid, "while compacting")
    assert queued.status_code == 202
    assert queued.json()["state"] == "queued"
    fake.summary_delay = 0
    busy = live.get(cid)
    assert busy["turn"] == {"state": "compacting", "queued": 1}
    assert (busy["timeline"][-1]["text"], busy["timeline"][-1]["state"]) == (
        "while compacting",
        "queued",
    )
    running = [e for e in of_kind(busy, "line") if e["state"] == "running"]
    assert [(e["text"], e["data"]["type"]) for e in running] == [
        ("Compacting context…", "compaction")
    ]

    view = live.wait_idle(cid, timeout=TIMEOUT)
    bodies = fake.message_bodies()
    summary_index = max(i for i in range(summaries_so_far) if is_summary_request(bodies[i]))
    carrying = [i for i, b in enumerate(bodies) if "while compacting" in json.dumps(b)]
    assert carrying and min(carrying) > summary_index
    assert min(carrying) >= summaries_so_far
    texts = [(e["kind"], e["state"], e["text"]) for e in view["timeline"][7:]]
    assert texts[0] == ("user", "sent", "turn 4")
    assert texts[-1] == ("agent", "done", "You said: while compacting")
    order = [t[2] for t in texts if t[0] in ("user", "agent")]
    assert order == ["turn 4", "You said: turn 4", "while compacting", "You said: while compacting"]
    assert all(
        e["state"] == "done" and e["text"].startswith("Context compacted · 70k → ")
        for e in of_kind(view, "line")
    )


# Issue 6: the auto-compact window ------------------------------------------------------------


def test_window_change_restarts_same_session_and_compacts(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    fake.input_tokens = 70_000
    live = start()
    cid = create_claude(live)
    patched = live.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 200_000})
    assert patched.status_code == 200
    turn(live, cid, "turn 1")
    view = turn(live, cid, "turn 2")
    assert of_kind(view, "line") == []
    session_id = view["session_id"]
    data = wait_context(live, cid, lambda d: (d["agent"] or {}).get("maxTokens") == 200_000)
    assert data["agent"]["autocompactSource"] == "env"
    assert (data["window"], data["source"], data["pending_restart"]) == (200_000, "setting", False)
    pid = agent_pid(live, cid)

    patched = live.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 100_000})
    assert patched.status_code == 200
    data = context(live, cid)
    assert data["pending_restart"] is True
    assert data["note"] == APPLY_NOTE
    assert (data["used"], data["window"], data["threshold"]) == (70_000, 100_000, 67_000)
    assert (data["will_compact"], data["warning"]) == (True, COMPACT_WARNING)

    view = turn(live, cid, "turn 3")
    tail = view["timeline"][4:]
    assert [(e["kind"], e["text"]) for e in tail[:2]] == [
        ("user", "turn 3"),
        ("line", "Restarted the session to apply the compaction window (200k → 100k)"),
    ]
    assert tail[1]["data"] == {"level": "info", "type": "restart"}
    assert tail[2]["kind"] == "line" and tail[2]["data"]["type"] == "compaction"
    assert tail[2]["data"]["trigger"] == "auto" and tail[2]["state"] == "done"
    assert 70_000 <= tail[2]["data"]["pre_tokens"] <= 70_100
    assert [(e["kind"], e["text"]) for e in tail[3:]] == [("agent", "You said: turn 3")]
    assert view["session_id"] == session_id
    assert agent_pid(live, cid) != pid
    data = wait_context(live, cid, lambda d: (d["agent"] or {}).get("maxTokens") == 100_000)
    assert data["agent"] == {
        "maxTokens": 100_000,
        "autocompactSource": "env",
        "autoCompactThreshold": 67_000,
    }
    assert data["pending_restart"] is False
    assert data["line"] == "100k · your setting"


def test_env_window_reaches_cli_and_context(
    start: StartRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "300000")
    live = start()
    cid = create_claude(live)
    before = context(live, cid)
    assert (before["line"], before["window"], before["agent"]) == ("", None, None)
    turn(live, cid, "hello")
    data = wait_context(live, cid, lambda d: d["agent"] is not None)
    assert data["agent"] == {
        "maxTokens": 300_000,
        "autocompactSource": "env",
        "autoCompactThreshold": 267_000,
    }
    assert (data["setting"], data["setting_label"]) == (None, "Auto")
    assert (data["window"], data["threshold"], data["source"]) == (300_000, 267_000, "env")
    assert data["line"] == "300k · from CLAUDE_CODE_AUTO_COMPACT_WINDOW"
    assert data["source_text"] == "from CLAUDE_CODE_AUTO_COMPACT_WINDOW"
    assert data["pending_restart"] is False


def test_cli_killed_during_compaction_leaves_no_line_and_resumes(
    start: StartRelay, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000")
    fake.input_tokens = 70_000
    live = start()
    cid = create_claude(live)
    turn(live, cid, "turn 1")
    turn(live, cid, "turn 2")
    fake.summary_delay = 30  # the compaction of turn 3 hangs until the CLI is killed
    live.send(cid, "turn 3")
    live.wait_for(cid, lambda v: v["turn"]["state"] == "compacting", timeout=TIMEOUT)
    os.kill(live.supervisor.runners[cid].agent.pid, signal.SIGKILL)
    view = live.wait_idle(cid, timeout=TIMEOUT)
    lines = of_kind(view, "line")
    assert [line["data"]["level"] for line in lines] == ["error"]  # no compaction line left
    assert lines[0]["text"].startswith("The Claude Code process exited unexpectedly")
    fake.summary_delay = 0
    fake.input_tokens = 1_000
    after = turn(live, cid, "turn 4")
    assert of_kind(after, "agent")[-1]["text"] == "You said: turn 4"
    assert after["session_id"] == view["session_id"]  # the same session, resumed


def test_stop_interrupts_a_turn_that_began_right_after_another(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    # Found by a review: a turn was left to the garbage collector once its result was read; its
    # clean-up ran a few steps later, in the queued message's turn, and reset the adapter's
    # flags under it: a Stop then found no turn to stop, and the reply ran whole.
    live = start()
    cid = create_claude(live)
    assert live.send(cid, "first").status_code == 202
    assert live.send(cid, "talk [[LONG:400]]").status_code == 202  # queued behind it
    live.wait_for(cid, lambda view: streaming_words(view, 5), timeout=TIMEOUT)  # (not "first")
    view = stopped(live, cid)
    *_, agent, line = view["timeline"]
    assert 3 <= len(agent["text"].split()) < 400
    assert (line["kind"], line["text"]) == ("line", "Interrupted by the user.")


def test_idle_agent_is_stopped_then_resumed(start: StartRelay, fake: FakeAnthropic) -> None:
    live = start(agent_idle_timeout=1.0)
    cid = create_claude(live)
    session_before = turn(live, cid, "remember idle")["session_id"]
    runner = live.supervisor.runners[cid]
    pid = runner.agent.pid
    deadline = time.monotonic() + 20
    while runner.agent is not None:  # the reaper checks every 0.5 s at this timeout
        assert time.monotonic() < deadline, "the idle agent was never stopped"
        time.sleep(0.1)
    while process_alive(pid):  # stopping it may take a moment after the runner let go
        assert time.monotonic() < deadline, "the idle agent's CLI process is still running"
        time.sleep(0.1)
    view = turn(live, cid, "after idle")
    assert of_kind(view, "agent")[-1]["text"] == "You said: after idle"
    assert view["session_id"] == session_before
    history = json.dumps(fake.message_bodies()[-1])
    assert "remember idle" in history  # the resumed session still has the earlier turn
    # Each turn's own cost (the fake bills every request alike): the resumed CLI counts the
    # session's cost from its last exit, which is not this turn's (before: the two turns' sum).
    costs = [e["data"]["result"]["cost_usd"] for e in of_kind(view, "agent")]
    assert costs[0] > 0
    assert costs == [costs[0], costs[0]], costs


def process_alive(pid: int) -> bool:
    """True while a process exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_a_file_named_with_at_reaches_the_model(start: StartRelay, fake: FakeAnthropic) -> None:
    """The composer's @ completion (app/files.py) relies on Claude Code attaching the file a
    message names as @path, or @"path" with a space: the relay passes the text as typed."""
    live = start()
    cwd = live.settings.roots[0] / "work" / "at"
    cwd.mkdir(parents=True)
    (cwd / "plain.txt").write_text("CONTENT OF PLAIN\n")
    (cwd / "my notes.txt").write_text("CONTENT OF NOTES\n")
    cid = create_claude(live, cwd=str(cwd))
    turn(live, cid, 'Compare @plain.txt and @"my notes.txt" please')
    seen = json.dumps(fake.message_bodies()[-1])
    assert "CONTENT OF PLAIN" in seen and "CONTENT OF NOTES" in seen


def test_an_attached_image_reaches_the_model(start: StartRelay, fake: FakeAnthropic) -> None:
    """Images go in the prompt's user message, before its text, as the model's API takes them."""
    live = start()
    cid = create_claude(live)
    image = png()
    body = {"text": "What colour is this?", "attachments": [live.attach(cid, image)]}
    sent = live.http.post(f"/api/conversations/{cid}/messages", json=body)
    assert sent.status_code == 202, sent.text
    live.wait_idle(cid, timeout=TIMEOUT)
    # The user message that holds the prompt (the CLI adds a system message after it, and
    # a line naming where it keeps its copy of the image).
    (content,) = [
        message["content"]
        for message in fake.message_bodies()[-1]["messages"]
        if isinstance(message["content"], list)
        and any(
            block.get("text", "").strip() == "What colour is this?" for block in message["content"]
        )
    ]
    images = [block for block in content if block.get("type") == "image"]
    assert images == [
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": "image/png",
                "data": base64.b64encode(image).decode(),
            },
        }
    ]
    assert content.index(images[0]) < next(
        i
        for i, block in enumerate(content)
        if block.get("text", "").strip() == "What colour is this?"
    )
