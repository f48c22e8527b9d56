"""What the Claude Code and Copilot adapters share: text helpers, permission asking, turn flags."""

from __future__ import annotations

import json
import logging
import signal
from typing import Any

from app.agents.base import AgentEvent, AgentSpec, PermissionDecision, PermissionRequest

log = logging.getLogger(__name__)

DENIED = "Denied by the user in oarlock"
MAX_OUTPUT = 2000


def one_line(text: str, limit: int = 200) -> str:
    """Return text's first line, whitespace collapsed, cut to limit characters."""
    line = " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def exit_status(code: int) -> str:
    """How a process ended, from its return code: "exit code 1", or "killed by SIGKILL" for
    the -9 asyncio gives a process a signal ended."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def shorten(text: str, limit: int = MAX_OUTPUT) -> str:
    """Cut text to limit characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… ({len(text) - limit} more characters)"


def summarize(arguments: Any, keys: tuple[str, ...]) -> str:
    """Return a one-line summary of a tool call's arguments: the first of keys it has."""
    if not isinstance(arguments, dict):
        return one_line(str(arguments)) if arguments else ""
    for key in keys:
        if isinstance(value := arguments.get(key), str) and value.strip():
            return one_line(value)
    return one_line(json.dumps(arguments, ensure_ascii=False)) if arguments else ""


async def ask_user(spec: AgentSpec, request: PermissionRequest) -> PermissionDecision:
    """Ask the relay for a permission decision; a refusal always carries a message."""
    try:
        decision: PermissionDecision = await spec.ask_permission(request)
    except Exception as e:
        log.exception("asking permission for %s failed", request.tool_name)
        return PermissionDecision(False, f"Could not ask the user: {e}")
    if decision.allow:
        return decision
    return PermissionDecision(False, decision.message or DENIED)


class TurnFlags:
    """An adapter's turn bookkeeping: events to yield at the next turn, and the turn's flags."""

    def _init_turn_flags(self) -> None:
        self._pending: list[AgentEvent] = []  # yielded at the start of the next turn
        self._in_turn = False
        self._stop_early = False  # interrupt() came before the prompt was sent
        self._turn_asked = False  # turn() was called, its prompt not sent yet
        self._dirty = False  # a turn was abandoned midway: its leftovers go before the next
        self._closing = False  # close() is stopping the process, maybe under a turn

    def _take_pending(self) -> list[AgentEvent]:
        events, self._pending = self._pending, []
        return events
