"""The state every part of the Supervisor shares: set in Supervisor.__init__ (core.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from app.agents.base import Agent, AgentSpec
from app.agents.lifetime import Lifetime
from app.backup_files import Backups
from app.config import Settings
from app.hub import Hub
from app.storage import Storage
from app.supervisor.runner import Runner

if TYPE_CHECKING:
    from app.cluster.node import ClusterNode


class SupervisorState:
    """What the mixins of Supervisor read and write; each mixin calls the others through self."""

    settings: Settings
    engine: Engine
    hub: Hub
    agent_factory: Callable[[str, AgentSpec, Settings], Agent]
    runners: dict[int, Runner]
    deleting: set[int]
    storage: Storage
    backups: Backups
    lifetime: Lifetime
    agent_budget: int
    cluster: ClusterNode | None
    _reaper: asyncio.Task[None] | None
    _watch: asyncio.Task[None] | None
    _closing: bool
    _summary_reads: set[asyncio.Task[None]]
