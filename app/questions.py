"""The agent's own questions to the user (Claude Code's AskUserQuestion): their answers.

The question comes as a permission request for the tool; the user's answers go back as the
tool's input with an "answers" map (question text → the chosen labels joined by ", ", or the
user's own words), which the CLI hands to the model as the tool's result.
"""

from __future__ import annotations

from typing import Any

from app.agents.base import PermissionDecision
from app.store import storable

QUESTION_TOOL = "AskUserQuestion"
NOT_A_QUESTION = "Only a question of the agent's (AskUserQuestion) takes answers."
ANSWER_ALL = "Answer every question (or skip them all)."
PLAN_TOOL = "ExitPlanMode"  # Claude Code's plan, asked to be approved: plan mode ends with it
PLAN_MODES = ("default", "acceptEdits")  # what an approved plan goes on in
NOT_A_PLAN = "Only the approval of a plan (ExitPlanMode) takes a mode."
PLAN_MODE_ONLY = "An approved plan goes on in mode default or acceptEdits."
KEPT_PLANNING = "A plan kept in planning takes no mode."
# Why a question expired unanswered (its entry's data "expired"; the UI shows "Expired: …").
EXPIRED_STOPPED = "the turn was stopped"
EXPIRED_ENDED = "the turn ended"
EXPIRED_AGENT = "the agent was stopped"
EXPIRED_SHUTDOWN = "the relay was shut down"
EXPIRED_RESTART = "the relay restarted"  # after a crash
EXPIRED_TAKEOVER = "the node running the turn stopped or stalled"  # a cluster's takeover


def asked(tool_input: Any) -> list[str]:
    """The question texts of an AskUserQuestion call's input, in order."""
    questions = tool_input.get("questions") if isinstance(tool_input, dict) else None
    if not isinstance(questions, list):
        return []
    texts = [q.get("question") for q in questions if isinstance(q, dict)]
    return [t for t in texts if isinstance(t, str)]


def checked_answers(
    entry_data: dict[str, Any], allow: bool, answers: dict[str, str] | None
) -> dict[str, str] | None:
    """The answers to store for a question entry, checked (ValueError: what is wrong).

    An AskUserQuestion answered (allow) needs one non-blank answer per question it asked,
    and none to another; skipped (not allow) it takes none. Other tools take none.
    """
    if entry_data.get("tool") != QUESTION_TOOL:
        if answers is not None:
            raise ValueError(NOT_A_QUESTION)
        return None
    if not allow:
        if answers:
            raise ValueError("A skipped question takes no answers.")
        return None
    questions = asked(entry_data.get("input"))
    given = {q: storable(a.strip()) for q, a in (answers or {}).items()}  # as stored and shown
    unknown = [q for q in given if q not in questions]
    if unknown:
        raise ValueError(f"The agent did not ask: {unknown[0][:200]}")
    if not questions or any(not given.get(q) for q in questions):
        raise ValueError(ANSWER_ALL)
    return {q: given[q] for q in questions}


def checked_mode(entry_data: dict[str, Any], allow: bool, mode: str | None) -> str | None:
    """The mode an answer approves a plan with, checked (ValueError: what is wrong): only a
    plan's question takes one, only when approved, only a mode that asks before commands."""
    if mode is None:
        return None
    if entry_data.get("tool") != PLAN_TOOL:
        raise ValueError(NOT_A_PLAN)
    if not allow:
        raise ValueError(KEPT_PLANNING)
    if mode not in PLAN_MODES:
        raise ValueError(PLAN_MODE_ONLY)
    return mode


def decision_of(state: str, entry_data: dict[str, Any]) -> PermissionDecision:
    """The decision a stored, answered question carries (answered on another node...)."""
    answers = entry_data.get("answers")
    mode = entry_data.get("approved_mode")
    return PermissionDecision(
        state == "allowed",
        str(entry_data.get("answer_message") or ""),
        answers=dict(answers) if isinstance(answers, dict) else None,
        mode=mode if mode in PLAN_MODES else None,
    )
