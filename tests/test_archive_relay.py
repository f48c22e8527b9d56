"""The archive, for the agent (SPEC §8), with the real Claude Code CLI against the fake Messages
API (tests/fake_anthropic.py): the fake model calls `mcp__oarlock__search_archive` and
`mcp__oarlock__read_archive`, and echoes the tool's answer ("The tool returned: …")."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_anthropic import FakeAnthropic
from tests.relay import LiveRelay, make_settings

TIMEOUT = 90
SEARCH = "mcp__oarlock__search_archive"
READ = "mcp__oarlock__read_archive"
SECRET = "the stranger keeps an osprey secret"


@pytest.fixture
def live(tmp_path: Path, home: Path) -> Iterator[LiveRelay]:
    """A relay whose Claude Code CLI talks to the fake API, from a fresh HOME."""
    with LiveRelay(make_settings(tmp_path / "data")) as relay:
        yield relay


def turn(live: LiveRelay, cid: int, text: str) -> dict[str, Any]:
    response = live.send(cid, text)
    assert response.status_code == 202, response.text
    return live.wait_idle(cid, timeout=TIMEOUT)


def compact(live: LiveRelay, cid: int) -> int:
    response = live.send(cid, "/compact")
    assert response.status_code == 201, response.text
    return int(response.json()["compacted_into"]["id"])


def last_reply(view: dict[str, Any]) -> str:
    return str([e["text"] for e in view["timeline"] if e["kind"] == "agent"][-1])


def tool_errors(fake: FakeAnthropic) -> dict[str, bool]:
    """Whether each tool_result the CLI sent the model was an error, by tool_use_id, in order."""
    found: dict[str, bool] = {}
    for body in fake.message_bodies():
        for message in body["messages"]:
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    found[block["tool_use_id"]] = bool(block.get("is_error"))
    return found


def messages_of(live: LiveRelay, cid: int) -> list[tuple[int, str, str]]:
    """(seq, kind, text) of a conversation's messages with text."""
    return [
        (e["seq"], e["kind"], e["text"])
        for e in live.get(cid)["timeline"]
        if e["kind"] in ("user", "agent") and e["text"]
    ]


def test_agent_searches_and_reads_its_ancestors_only(live: LiveRelay, fake: FakeAnthropic) -> None:
    grand = live.create(provider="claude", title="Grand")["id"]
    turn(live, grand, "the osprey nests by the river")
    parent = compact(live, grand)
    turn(live, parent, "an osprey again in the parent")
    child = compact(live, parent)
    # An unrelated archived conversation holding the same word: never the agent's to see.
    other = live.create(provider="demo", title="Stranger")["id"]
    turn(live, other, SECRET)
    assert live.http.post(f"/api/conversations/{other}/archive").status_code == 200
    assert any(hit["conversation_id"] == other for hit in search_box(live, "osprey"))

    fake.tool_calls.append((SEARCH, {"query": "osprey"}))
    view = turn(live, child, "what did we say about birds?")
    answer = last_reply(view)
    assert answer.startswith(
        "The tool returned: 4 matching messages in the archived conversations this one was "
        "compacted from, best first (at most 20; read_archive gives the full texts):\n"
    ), answer
    listed = re.findall(r"^conversation (\d+), seq (\d+), (user|agent): (.*)$", answer, re.M)
    expected = {
        (cid, seq, kind)
        for cid in (grand, parent)
        for seq, kind, text in messages_of(live, cid)
        if "osprey" in text
    }
    assert {(int(c), int(s), k) for c, s, k, _ in listed} == expected
    assert len(listed) == len(expected) == 4
    assert all("osprey" in line for *_, line in listed)
    assert "stranger" not in answer and str(other) not in {c for c, *_ in listed}
    # No permission question in the default mode, and the tool is in the model's list.
    assert not [e for e in view["timeline"] if e["data"].get("type") == "permission"]
    tools = [t["name"] for t in fake.message_bodies()[-1].get("tools", [])]
    assert SEARCH in tools and READ in tools

    fake.tool_calls.append((READ, {"conversation_id": grand, "from_seq": 1}))
    answer = last_reply(turn(live, child, "read the first one"))
    body = "".join(
        f"\n[seq {seq}] {'User' if kind == 'user' else 'Agent'}:\n{text}\n"
        for seq, kind, text in messages_of(live, grand)
    )
    assert answer == (
        f'The tool returned: Conversation {grand} "Grand" (archived), messages from seq 1:\n'
        f"{body}\nEnd of conversation {grand}."
    )
    assert "the osprey nests by the river" in answer

    fake.tool_calls.append((READ, {"conversation_id": other}))
    view = turn(live, child, "read the stranger")
    refused = (
        f"Conversation {other} is not one this conversation was compacted from; "
        f"read_archive reads only these: {parent}, {grand}."
    )
    assert last_reply(view) == f"The tool returned: {refused}"
    (call,) = [e for e in view["timeline"] if e["data"].get("tool") == READ][-1:]
    assert call["state"] == "error"
    assert list(tool_errors(fake).values()) == [False, False, True]
    # The stranger's text never reached the model, in any request.
    assert SECRET not in json.dumps(fake.message_bodies())


def search_box(live: LiveRelay, q: str) -> list[dict[str, Any]]:
    response = live.http.get("/api/search", params={"q": q})
    assert response.status_code == 200, response.text
    return list(response.json()["hits"])
