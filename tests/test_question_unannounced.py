"""A question about a call whose row never comes is asked anyway, after ANNOUNCE_WAIT.

A question about an announced call waits for that call's row (so it stands below the text
that led to it; tests/test_claude_question_order.py). If the row never comes, the question
must still reach the user, once the wait is over, and its answer must still reach the agent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.agents.base import AgentEvent, MessageDone, PermissionRequest, TurnDone
from app.supervisor.runner import ANNOUNCE_WAIT
from tests.relay import LiveRelay, make_settings
from tests.stand_in import StandIn

TOOL_ID = "toolu_never_announced"


class UnannouncedAgent(StandIn):
    """Says what it will run, then asks about a call it says it announced but never did."""

    asked_at: float | None = None

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """A message, the question (no Activity call before it), then the answer it got."""
        yield MessageDone("before", "I will list the files.")
        request = PermissionRequest("Bash", {"command": "ls"}, TOOL_ID, announced=True)
        UnannouncedAgent.asked_at = time.monotonic()
        decision = await self.spec.ask_permission(request)
        yield MessageDone("after", f"allowed: {decision.allow}")
        yield TurnDone()


def _question(view: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (e for e in view["timeline"] if e["data"].get("type") == "permission"),
        None,
    )


def test_a_question_whose_call_never_comes_is_asked_after_the_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.supervisor.turns")
    with LiveRelay(make_settings(tmp_path / "data")) as live:
        live.supervisor.agent_factory = lambda _provider, spec, _settings: UnannouncedAgent(spec)
        cid = live.create(title="unannounced")["id"]
        assert live.send(cid, "go").status_code == 202

        view = live.wait_for(cid, lambda v: _question(v) is not None, timeout=ANNOUNCE_WAIT + 20)
        shown = time.monotonic()
        question = _question(view)
        assert question is not None and question["state"] == "pending"
        assert question["data"]["tool_id"] == TOOL_ID
        # It waited for the call's row all the time it may, and not forever.
        assert UnannouncedAgent.asked_at is not None
        assert shown - UnannouncedAgent.asked_at >= ANNOUNCE_WAIT - 0.05
        # Below what the agent said before asking.
        texts = [e["text"] for e in view["timeline"]]
        assert texts.index("I will list the files.") < texts.index(question["text"])

        answer = live.http.post(
            f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": True}
        )
        assert answer.status_code == 200, answer.text
        view = live.wait_idle(cid)
        assert view["timeline"][-1]["text"] == "allowed: True"
        assert _question(view)["state"] != "pending"  # type: ignore[index]

    assert any(
        f"asked about tool call {TOOL_ID} before announcing it" in record.getMessage()
        for record in caplog.records
    )
