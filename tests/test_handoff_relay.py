"""The context watch and the handoff with real agents: the Claude Code CLI against the fake
Messages API (tests/fake_anthropic.py).

The fake reports whatever usage it is told to, so the relay's `used` crosses the thresholds;
it calls `mcp__oarlock__save_handoff` when told to, and echoes the tool's answer back
("The tool returned: …"), so the test sees what the relay answered the agent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.handoff import HANDOFF_REQUEST, context_note
from tests.fake_anthropic import FakeAnthropic, last_user_text
from tests.relay import LiveRelay, make_settings

TIMEOUT = 90
TOOL = "mcp__oarlock__save_handoff"
SOFT_310K = (
    "[Context watch] The context is at 310k tokens. At a good stopping point, save a handoff "
    "with the save_handoff tool (what is done, what is next, the file paths and function names "
    "involved) and suggest that the user start fresh with /clear."
)
HARD_520K = (
    "[Context watch] The context is at 520k tokens, past 500k. Finish the current task, then "
    "save a handoff with the save_handoff tool (what is done, what is next, the file paths and "
    "function names involved) and ask the user to start fresh with /clear."
)
HANDOFF = {
    "done": "Rewrote the parser.",
    "next": "Wire parse_line into the CLI.",
    "files": ["app/parse.py", "parse_line"],
}


@pytest.fixture
def live(tmp_path: Path, home: Path) -> Iterator[LiveRelay]:
    """A relay whose Claude Code CLI talks to the fake API, from a fresh HOME."""
    with LiveRelay(make_settings(tmp_path / "data")) as relay:
        yield relay


def turn(live: LiveRelay, cid: int, text: str) -> dict[str, Any]:
    response = live.send(cid, text)
    assert response.status_code == 202, response.text
    return live.wait_idle(cid, timeout=TIMEOUT)


def turn_requests(fake: FakeAnthropic, text: str) -> list[dict[str, Any]]:
    """The Messages requests whose last user text starts with text (the turn's own prompt)."""
    return [b for b in fake.message_bodies() if last_user_text(b).startswith(text)]


def last_user(view: dict[str, Any]) -> dict[str, Any]:
    return [e for e in view["timeline"] if e["kind"] == "user"][-1]


def tool_entries(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in view["timeline"] if e["data"].get("tool") == TOOL]


def test_soft_then_hard_note_reach_the_model_not_the_bubble(
    live: LiveRelay, fake: FakeAnthropic
) -> None:
    cid = live.create(provider="claude", title="Watch")["id"]
    fake.input_tokens = 310_000
    view = turn(live, cid, "first")
    assert view["context_tokens"] == 310_000
    assert last_user_text(turn_requests(fake, "first")[0]) == "first"  # below soft: nothing
    assert "context_note" not in last_user(view)["data"]

    fake.input_tokens = 520_000
    view = turn(live, cid, "second")
    assert last_user_text(turn_requests(fake, "second")[0]) == f"second\n\n{SOFT_310K}"
    user = last_user(view)
    assert (user["text"], user["data"]["context_note"]) == ("second", SOFT_310K)

    view = turn(live, cid, "third")
    assert last_user_text(turn_requests(fake, "third")[0]) == f"third\n\n{HARD_520K}"
    user = last_user(view)
    assert (user["text"], user["data"]["context_note"]) == ("third", HARD_520K)
    assert context_note(520_000, 300_000, 500_000) == HARD_520K
    # Never blocks: every turn got its reply.
    replies = [e["text"] for e in view["timeline"] if e["kind"] == "agent"]
    assert replies[-1].startswith("You said: third")


def test_handoff_tool_is_stored_and_clear_carries_it(live: LiveRelay, fake: FakeAnthropic) -> None:
    cid = live.create(provider="claude", title="Parser")["id"]
    fake.tool_calls.append((TOOL, HANDOFF))
    view = turn(live, cid, "/handoff")
    assert last_user(view)["text"] == "/handoff"
    (request,) = turn_requests(fake, HANDOFF_REQUEST)
    assert last_user_text(request) == HANDOFF_REQUEST
    # In the model's tool list from the start, not deferred behind the CLI's tool search.
    assert TOOL in [t["name"] for t in request.get("tools", [])]
    assert TOOL in [t["name"] for t in request.get("tools", [])]
    # No permission question, in the default mode: the relay's tool never asks.
    assert not [e for e in view["timeline"] if e["data"].get("type") == "permission"]
    (card,) = [e for e in view["timeline"] if e["data"].get("type") == "handoff"]
    assert card["text"] == "Handoff saved"
    assert {k: card["data"][k] for k in ("done", "next", "files")} == HANDOFF
    (call,) = tool_entries(view)
    assert call["state"] == "done"
    answered = [e["text"] for e in view["timeline"] if e["kind"] == "agent"][-1]
    assert answered == "The tool returned: Handoff saved (70 characters). The user can /clear now."
    stored = live.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"]
    assert {k: stored[k] for k in ("done", "next", "files", "source")} == {
        **HANDOFF,
        "source": "agent",
    }

    cleared = live.send(cid, "/clear")
    assert cleared.status_code == 201, cleared.text
    new = cleared.json()["compacted_into"]["id"]
    before = len(fake.message_bodies())
    view = turn(live, new, "go on")
    first = next(b for b in fake.message_bodies()[before:] if "go on" in last_user_text(b))
    assert last_user_text(first) == (
        "[Handoff from the previous session]\n"
        "Done: Rewrote the parser.\n"
        "Next: Wire parse_line into the CLI.\n"
        "Files: app/parse.py, parse_line\n"
        "\n"
        "[New user request]\n"
        "go on"
    )
    assert [e["text"] for e in view["timeline"] if e["kind"] == "user"] == ["go on"]
    assert view["session_id"] != live.get(cid)["session_id"]  # a fresh agent session


def test_oversized_handoff_is_a_tool_error_the_agent_reads(
    live: LiveRelay, fake: FakeAnthropic
) -> None:
    cid = live.create(provider="claude", permission_mode="plan")["id"]
    fake.tool_calls.append((TOOL, {"done": "d" * 9_000, "next": "n", "files": []}))
    view = turn(live, cid, "save it")
    answered = [e["text"] for e in view["timeline"] if e["kind"] == "agent"][-1]
    assert answered == (
        "The tool returned: The handoff is 9,001 characters long; the limit is 9,000 for done, "
        "next and files together. Write a shorter one (keep the file paths and function names)."
    )
    (call,) = tool_entries(view)
    assert call["state"] == "error"
    assert not [e for e in view["timeline"] if e["data"].get("type") in ("handoff", "permission")]
    assert live.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"] is None
    tool_results = [
        b
        for body in fake.message_bodies()
        for m in body["messages"]
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert tool_results and all(r.get("is_error") for r in tool_results), json.dumps(tool_results)


def test_deepseek_gets_the_note_and_saves_through_the_same_tool(
    tmp_path: Path, home: Path, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-key")
    monkeypatch.delenv("ANTHROPIC_BASE_URL")  # only deepseek_base_url leads to the fake
    relay = LiveRelay(make_settings(tmp_path / "data", deepseek_base_url=fake.base_url)).start()
    try:
        cid = relay.create(provider="deepseek")["id"]
        fake.input_tokens = 310_000
        turn(relay, cid, "first")
        fake.tool_calls.append((TOOL, HANDOFF))
        view = turn(relay, cid, "second")
        assert last_user_text(turn_requests(fake, "second")[0]) == f"second\n\n{SOFT_310K}"
        assert {body["model"] for body in fake.message_bodies()} == {"deepseek-chat"}
        (card,) = [e for e in view["timeline"] if e["data"].get("type") == "handoff"]
        assert card["data"]["files"] == HANDOFF["files"]
        stored = relay.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"]
        assert stored["done"] == HANDOFF["done"]
    finally:
        relay.stop()
