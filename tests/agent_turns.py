"""Helpers for tests that drive an agent adapter directly: run a turn, pick its events."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from app.agents.base import (
    Agent,
    AgentEvent,
    CompactionFailed,
    CompactionFinished,
    CompactionStarted,
    PermissionDecision,
    PermissionRequest,
    TurnDone,
)

TURN_TIMEOUT = 30  # seconds a turn may take before the test fails instead of hanging


async def allow_all(request: PermissionRequest) -> PermissionDecision:
    """A permission callback that allows everything."""
    return PermissionDecision(allow=True)


async def run_turn(
    agent: Agent,
    prompt: str,
    on_event: Callable[[AgentEvent], Awaitable[None]] | None = None,
) -> list[AgentEvent]:
    """Every event of one turn, with a hook called on each as it arrives."""
    events: list[AgentEvent] = []
    async with asyncio.timeout(TURN_TIMEOUT):
        async for event in agent.turn(prompt):
            events.append(event)
            if on_event is not None:
                await on_event(event)
    return events


def of(events: list[AgentEvent], kind: type) -> list[Any]:
    """The events of one type."""
    return [e for e in events if isinstance(e, kind)]


def done(events: list[AgentEvent]) -> TurnDone:
    """The turn's TurnDone: the last event, and the only one."""
    assert isinstance(events[-1], TurnDone), events
    assert of(events, TurnDone) == [events[-1]]
    return events[-1]


def compactions(events: list[AgentEvent]) -> list[AgentEvent]:
    """The compaction events, in order."""
    kinds = (CompactionStarted, CompactionFinished, CompactionFailed)
    return [e for e in events if isinstance(e, kinds)]
