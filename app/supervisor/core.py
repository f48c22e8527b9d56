"""The Supervisor: its parts put together, its lifecycle, and what routes and the cluster ask.

Supervisor owns every conversation's Runner (runner.py). Its behaviour is split by what it
does, one mixin a module (docs/architecture.md): commands.py (what routes call), turns.py
(delivery, one turn at a time), events.py (agent events stored and published), timeline.py
(the timeline writer), pool.py (agent processes), recovery.py (after a restart),
backup_hooks.py (backup jobs). Mixins, not objects: the methods call each other through
self, as they did in one class.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app import store
from app.agents.base import Agent, AgentSpec, PermissionDecision
from app.agents.lifetime import Lifetime
from app.backup_files import Backups
from app.config import Settings
from app.db import get_session
from app.hub import Hub
from app.models import Conversation, Entry
from app.providers import make_agent
from app.storage import Storage
from app.supervisor.backup_hooks import BackupHooks
from app.supervisor.commands import Commands
from app.supervisor.events import Events
from app.supervisor.pool import SHUTDOWN_WORK_LINE, Pool
from app.supervisor.recovery import TAKEN_OVER, Recovery
from app.supervisor.runner import Runner, TurnState
from app.supervisor.timeline import Timeline
from app.supervisor.turns import Turns

if TYPE_CHECKING:
    from app.cluster.node import ClusterNode


class Supervisor(Commands, Turns, Events, Timeline, Pool, Recovery, BackupHooks):
    """Owns every conversation's runner; the HTTP and WebSocket layers call into it."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        hub: Hub,
        agent_factory: Callable[[str, AgentSpec, Settings], Agent] = make_agent,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.hub = hub
        self.agent_factory = agent_factory
        self.runners: dict[int, Runner] = {}
        # Every database call runs in its threads; the loop only awaits (docs/architecture.md).
        self.storage = Storage(engine)
        hub.soon = self.storage.soon
        self.backups = Backups(settings.resolved_backups_dir, engine, self._on_backup)
        self._reaper: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None  # the live agents' project settings
        self._closing = False
        # Conversations whose delete began here: no message, Resend, warm-up or wake-up starts
        # anything for them any more (an id is never given again: migration 0010).
        self.deleting: set[int] = set()
        self._summary_reads: set[asyncio.Task[None]] = set()
        self.lifetime = Lifetime(settings.resolved_data_dir)  # agents end with this relay
        self.agent_budget = settings.agent_budget  # bytes; read once (MemTotal by default)
        # Several nodes (app/cluster/): this node runs only the conversations it holds a lease of.
        self.cluster: ClusterNode | None = None

    async def start(self) -> None:
        """Recover from a previous run, deliver what was queued, start the idle reaper."""
        self.lifetime.start()  # kills the agent processes a crash left running, first
        self.storage.start()
        if self.cluster is not None:  # recovery comes with each lease taken (node.py)
            await self.cluster.start()
        else:
            await self.storage.write(self._recover_all)
        self._reaper = asyncio.create_task(self._reap_idle())
        self._watch = asyncio.create_task(self._watch_settings())

    async def stop(self) -> None:
        """Interrupt running turns, keep what was streamed, stop every agent."""
        self._closing = True
        for task in (self._reaper, self._watch):
            if task is not None:
                task.cancel()
        for read in self._summary_reads:
            read.cancel()
        warming = [r.warming for r in self.live_runners() if r.warming and not r.warming.done()]
        for task in warming:  # no agent may start after the ones below are closed
            task.cancel()
        if warming:
            await asyncio.wait(warming, timeout=5)
        for runner in self.live_runners():
            if runner.task and not runner.task.done():
                with contextlib.suppress(Exception):
                    await self._interrupt_agent(runner)
        tasks = [r.task for r in self.live_runners() if r.task and not r.task.done()]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2)
        for runner in self.live_runners():
            await self._stop_with_work(runner, SHUTDOWN_WORK_LINE)
        await self._settle_shutdown_cuts()  # (each agent's record is whole now)
        await self.backups.drain()
        await self.lifetime.stop()  # and what they left running (tool commands)
        if self.cluster is not None:
            await self.cluster.stop()  # leases given back: other nodes take the queues
        await self.storage.stop()

    def session(self) -> Session:
        """A database session."""
        return get_session(self.engine)

    def _load(self, session: Session, conversation_id: int) -> Conversation:
        """A conversation that must exist (its runner is running)."""
        conversation = store.get_conversation(session=session, conversation_id=conversation_id)
        if conversation is None:
            raise LookupError(f"conversation {conversation_id} is gone")
        self.hub.prime(conversation_id)  # numbered later on the loop: loaded here, in a thread
        return conversation

    def _fetch(self, conversation_id: int) -> Conversation:
        """A conversation that must exist, in a session of its own (run in a storage thread)."""
        with self.session() as session:
            return self._load(session, conversation_id)

    async def _conversation(self, conversation_id: int) -> Conversation:
        """A conversation that must exist, read off the loop."""
        return await self.storage.read(self._fetch, conversation_id)

    def live_runners(self) -> list[Runner]:
        """The runners now, as a list: storage threads add runners (a message's job wakes its
        conversation) while the loop goes through them, so never iterate the dict itself.
        dict.copy() copies in one step; list(d.items()) builds tuples, and a garbage
        collection meanwhile can run Python code and let another thread in."""
        return list(self.runners.copy().values())

    def runner(self, conversation_id: int) -> Runner:
        """The runner of a conversation (created on first use)."""
        runner = self.runners.get(conversation_id)
        if runner is None:  # setdefault: a storage thread and the loop may both get here
            runner = self.runners.setdefault(conversation_id, Runner(conversation_id))
        return runner

    # -- what routes and the cluster ask (they never reach into a runner) ---------------------

    def turn_running(self, conversation: Conversation) -> bool:
        """True while a turn of the conversation runs (the 🧠 modal's word).

        Its runner says, or, when another node of a cluster runs it, the stored flag.
        """
        conversation_id = conversation.id or 0
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            return conversation.turn_active
        runner = self.runners.get(conversation_id)
        return bool(runner and runner.state != TurnState.IDLE)

    def delivering(self, conversation_id: int) -> bool:
        """True while the conversation's runner here has its delivery (or recovery) task."""
        runner = self.runners.get(conversation_id)
        return runner is not None and runner.task is not None and not runner.task.done()

    def holds_nothing(self, conversation_id: int) -> bool:
        """Nothing of the conversation is live here: no agent, turn, start or open question."""
        runner = self.runners.get(conversation_id)
        if runner is None:
            return True
        return (
            runner.agent is None
            and runner.state == TurnState.IDLE
            and not (runner.task is not None and not runner.task.done())
            and not (runner.warming is not None and not runner.warming.done())
            and not runner.starting
            and not runner.questions
            and not runner.cut_by_shutdown  # settled here once its agent stopped (Recovery)
        )

    def recover(self, session: Session, conversation: Conversation) -> None:
        """Close what an earlier owner left open in a conversation (a cluster node taking it
        over: its lines say the node stopped or stalled), and resume it."""
        self._recover(session, conversation, TAKEN_OVER)

    def wake(self, conversation_id: int) -> None:
        """Have the conversation's queue delivered (here, or by the node that runs it)."""
        self._wake(conversation_id)

    def add_line(
        self,
        session: Session,
        conversation: Conversation,
        text: str,
        *,
        level: str = "info",
        data: dict[str, Any] | None = None,
    ) -> Entry:
        """Store a line in the conversation's timeline and publish it."""
        return self._line(session, conversation, text, level=level, data=data)

    def open_questions(self, conversation_ids: Iterable[int]) -> dict[int, int]:
        """The permission questions runners here wait on: entry id to conversation id."""
        return {
            entry_id: cid
            for cid in conversation_ids
            if (runner := self.runners.get(cid)) is not None
            for entry_id in list(runner.questions)  # (a copy: answers pop it in the writer)
        }

    def running_prompts(self, conversation_ids: Iterable[int]) -> dict[int, str]:
        """The prompt ids of the turns runners here run: conversation id to prompt id."""
        return {
            cid: runner.prompt_id
            for cid in conversation_ids
            if (runner := self.runners.get(cid)) is not None
            and runner.state != TurnState.IDLE
            and runner.prompt_id is not None
        }

    def settle_question(
        self, conversation_id: int, entry_id: int, decision: PermissionDecision
    ) -> None:
        """Answer an open permission question of a runner here (an answer taken elsewhere)."""
        runner = self.runners.get(conversation_id)
        future = runner.questions.pop(entry_id, None) if runner else None
        if future is not None and not future.done():
            future.set_result(decision)

    def retire_here(self, conversation_id: int) -> None:
        """Stop the agent of a conversation compacted on another node, once its turn is over."""
        runner = self.runners.get(conversation_id)
        if runner is not None:
            runner.archived = True  # released by the reaper once its last turn has ended
        self._retire_now(conversation_id)

    async def forget_here(self, conversation_id: int) -> None:
        """Drop a conversation deleted on another node: its runner, agent and recent events.

        (An agent a warm-up is starting is closed by the warm-up once started: _warm.)
        """
        runner = self.runners.pop(conversation_id, None)
        if runner is not None:
            await self._interrupt_agent(runner)
            await self._close_agent(runner, publish=False)  # its stream and counter are gone
        self.hub.release(conversation_id)

    async def drop_agent(self, conversation_id: int) -> None:
        """Stop the conversation's turn and agent here (its lease went to another node)."""
        runner = self.runners.get(conversation_id)
        if runner is not None:
            await self._interrupt_agent(runner)
            await self._close_agent(runner)
