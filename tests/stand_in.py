"""A stand-in agent's lifecycle: nothing to start, stop or report; subclasses write turn()."""

from __future__ import annotations

from typing import Any

from app.agents.base import AgentSpec


class StandIn:
    """An agent without a process: tests and benches subclass it and say what a turn yields."""

    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec

    async def start(self) -> None:
        """Nothing to start."""

    async def interrupt(self) -> None:
        """Nothing to stop."""

    async def context_usage(self) -> dict[str, Any] | None:
        """No report."""
        return None

    def background_work(self) -> bool:
        """Never."""
        return False

    async def close(self) -> None:
        """Nothing to close."""
