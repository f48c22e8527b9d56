"""The answers to the agent's own questions (AskUserQuestion), checked before they are stored."""

from __future__ import annotations

import re

import pytest

from app.agents.base import PermissionDecision
from app.questions import (
    ANSWER_ALL,
    KEPT_PLANNING,
    NOT_A_PLAN,
    NOT_A_QUESTION,
    PLAN_MODE_ONLY,
    asked,
    checked_answers,
    checked_mode,
    decision_of,
)

INPUT = {
    "questions": [
        {"question": "Which database?", "options": [{"label": "SQLite"}], "multiSelect": False},
        {"question": "Which tests?", "options": [{"label": "Unit"}], "multiSelect": True},
    ]
}
ASKED = {"type": "permission", "tool": "AskUserQuestion", "input": INPUT}


def test_the_questions_asked_are_read_from_the_input() -> None:
    assert asked(INPUT) == ["Which database?", "Which tests?"]
    assert asked({"questions": "no"}) == [] == asked(None) == asked({"command": "ls"})
    assert asked({"questions": [{"question": 3}, "x", {"question": "Why?"}]}) == ["Why?"]


def test_every_question_needs_an_answer_and_only_those() -> None:
    answers = {"Which tests?": " Unit, Browser ", "Which database?": "SQLite"}
    # In the order asked, trimmed.
    assert list(checked_answers(ASKED, True, answers) or {}) == ["Which database?", "Which tests?"]
    assert (checked_answers(ASKED, True, answers) or {})["Which tests?"] == "Unit, Browser"
    # As stored and shown (found by a hostile review: the agent got the noncharacter itself).
    marked = answers | {"Which database?": "SQL\ufdd0ite"}
    assert (checked_answers(ASKED, True, marked) or {})["Which database?"] == "SQL\ufffdite"
    for wrong, error in (
        (None, ANSWER_ALL),
        ({"Which database?": "SQLite"}, ANSWER_ALL),
        ({"Which database?": "SQLite", "Which tests?": " \n"}, ANSWER_ALL),
        (answers | {"Who?": "me"}, "The agent did not ask: Who?"),
    ):
        with pytest.raises(ValueError, match=re.escape(error)):
            checked_answers(ASKED, True, wrong)


def test_a_skip_takes_no_answers_and_other_tools_none() -> None:
    assert checked_answers(ASKED, False, None) is None
    assert checked_answers(ASKED, False, {}) is None
    with pytest.raises(ValueError, match=re.escape("A skipped question takes no answers.")):
        checked_answers(ASKED, False, {"Which database?": "SQLite"})
    bash = {"type": "permission", "tool": "Bash", "input": {"command": "ls"}}
    assert checked_answers(bash, True, None) is None
    with pytest.raises(ValueError, match=re.escape(NOT_A_QUESTION)):
        checked_answers(bash, True, {"x": "y"})
    with pytest.raises(ValueError, match=re.escape(ANSWER_ALL)):  # asks nothing readable
        checked_answers({"tool": "AskUserQuestion", "input": {}}, True, {})


def test_a_stored_answer_is_the_decision_it_was() -> None:
    data = ASKED | {"answers": {"Which database?": "SQLite"}, "answer_message": ""}
    assert decision_of("allowed", data) == PermissionDecision(
        True, "", answers={"Which database?": "SQLite"}
    )
    assert decision_of("denied", ASKED | {"answer_message": "no"}) == PermissionDecision(
        False, "no"
    )


def test_only_an_approved_plan_takes_a_mode_and_only_one_that_asks_before_commands() -> None:
    plan = {"type": "permission", "tool": "ExitPlanMode", "input": {"plan": "1. Do it"}}
    write = {"type": "permission", "tool": "Write", "input": {}}
    assert [checked_mode(plan, True, m) for m in ("default", "acceptEdits", None)] == [
        "default",
        "acceptEdits",
        None,
    ]
    assert checked_mode(plan, False, None) is None
    for data, allow, mode, why in (
        (write, True, "default", NOT_A_PLAN),
        (plan, False, "acceptEdits", KEPT_PLANNING),
        (plan, True, "bypassPermissions", PLAN_MODE_ONLY),
        (plan, True, "plan", PLAN_MODE_ONLY),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            checked_mode(data, allow, mode)


def test_an_approved_plan_s_mode_is_in_its_stored_decision() -> None:
    # The owner node settles a question answered elsewhere from what was stored.
    plan = {"tool": "ExitPlanMode", "approved_mode": "acceptEdits"}
    assert decision_of("allowed", plan) == PermissionDecision(True, mode="acceptEdits")
    assert decision_of("allowed", {**plan, "approved_mode": "bypassPermissions"}).mode is None
