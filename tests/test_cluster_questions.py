"""A permission question answered on a node that does not run the agent (PostgreSQL + Redis).

The answer is stored where it is taken and reaches the owner on the control channel, which
delivers at most once: a notice lost on the way is made up for by the owner's heartbeat, and
answers taken on two nodes at once come one after the other (the first wins, the other 409).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.agents.base import AgentEvent, MessageDone, PermissionRequest, TurnDone
from tests.crash import TIMEOUT
from tests.redis import control_forbidden
from tests.relay import LiveRelay
from tests.stand_in import StandIn
from tests.test_api import STOPPED_QUESTION, LingeringAsker, lingering
from tests.test_browser_races import pending_question
from tests.test_claude_relay import QUESTIONS
from tests.test_cluster_control import until
from tests.test_cluster_races import Pause, started_nodes, two_nodes  # noqa: F401 - fixture
from tests.test_waiting import announced, listed

QUICK_LEASE = 3.0  # seconds: a heartbeat every second


@pytest.fixture
def quick_nodes(tmp_path: Path) -> Iterator[tuple[LiveRelay, LiveRelay]]:
    """Nodes x and y whose heartbeats come every second."""
    with started_nodes(tmp_path, QUICK_LEASE) as nodes:
        yield nodes


def answer(relay: LiveRelay, cid: int, entry_id: int, **body: Any) -> httpx.Response:
    return relay.http.post(f"/api/conversations/{cid}/permissions/{entry_id}", json=body)


def tool_output(view: dict[str, Any]) -> Any:
    """The output of the demo's tool call, which ran (or not) after the answer."""
    return next(e["data"]["output"] for e in view["timeline"] if e["data"].get("type") == "tool")


def test_an_answer_whose_notice_is_lost_still_reaches_the_owner(
    quick_nodes: tuple[LiveRelay, LiveRelay], caplog: pytest.LogCaptureFixture
) -> None:
    """y runs the agent; x takes the answer while nobody listens on the control channel."""
    x, y = quick_nodes
    cid = y.create(title="Asked on y")["id"]
    assert y.send(cid, "ask permission").status_code == 202
    question = pending_question(y, cid)
    assert cid in y.supervisor.cluster.held
    # x's notice to y cannot be published (x logs it).
    forbidden = control_forbidden(y.settings.redis_url or "")
    with forbidden, caplog.at_level(logging.WARNING, logger="app.cluster.node"):
        response = answer(x, cid, question, allow=False, message="not on a Friday")
        tried = f"cannot send answer for conversation {cid}"
        until(lambda: tried in caplog.text, "x never tried to send its notice")
    assert response.status_code == 200, response.text
    view = y.wait_idle(cid, timeout=TIMEOUT)
    assert tool_output(view) == "not on a Friday"
    assert [e["state"] for e in view["timeline"] if e["id"] == question] == ["denied"]


