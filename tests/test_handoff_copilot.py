"""The save_handoff tool on the SDK engine (provider openai): the real Copilot CLI calls the
session tool the relay gives it, against the fake OpenAI-compatible server."""

from __future__ import annotations

import json

from tests import test_copilot_relay
from tests.fake_openai import FakeOpenAI
from tests.relay import LiveRelay

fake = test_copilot_relay.fake  # the same fixtures: the fake OpenAI API, a relay on it
relay = test_copilot_relay.relay

HANDOFF = {"done": "Engine wired.", "next": "Test it.", "files": ["app/agents/copilot.py"]}


def test_engine_calls_save_handoff_and_it_is_stored(relay: LiveRelay, fake: FakeOpenAI) -> None:
    cid = relay.create(provider="openai")["id"]  # default mode: the tool still never asks
    relay.send(cid, f"save it [[TOOL:save_handoff {json.dumps(HANDOFF)}]]")
    view = relay.wait_idle(cid, timeout=90)
    stored = relay.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"]
    assert {k: stored[k] for k in ("done", "next", "files", "source")} == {
        **HANDOFF,
        "source": "agent",
    }
    (card,) = [e for e in view["timeline"] if e["data"].get("type") == "handoff"]
    assert card["text"] == "Handoff saved"
    assert not [e for e in view["timeline"] if e["data"].get("type") == "permission"]
    replies = [e["text"] for e in view["timeline"] if e["kind"] == "agent"]
    assert (
        replies[-1] == "The tool returned: Handoff saved (42 characters). The user can /clear now."
    )
    tools = [t["function"]["name"] for t in fake.turn_bodies()[0].get("tools", [])]
    assert "save_handoff" in tools


def test_engine_gets_a_readable_error_for_an_oversized_handoff(
    relay: LiveRelay, fake: FakeOpenAI
) -> None:
    cid = relay.create(provider="openai")["id"]
    big = {"done": "d" * 8_000, "next": "n" * 1_001, "files": []}
    relay.send(cid, f"save it [[TOOL:save_handoff {json.dumps(big)}]]")
    view = relay.wait_idle(cid, timeout=90)
    replies = [e["text"] for e in view["timeline"] if e["kind"] == "agent"]
    assert "The handoff is 9,001 characters long; the limit is 9,000" in replies[-1]
    assert relay.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"] is None
