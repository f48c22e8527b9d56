"""The handoff through the HTTP API with the demo agent: /handoff, /clear, the modal's handoff."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

from app.agents.base import Activity, AgentEvent, MessageDone, TextDelta, TurnDone
from app.handoff import HANDOFF_REQUEST
from app.storage import Storage
from app.tools import SAVE_HANDOFF
from tests.relay import LiveRelay, make_settings
from tests.stand_in import StandIn

DEMO_BLOCK = (
    "[Handoff from the previous session]\n"
    "Done: Talked with the demo agent, which quoted every message.\n"
    "Next: Start fresh with /clear and carry on.\n"
    "Files: app/agents/demo.py, DemoAgent.turn"
)


def cards(view: dict) -> list[dict]:
    return [e for e in view["timeline"] if e["data"].get("type") == "handoff"]


def test_handoff_command_saves_a_handoff_and_shows_a_card(relay: LiveRelay) -> None:
    cid = relay.create(title="Work")["id"]
    assert relay.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"] is None
    assert relay.send(cid, "  /handoff ").status_code == 202
    view = relay.wait_idle(cid)
    user = view["timeline"][0]
    assert (user["kind"], user["text"]) == (
        "user",
        "  /handoff ",
    )  # the bubble shows what was typed
    (card,) = cards(view)
    assert card["text"] == "Handoff saved"
    assert card["data"]["files"] == ["app/agents/demo.py", "DemoAgent.turn"]
    # The demo quotes its prompt: the agent received the fixed request, not "/handoff".
    agent = [e for e in view["timeline"] if e["kind"] == "agent"][-1]
    assert HANDOFF_REQUEST[:60] in agent["text"]
    stored = relay.http.get(f"/api/conversations/{cid}/handoff").json()
    assert stored["handoff"]["done"] == "Talked with the demo agent, which quoted every message."
    assert stored["handoff"]["source"] == "agent"
    # In UTC with a Z, as every other time the API gives (an API review: "+00:00" here only).
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", stored["handoff"]["created_at"])


def test_clear_carries_the_latest_handoff_and_moves_every_tab(relay: LiveRelay) -> None:
    cid = relay.create(title="Work")["id"]
    relay.send(cid, "please save a handoff")
    relay.wait_idle(cid)
    response = relay.send(cid, "/clear")
    assert response.status_code == 201, response.text
    new = response.json()["compacted_into"]
    assert (new["compacted_from_id"], new["pending_summary"]) == (cid, DEMO_BLOCK)
    old = relay.get(cid)
    assert (old["status"], old["compacted_into_id"]) == ("archived", new["id"])
    relay.send(new["id"], "carry on")
    view = relay.wait_idle(new["id"])
    assert view["pending_summary"] is None
    assert [e["text"] for e in view["timeline"] if e["kind"] == "user"] == ["carry on"]
    agent = [e for e in view["timeline"] if e["kind"] == "agent"][-1]
    assert "[Handoff from the previous session] Done: Talked with the demo agent" in agent["text"]


def test_clear_without_a_handoff_starts_empty(relay: LiveRelay) -> None:
    cid = relay.create(title="Nothing saved")["id"]
    new = relay.send(cid, "/clear").json()["compacted_into"]
    assert new["pending_summary"] is None and new["compacted_from_id"] == cid


def test_clear_on_an_archived_conversation_is_refused_like_compact(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    relay.send(cid, "/compact")
    for command in ("/clear", "/compact"):
        response = relay.send(cid, command)
        assert (response.status_code, response.json()) == (
            409,
            {"detail": "This conversation is archived; it cannot be compacted again."},
        )
    assert relay.get(cid)["compacted_into_id"] is not None
    assert len(relay.http.get("/api/conversations?status=archived").json()["conversations"]) == 1


def test_clear_with_text_is_an_ordinary_message(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    assert relay.send(cid, "/clear the cache").status_code == 202
    assert relay.wait_idle(cid)["status"] == "active"


def test_handoff_is_per_project_newest_wins_and_survives_a_restart(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    other = tmp_path / "data" / "other"
    other.mkdir()
    live = LiveRelay(settings).start()
    try:
        a = live.create()["id"]
        b = live.create(cwd=str(other))["id"]
        first = {"done": "one", "next": "two", "files": ["a.py"]}
        second = {"done": "three", "next": "four", "files": []}
        assert live.http.put(f"/api/conversations/{a}/handoff", json=first).status_code == 200
        put = live.http.put(f"/api/conversations/{a}/handoff", json=second)
        assert put.json()["handoff"]["source"] == "user"
        assert live.http.get(f"/api/conversations/{b}/handoff").json()["handoff"] is None
    finally:
        live.stop()
    again = LiveRelay(settings).start()
    try:
        c = again.create()["id"]  # same working directory as a
        got = again.http.get(f"/api/conversations/{c}/handoff").json()["handoff"]
        assert (got["done"], got["next"], got["files"]) == ("three", "four", [])
        new = again.send(c, "/clear").json()["compacted_into"]
        assert new["pending_summary"] == (
            "[Handoff from the previous session]\nDone: three\nNext: four\nFiles: "
        )
    finally:
        again.stop()


def test_put_handoff_refuses_bad_input_and_stores_nothing(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    url = f"/api/conversations/{cid}/handoff"
    too_long = relay.http.put(url, json={"done": "d" * 5000, "next": "n" * 4001, "files": []})
    assert too_long.status_code == 422
    assert too_long.json()["detail"].startswith("The handoff is 9,001 characters long")
    one_field = relay.http.put(url, json={"done": "d" * 9_500, "next": "", "files": []})
    assert one_field.json()["detail"].startswith("The handoff is 9,500 characters long")
    empty = relay.http.put(url, json={"done": "", "next": " ", "files": []})
    assert empty.json() == {"detail": "The handoff is empty: say what is done and what is next."}
    extra = relay.http.put(url, json={"done": "a", "next": "b", "files": [], "id": 3})
    assert extra.status_code == 422
    assert relay.http.get(url).json()["handoff"] is None
    relay.send(cid, "/compact")
    archived = relay.http.put(url, json={"done": "a", "next": "b", "files": []})
    assert archived.json() == {
        "detail": "This conversation is archived; it can be read, not changed."
    }


def test_deleting_a_conversation_keeps_the_projects_handoff(relay: LiveRelay) -> None:
    # Found by a hostile review: the handoff's link to the conversation failed the delete
    # (a foreign key: 500 every time, the conversation could never be deleted).
    cid = relay.create(title="Work")["id"]
    relay.send(cid, "please save a handoff")
    relay.wait_idle(cid)
    assert relay.http.delete(f"/api/conversations/{cid}").status_code == 204
    other = relay.create(title="Next")["id"]  # the same project (the default cwd)
    handoff = relay.http.get(f"/api/conversations/{other}/handoff").json()["handoff"]
    assert handoff["done"] == "Talked with the demo agent, which quoted every message."


class Handoffer(StandIn):
    """Calls save_handoff at once after its call's event (as the CLI does), while the storage
    writer is busy a moment with other work."""

    storage: Storage | None = None
    HANDOFF: ClassVar[dict[str, object]] = {"done": "d", "next": "n", "files": ["f.py"]}

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        assert Handoffer.storage is not None
        Handoffer.storage.submit(time.sleep, 0.3)  # another conversation's write, a slow disk
        yield TextDelta("m1", "Saving a handoff now.")
        await asyncio.sleep(0.05)
        yield MessageDone("m1", "Saving a handoff now.")
        yield Activity("t1", SAVE_HANDOFF, "call", summary="save_handoff", input=self.HANDOFF)
        tool = next(t for t in self.spec.tools if t.name == SAVE_HANDOFF)
        result = await tool.call(self.HANDOFF)
        yield Activity("t1", SAVE_HANDOFF, "result", summary="save_handoff", output=result.text)
        yield MessageDone("m2", "Done.")
        yield TurnDone()


def test_the_handoff_card_comes_after_the_call_that_saved_it(relay: LiveRelay) -> None:
    # A review: with the writer busy, the card was stored above its save_handoff call.
    Handoffer.storage = relay.supervisor.storage
    relay.supervisor.agent_factory = lambda _p, spec, _s: Handoffer(spec)
    cid = relay.create(title="Handoff order")["id"]
    assert relay.send(cid, "save a handoff").status_code == 202
    kinds = [e["data"].get("type") or e["kind"] for e in relay.wait_idle(cid)["timeline"]]
    assert kinds == ["user", "agent", "tool", "handoff", "agent"], kinds