def test_answers_on_two_nodes_at_once_the_first_wins(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """x's answer is held between reading the question and storing its answer; y answers."""
    x, y = two_nodes
    cid = y.create(title="Asked twice")["id"]
    assert y.send(cid, "ask permission").status_code == 202
    question = pending_question(y, cid)
    pause = Pause(x, lambda statement, _params: statement.startswith("UPDATE entry"))
    pause.armed = True
    first: list[httpx.Response] = []
    allowing = threading.Thread(target=lambda: first.append(answer(x, cid, question, allow=True)))
    allowing.start()
    try:
        assert pause.reached.wait(TIMEOUT), "x's answer never came to storing"
        second: list[httpx.Response] = []
        denying = threading.Thread(
            target=lambda: second.append(answer(y, cid, question, allow=False))
        )
        denying.start()
        time.sleep(1)  # y's answer, unless it waits for x's, is taken by now
    finally:
        pause.release.set()
    allowing.join(TIMEOUT)
    denying.join(TIMEOUT)
    assert [first[0].status_code, second[0].status_code] == [200, 409], second[0].text
    assert second[0].json() == {"detail": "This question was already answered (allowed)."}
    view = y.wait_idle(cid, timeout=TIMEOUT)
    assert [e["state"] for e in view["timeline"] if e["id"] == question] == ["allowed"]
    assert tool_output(view) == "created demo.txt (not really: this is the demo)"


class QuestionAsker(StandIn):
    """Asks the user questions (AskUserQuestion); replies with the answers it got."""

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """The questions, then the answers as its reply."""
        decision = await self.spec.ask_permission(
            PermissionRequest("AskUserQuestion", QUESTIONS, "q1")
        )
        yield MessageDone("m1", json.dumps(decision.answers, sort_keys=True))
        yield TurnDone()


@pytest.mark.parametrize("lost", [False, True], ids=["notice", "notice-lost"])
def test_the_agent_s_questions_answered_on_another_node_get_their_answers(
    quick_nodes: tuple[LiveRelay, LiveRelay], lost: bool
) -> None:
    """y runs the agent, x takes the answers: on the control channel, or by y's heartbeat."""
    x, y = quick_nodes
    y.supervisor.agent_factory = lambda _p, spec, _s: QuestionAsker(spec)
    cid = y.create(title="Asked on y")["id"]
    assert y.send(cid, "ask").status_code == 202
    question = pending_question(y, cid)
    answers = {"Which database should I use?": "SQLite", "Which tests should I write?": "Unit"}
    forbidden = control_forbidden(y.settings.redis_url or "") if lost else contextlib.nullcontext()
    with forbidden:
        response = answer(x, cid, question, allow=True, answers=answers)
        assert response.status_code == 200, response.text
        view = y.wait_idle(cid, timeout=TIMEOUT)
    assert view["timeline"][-1]["text"] == json.dumps(answers, sort_keys=True)


def lingering_question(y: LiveRelay, title: str) -> tuple[int, int]:
    """A conversation on y whose turn asks, then lingers until LingeringAsker.go_on; its id and
    the question's."""
    cid, question = lingering(y, title=title)
    return cid, question["id"]


def test_an_answer_on_another_node_after_stop_is_refused(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """y's turn lingers after Stop denied its question; x takes an answer meanwhile."""
    x, y = two_nodes
    cid, question = lingering_question(y, "Stopped on y")
    assert x.http.post(f"/api/conversations/{cid}/interrupt").json() == {"interrupted": True}
    y.wait_for(cid, lambda v: any(e["text"] == "allowed: False" for e in v["timeline"]))
    try:  # expired by the Stop, while the turn still runs (before: at its end only)
        x.wait_for(
            cid, lambda v: [e["state"] for e in v["timeline"] if e["id"] == question] == ["expired"]
        )
        late = answer(x, cid, question, allow=True)
        assert (late.status_code, late.json()) == (409, {"detail": STOPPED_QUESTION})
    finally:
        LingeringAsker.go_on.set()
    view = y.wait_idle(cid, timeout=TIMEOUT)
    expired = [(e["state"], e["data"]["expired"]) for e in view["timeline"] if e["id"] == question]
    assert expired == [("expired", "the turn was stopped")]


def test_an_answer_taken_elsewhere_before_stop_is_what_the_agent_gets(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """x stores "allow" while its notice to y is lost; then Stop on y: the agent gets the
    stored answer, as every tab shows it (before: Stop denied it; the timeline said allowed)."""
    x, y = two_nodes
    cid, question = lingering_question(y, "Answered, then stopped")
    try:
        with control_forbidden(y.settings.redis_url or ""):
            assert answer(x, cid, question, allow=True).status_code == 200
        assert y.http.post(f"/api/conversations/{cid}/interrupt").json() == {"interrupted": True}
        view = y.wait_for(
            cid, lambda v: any(e["text"].startswith("allowed:") for e in v["timeline"])
        )
    finally:
        LingeringAsker.go_on.set()
    assert [e["text"] for e in view["timeline"] if e["text"].startswith("allowed:")] == [
        "allowed: True"
    ]
    view = y.wait_idle(cid, timeout=TIMEOUT)
    assert [e["state"] for e in view["timeline"] if e["id"] == question] == ["allowed"]


def test_a_question_waits_in_every_node_s_list_until_answered_on_another(
    quick_nodes: tuple[LiveRelay, LiveRelay],
) -> None:
    """y runs the agent and asks; a tab on x hears it wait, and stop waiting once x answers."""
    x, y = quick_nodes
    cid = y.create(title="Asked on y")["id"]
    with x.socket() as ws:
        assert y.send(cid, "ask permission").status_code == 202
        question = pending_question(y, cid)
        assert announced(ws, cid, 1)["running"] is True
        assert (listed(x)[cid], listed(y)[cid]) == (1, 1)
        assert answer(x, cid, question, allow=True).status_code == 200
        announced(ws, cid, 0)
    y.wait_idle(cid, timeout=TIMEOUT)
    assert (listed(x)[cid], listed(y)[cid]) == (0, 0)


class AsksThenEnds(StandIn):
    """Asks permission, then ends its turn when the test says, the question unanswered."""

    end = threading.Event()

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """The question asked, not waited for; the end, once the test lets it come."""
        asking = asyncio.ensure_future(self.spec.ask_permission(PermissionRequest("Bash", {}, "t")))
        await asyncio.to_thread(AsksThenEnds.end.wait, 30)
        yield TurnDone()
        await asking  # denied by the turn's end


def test_an_answer_on_another_node_as_the_turn_ends_stands_and_is_counted_once(
    two_nodes: tuple[LiveRelay, LiveRelay],  # noqa: F811
) -> None:
    """Found by a hostile review: y's turn end read the pending question, x's answer was
    stored, then y marked it expired over the answer and counted it off again (-1: the
    sidebar never said "needs you" for that conversation's next question)."""
    x, y = two_nodes
    y.supervisor.agent_factory = lambda _p, spec, _s: AsksThenEnds(spec)
    AsksThenEnds.end.clear()
    cid = y.create(title="Ends while answered")["id"]
    assert y.send(cid, "go").status_code == 202
    question = pending_question(y, cid)
    pause = Pause(y, lambda _statement, params: "pending" in str(params), after=True)
    pause.armed = True
    AsksThenEnds.end.set()  # y's turn ends: its writer reads the pending question, and waits
    assert pause.reached.wait(TIMEOUT)
    try:
        assert answer(x, cid, question, allow=True).status_code == 200
    finally:
        pause.release.set()
    view = y.wait_idle(cid, timeout=TIMEOUT)
    assert [e["state"] for e in view["timeline"] if e["id"] == question] == ["allowed"]
    assert (listed(x)[cid], listed(y)[cid]) == (0, 0)
