"""search_archive and read_archive on the SDK engine (provider openai): the real Copilot CLI
calls the session tools the relay gives it, against the fake OpenAI-compatible server."""

from __future__ import annotations

import json

from tests import test_copilot_relay
from tests.fake_openai import FakeOpenAI
from tests.relay import LiveRelay

fake = test_copilot_relay.fake  # the same fixtures: the fake OpenAI API, a relay on it
relay = test_copilot_relay.relay

SECRET = "the stranger keeps an osprey secret"


def last_reply(relay: LiveRelay, cid: int, text: str) -> str:
    assert relay.send(cid, text).status_code == 202
    view = relay.wait_idle(cid, timeout=90)
    assert not [e for e in view["timeline"] if e["data"].get("type") == "permission"]
    return str([e["text"] for e in view["timeline"] if e["kind"] == "agent"][-1])


def test_engine_searches_its_ancestor_and_is_refused_another(
    relay: LiveRelay, fake: FakeOpenAI
) -> None:
    parent = relay.create(provider="openai", title="Birds")["id"]
    last_reply(relay, parent, "the osprey nests by the river")
    compacted = relay.send(parent, "/compact")
    assert compacted.status_code == 201, compacted.text
    child = compacted.json()["compacted_into"]["id"]
    other = relay.create(provider="demo", title="Stranger")["id"]
    last_reply(relay, other, SECRET)
    assert relay.http.post(f"/api/conversations/{other}/archive").status_code == 200

    search = json.dumps({"query": "osprey"})
    answer = last_reply(relay, child, f"find it [[TOOL:search_archive {search}]]")
    assert answer.startswith("The tool returned: 2 matching messages"), answer
    seqs = {
        e["kind"]: e["seq"] for e in relay.get(parent)["timeline"] if e["kind"] in ("user", "agent")
    }
    said = "the osprey nests by the river"
    assert sorted(answer.splitlines()[1:]) == sorted(
        [
            f"conversation {parent}, seq {seqs['user']}, user: {said}",
            f"conversation {parent}, seq {seqs['agent']}, agent: You said: {said}",
        ]
    )
    assert "stranger" not in answer

    read = json.dumps({"conversation_id": other})
    answer = last_reply(relay, child, f"read it [[TOOL:read_archive {read}]]")
    assert answer == (
        f"The tool returned: Conversation {other} is not one this conversation was compacted "
        f"from; read_archive reads only these: {parent}."
    )
    tools = [t["function"]["name"] for t in fake.turn_bodies()[-1].get("tools", [])]
    assert "search_archive" in tools and "read_archive" in tools
    assert SECRET not in json.dumps([r.body for r in fake.requests])
