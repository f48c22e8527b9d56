"""One runner per conversation: stores messages, delivers them to the agent, records its events.

A user message is stored (state "queued") before it is acknowledged. The
conversation's runner delivers queued messages one turn at a time, in order,
and turns every agent event into stored entries and live events for the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app import store
from app.agent_memory import Live, largest, to_stop, tree_rss
from app.agents.base import (
    Activity,
    Agent,
    AgentEvent,
    AgentSpec,
    CompactionFailed,
    CompactionFinished,
    CompactionStarted,
    MessageDone,
    Notice,
    PermissionDecision,
    PermissionRequest,
    SessionStarted,
    TextDelta,
    TurnDone,
    Usage,
)
from app.agents.lifetime import Lifetime
from app.backup_files import Backups, Job, Outcome
from app.backups import PRECOMPACT_AUTO, PRECOMPACT_MANUAL, tool_facts
from app.compaction import failed_text, finished_text, started_text
from app.config import Settings
from app.db import get_session, wait_until_writable, write_lock_free
from app.hub import Hub
from app.limits import give_back_memory
from app.models import Conversation, Entry
from app.providers import agent_env, compaction_style, make_agent
from app.summary import SummaryMessage, build_summary, compose_first_message
from app.views import conversation_view, effective_window, entry_view
from app.window import ENV_VAR, restart_line

log = logging.getLogger(__name__)

REFRESH_SECONDS = 3.0  # the longest the 🧠 modal waits for the agent's own report
CHECKPOINT_SECONDS = 1.0  # streamed text is written to the database at least this often
TIMELINE_PAGE = 200
COMPACT_COMMAND = "/compact"
SHUTDOWN_LINE = "Interrupted: the relay was shut down."
RESTART_LINE = "The relay restarted while this turn was running; its reply may be incomplete."


class ConversationError(Exception):
    """A request the conversation's state does not allow (HTTP 409)."""


def is_compact_command(text: str) -> bool:
    """True when the whole message is the /compact command."""
    return text.strip() == COMPACT_COMMAND


@dataclass
class Streaming:
    """An agent message being written."""

    entry: Entry
    parts: list[str] = field(default_factory=list)  # joined only when read: no copy per delta
    checkpoint_at: float = field(default_factory=time.monotonic)

    @property
    def text(self) -> str:
        """The text written so far."""
        return "".join(self.parts)


@dataclass
class Runner:
    """A conversation's live state: its agent, its turn, its open questions."""

    conversation_id: int
    agent: Agent | None = None
    task: asyncio.Task[None] | None = None
    state: str = "idle"  # idle | running | compacting
    streaming: dict[str, Streaming] = field(default_factory=dict)
    tools: dict[str, Entry] = field(default_factory=dict)
    compaction: Entry | None = None
    questions: dict[int, asyncio.Future[PermissionDecision]] = field(default_factory=dict)
    last_agent_entry: Entry | None = None
    context_report: dict[str, Any] | None = None  # what the agent last said of its window
    reporting: asyncio.Task[None] | None = None
    reported_agent: Agent | None = None  # the agent process the last report came from
    lines_shown: set[str] = field(default_factory=set)  # this turn's notice lines
    last_used: float = field(default_factory=time.monotonic)
    archived: bool = False  # released as soon as it is idle
    warming: asyncio.Task[None] | None = None  # an agent started before its message (warm)
    starting: bool = False  # the agent's process is being started


class Supervisor:
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
        self.backups = Backups(settings.resolved_data_dir / "backups", engine, self._on_backup)
        self._reaper: asyncio.Task[None] | None = None
        self._closing = False
        self.lifetime = Lifetime(settings.resolved_data_dir)  # agents end with this relay
        self.agent_budget = settings.agent_budget  # bytes; read once (MemTotal by default)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover from a previous run, deliver what was queued, start the idle reaper."""
        self.lifetime.start()  # kills the agent processes a crash left running, first
        with self.session() as session:
            for conversation in store.conversations_with_work(session=session):
                self._recover(session, conversation)
        self._reaper = asyncio.create_task(self._reap_idle())

    async def stop(self) -> None:
        """Interrupt running turns, keep what was streamed, stop every agent."""
        self._closing = True
        if self._reaper:
            self._reaper.cancel()
        warming = [r.warming for r in self.runners.values() if r.warming and not r.warming.done()]
        for task in warming:  # no agent may start after the ones below are closed
            task.cancel()
        if warming:
            await asyncio.wait(warming, timeout=5)
        for runner in list(self.runners.values()):
            if runner.task and not runner.task.done():
                with contextlib.suppress(Exception):
                    await self._interrupt_agent(runner)
        tasks = [r.task for r in self.runners.values() if r.task and not r.task.done()]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2)
        for runner in self.runners.values():
            await self._close_agent(runner)
        await self.backups.drain()
        await self.lifetime.stop()  # and what they left running (tool commands)

    def session(self) -> Session:
        """A database session."""
        return get_session(self.engine)

    def _load(self, session: Session, conversation_id: int) -> Conversation:
        """A conversation that must exist (its runner is running)."""
        conversation = store.get_conversation(session=session, conversation_id=conversation_id)
        if conversation is None:
            raise LookupError(f"conversation {conversation_id} is gone")
        return conversation

    def runner(self, conversation_id: int) -> Runner:
        """The runner of a conversation (created on first use)."""
        runner = self.runners.get(conversation_id)
        if runner is None:
            runner = self.runners[conversation_id] = Runner(conversation_id)
        return runner

    def _recover(self, session: Session, conversation: Conversation) -> None:
        """Close what a crash left open in one conversation, and resume its queue."""
        conversation_id = conversation.id or 0
        for entry in store.entries_in_state(
            session=session, conversation_id=conversation_id, state="streaming"
        ):
            self._save(session, conversation, entry, state="interrupted")
        for entry in store.entries_in_state(
            session=session, conversation_id=conversation_id, state="pending"
        ):
            self._save(session, conversation, entry, state="expired", data=entry.data)
        if conversation.turn_active:
            self._line(session, conversation, RESTART_LINE, level="warning")
            store.update_conversation(session=session, conversation=conversation, turn_active=False)
        if store.count_queued(session=session, conversation_id=conversation_id):
            self._wake(conversation_id)

    # -- reading ---------------------------------------------------------------------------

    def turn_view(self, conversation_id: int, session: Session) -> dict[str, Any]:
        """The turn state and the number of queued messages."""
        runner = self.runners.get(conversation_id)
        return {
            "state": runner.state if runner else "idle",
            "queued": store.count_queued(session=session, conversation_id=conversation_id),
        }

    def snapshot(
        self,
        conversation: Conversation,
        session: Session,
        *,
        limit: int = TIMELINE_PAGE,
        before_seq: int | None = None,
    ) -> dict[str, Any]:
        """A conversation with its latest timeline page and turn; live text included."""
        conversation_id = conversation.id or 0
        entries = store.last_entries(
            session=session, conversation_id=conversation_id, limit=limit + 1, before_seq=before_seq
        )
        has_more = len(entries) > limit
        entries = entries[-limit:]
        live = {
            s.entry.id: s.text
            for s in self.runners.get(conversation_id, Runner(0)).streaming.values()
        }
        # Queued messages are shown at the end, whichever page is asked for.
        queued = store.entries_in_state(
            session=session, conversation_id=conversation_id, state="queued"
        )
        seen = {entry.id for entry in entries}
        entries += [entry for entry in queued if entry.id not in seen]
        view = conversation_view(conversation)
        view["backup"] = self.backups.latest(conversation_id)
        view["timeline"] = [entry_view(entry, live.get(entry.id)) for entry in entries]
        view["has_more"] = has_more
        view["turn"] = self.turn_view(conversation_id, session)
        view["agent"] = self.agent_state(conversation_id)
        view["seq"] = self.hub.current_seq(conversation_id)
        view["epoch"] = self.hub.epoch
        return view

    # -- writing helpers (each stores, then publishes) ---------------------------------------

    def _add(
        self,
        session: Session,
        conversation: Conversation,
        kind: str,
        text: str = "",
        *,
        state: str = "done",
        data: dict[str, Any] | None = None,
    ) -> Entry:
        cid = conversation.id or 0  # read before a failed flush expires it
        seq = self.hub.next_seq(cid)
        try:
            entry = store.add_entry(
                session=session,
                conversation=conversation,
                seq=seq,
                kind=kind,
                text=text,
                state=state,
                data=data,
            )
        except Exception:
            session.rollback()
            self.hub.rewind(cid, seq)  # no gap in what tabs see
            raise
        self.hub.publish(cid, {"type": "entry", "seq": seq, "entry": entry_view(entry)})
        return entry

    def _save(
        self,
        session: Session,
        conversation: Conversation,
        entry: Entry,
        *,
        move: bool = False,
        **changes: Any,
    ) -> Entry:
        cid = conversation.id or 0  # read before a failed flush expires it
        seq = self.hub.next_seq(cid)
        if move:  # to the end of the timeline
            changes["seq"] = seq
        try:
            store.save_entry(
                session=session, entry=entry, conversation=conversation, event_seq=seq, **changes
            )
        except Exception:
            session.rollback()
            self.hub.rewind(cid, seq)
            raise
        self.hub.publish(cid, {"type": "entry", "seq": seq, "entry": entry_view(entry)})
        return entry

    def _line(
        self,
        session: Session,
        conversation: Conversation,
        text: str,
        *,
        level: str = "info",
        data: dict[str, Any] | None = None,
        state: str = "done",
    ) -> Entry:
        return self._add(
            session, conversation, "line", text, state=state, data={"level": level, **(data or {})}
        )

    def publish_turn(self, conversation_id: int, session: Session) -> None:
        """Tell every tab the turn state and queue length."""
        self.hub.emit(
            conversation_id, {"type": "turn", "turn": self.turn_view(conversation_id, session)}
        )

    def agent_state(self, conversation_id: int) -> str:
        """asleep (no agent), starting, or ready: what the header shows."""
        runner = self.runners.get(conversation_id)
        if runner is None or (runner.agent is None and not runner.starting):
            return "asleep"
        return "starting" if runner.starting else "ready"

    def publish_agent(self, conversation_id: int) -> None:
        """Tell the conversation's tabs its agent's state."""
        self.hub.emit(
            conversation_id, {"type": "agent", "agent": self.agent_state(conversation_id)}
        )

    def publish_conversation(self, conversation: Conversation) -> None:
        """Tell every tab a conversation's fields changed (sidebar and header)."""
        view = conversation_view(conversation)
        self.hub.emit(conversation.id or 0, {"type": "conversation", "conversation": view})
        self.hub.broadcast({"type": "conversation", "conversation": view})

    # -- commands from the API ---------------------------------------------------------------

    def create_conversation(
        self, *, title: str, provider: str, cwd: Path, permission_mode: str
    ) -> Conversation:
        """Create a conversation and announce it."""
        with self.session() as session:
            conversation = store.create_conversation(
                session=session,
                title=title,
                provider=provider,
                cwd=str(cwd),
                permission_mode=permission_mode,
            )
        self.hub.broadcast(
            {"type": "conversation", "conversation": conversation_view(conversation)}
        )
        return conversation

    def update_conversation(self, conversation: Conversation, **changes: Any) -> Conversation:
        """Change a conversation's fields and announce it."""
        with self.session() as session:
            session.add(conversation)
            store.update_conversation(session=session, conversation=conversation, **changes)
        self.publish_conversation(conversation)
        return conversation

    def submit(self, conversation: Conversation, text: str) -> Entry:
        """Store a user message (queued), then hand it to the conversation's runner."""
        if conversation.status != "active":
            raise ConversationError("This conversation is archived; it can be read, not written.")
        with self.session() as session:
            session.add(conversation)
            entry = self._add(session, conversation, "user", text, state="queued")
            self._wake(conversation.id or 0)
            self.publish_turn(conversation.id or 0, session)
        self.hub.broadcast(
            {"type": "conversation", "conversation": conversation_view(conversation)}
        )
        return entry

    def compact(self, conversation: Conversation, *, carry: str | None = None) -> Conversation:
        """Archive a conversation and open its successor with a carry-over summary.

        carry replaces the summary: a backup's carry-over ("Start fresh from this backup").
        """
        if conversation.status != "active":
            raise ConversationError("This conversation is archived; it cannot be compacted again.")
        if carry is None:
            self._backup_before(conversation, PRECOMPACT_MANUAL)
        with self.session() as session:
            session.add(conversation)
            messages = store.recent_messages(session=session, conversation_id=conversation.id or 0)
            summary = carry or build_summary(
                conversation.title,
                [SummaryMessage("user" if m.kind == "user" else "agent", m.text) for m in messages],
            )
            new = store.compact_conversation(
                session=session,
                old=conversation,
                summary=summary,
                title=f"{conversation.title} (compacted)",
            )
        old_view = conversation_view(conversation)
        self.hub.emit(conversation.id or 0, {"type": "conversation", "conversation": old_view})
        self.hub.emit(conversation.id or 0, {"type": "compacted", "into": conversation_view(new)})
        archived = self.runners.get(conversation.id or 0)
        if archived is not None:
            archived.archived = True  # the reaper releases it once its accepted messages are done
        self.hub.broadcast({"type": "conversation", "conversation": old_view})
        self.hub.broadcast({"type": "conversation", "conversation": conversation_view(new)})
        return new

    def warm(self, conversation: Conversation) -> str:
        """Start the agent of a conversation about to get a message; its agent state.

        Nothing happens when the agent is live or starting, or a turn will start it.
        """
        if conversation.status != "active":
            raise ConversationError("This conversation is archived; its agent is not started.")
        conversation_id = conversation.id or 0
        runner = self.runner(conversation_id)
        runner.last_used = time.monotonic()  # about to be used: the last to be stopped
        busy = runner.task is not None and not runner.task.done()
        warming = runner.warming is not None and not runner.warming.done()
        if not (self._closing or busy or warming or runner.agent is not None or runner.starting):
            runner.warming = asyncio.create_task(self._warm(runner), name=f"warm-{conversation_id}")
        if runner.warming is not None and not runner.warming.done():
            return "starting"  # (the task has not run yet: its own event follows)
        return self.agent_state(conversation_id)

    async def _warm(self, runner: Runner) -> None:
        try:
            await self._ensure_agent(runner)
        except Exception as error:  # noqa: BLE001 - the message's own turn will say why
            log.info("warming conversation %s failed: %s", runner.conversation_id, error)

    async def interrupt(self, conversation_id: int) -> bool:
        """Stop the running turn, if any (queued messages stay queued)."""
        runner = self.runners.get(conversation_id)
        if runner is None or runner.state == "idle":
            return False
        await self._interrupt_agent(runner)
        return True

    def answer(
        self, conversation: Conversation, entry_id: int, decision: PermissionDecision
    ) -> Entry:
        """Answer a permission question; the first answer wins."""
        with self.session() as session:
            entry = store.get_entry(session=session, entry_id=entry_id)
            if entry is None or entry.conversation_id != conversation.id:
                raise LookupError("No such question in this conversation.")
            if entry.data.get("type") != "permission":
                raise LookupError("That entry is not a permission question.")
            if entry.state != "pending":
                raise ConversationError(f"This question was already answered ({entry.state}).")
            future = self.runner(conversation.id or 0).questions.pop(entry_id, None)
            state = "allowed" if decision.allow else "denied"
            session.add(conversation)
            self._save(session, conversation, entry, state=state, data=entry.data)
        if future is not None and not future.done():
            future.set_result(decision)
        return entry

    # -- delivery --------------------------------------------------------------------------

    def _wake(self, conversation_id: int) -> None:
        runner = self.runner(conversation_id)
        if self._closing or (runner.task and not runner.task.done()):
            return
        runner.state = "running"  # from now until the queue is empty
        runner.task = asyncio.create_task(self._deliver(runner), name=f"deliver-{conversation_id}")

    async def _deliver(self, runner: Runner) -> None:
        """Deliver queued messages one turn at a time until none is left."""
        try:
            await self._deliver_queue(runner)
        finally:
            runner.state = "idle"
            with self.session() as session:
                self.publish_turn(runner.conversation_id, session)

    async def _deliver_queue(self, runner: Runner) -> None:
        while not self._closing:
            await wait_until_writable(self.engine)  # another program's lock: wait, loop running
            with self.session() as session:
                conversation = store.get_conversation(
                    session=session, conversation_id=runner.conversation_id
                )
                # An archived conversation still finishes the messages it accepted.
                if conversation is None:
                    return
                queued = store.entries_in_state(
                    session=session, conversation_id=runner.conversation_id, state="queued"
                )
                if not queued:
                    return
                entry = queued[0]
                prompt = self._begin_turn(session, runner, conversation, entry)
            try:
                await self._run_turn(runner, prompt)
            except Exception:  # one failing turn must not stop the queue
                log.exception("turn failed in conversation %s", runner.conversation_id)
            finally:
                await wait_until_writable(self.engine)
                self._end_turn(runner)

    def _begin_turn(
        self, session: Session, runner: Runner, conversation: Conversation, entry: Entry
    ) -> str:
        """Mark a message delivered (at the end of the timeline) and build the agent's prompt."""
        prompt = entry.text
        changes: dict[str, Any] = {"turn_active": True}
        if conversation.pending_summary is not None:
            # Consumed in the same transaction that marks the message sent: never sent twice.
            prompt = compose_first_message(conversation.pending_summary, entry.text)
            changes["pending_summary"] = None
        for name, value in changes.items():
            setattr(conversation, name, value)
        session.add(conversation)  # saved in the same transaction as the entry
        self._save(session, conversation, entry, move=True, state="sent")
        if "pending_summary" in changes:
            self.publish_conversation(conversation)
        runner.state = "running"
        runner.last_agent_entry = None
        runner.lines_shown.clear()
        self.publish_turn(conversation.id or 0, session)
        return prompt

    def _end_turn(self, runner: Runner) -> None:
        runner.state = "running"  # _deliver sets idle once the queue is empty
        runner.last_used = time.monotonic()
        for future in runner.questions.values():
            if not future.done():
                future.set_result(PermissionDecision(False, "The turn ended."))
        with self.session() as session:
            conversation = store.get_conversation(
                session=session, conversation_id=runner.conversation_id
            )
            if conversation is None:
                return
            for streaming in list(runner.streaming.values()):
                self._save(
                    session, conversation, streaming.entry, text=streaming.text, state="interrupted"
                )
            runner.streaming.clear()
            for entry in store.entries_in_state(
                session=session, conversation_id=runner.conversation_id, state="pending"
            ):
                self._save(session, conversation, entry, state="expired", data=entry.data)
            runner.questions.clear()
            if runner.compaction is not None:
                self._remove(session, conversation, runner.compaction)
                runner.compaction = None
            runner.tools.clear()
            store.update_conversation(session=session, conversation=conversation, turn_active=False)

    async def _ensure_agent(self, runner: Runner) -> Agent:
        warming = runner.warming
        if warming is not None and warming is not asyncio.current_task():
            # A warm-up under way: its agent serves this turn (if it fails, this one starts).
            await asyncio.wait({warming})  # never raises its error, never cancels it
        if runner.agent is not None:
            return runner.agent
        with self.session() as session:
            conversation = self._load(session, runner.conversation_id)
        spec = AgentSpec(
            conversation_id=runner.conversation_id,
            cwd=Path(conversation.cwd),
            session_id=conversation.session_id,
            permission_mode=conversation.permission_mode,
            auto_compact_window=conversation.auto_compact_window,
            env=agent_env(conversation.provider, self.settings, conversation.auto_compact_window),
            ask_permission=lambda request: self._ask(runner, request),
            context_tokens=conversation.context_tokens,
        )
        agent = self.agent_factory(conversation.provider, spec, self.settings)
        runner.starting = True
        self.publish_agent(runner.conversation_id)
        try:
            # Room first, sized as the largest live agent, so that the peak stays in budget.
            await self._fit_budget(exclude=runner.conversation_id, incoming=True)
            await agent.start()
        except BaseException:
            runner.starting = False
            self.publish_agent(runner.conversation_id)
            raise
        runner.agent, runner.starting = agent, False
        runner.last_used = time.monotonic()  # its idle time starts now, not at the request
        self.publish_agent(runner.conversation_id)
        await self._fit_budget(exclude=runner.conversation_id)  # now with its real size
        if conversation.applied_window != conversation.auto_compact_window:
            with self.session() as session:
                session.add(conversation)
                store.update_conversation(
                    session=session,
                    conversation=conversation,
                    applied_window=conversation.auto_compact_window,
                )
        return agent

    def background_work(self, conversation_id: int) -> bool:
        """True while the conversation's live agent runs background work."""
        runner = self.runners.get(conversation_id)
        return bool(runner and runner.agent is not None and runner.agent.background_work())

    async def refresh_context(self, conversation_id: int) -> dict[str, Any] | None:
        """The agent's latest context report, asked again when its agent is live and idle."""
        runner = self.runners.get(conversation_id)
        if runner is None:
            return None
        if runner.agent is not None and runner.state == "idle":
            # The modal waits for this: a slow agent gets the last report instead.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_SECONDS):
                    await self._report_context(runner, runner.agent)
        return runner.context_report

    async def _report_context(self, runner: Runner, agent: Agent) -> None:
        """Ask the agent what window it really uses; warn when it disagrees with ours."""
        try:
            report = await asyncio.wait_for(agent.context_usage(), timeout=15)
        except Exception as error:  # noqa: BLE001 - the report is informative only
            log.info("no context report for conversation %s: %s", runner.conversation_id, error)
            return
        if not report:
            return
        runner.context_report = report
        with self.session() as session:
            conversation = store.get_conversation(
                session=session, conversation_id=runner.conversation_id
            )
        if conversation is None:
            return
        resolved = effective_window(conversation, os.environ.get(ENV_VAR))
        reported = report.get("maxTokens")
        if resolved is not None and reported is not None and reported != resolved.window:
            log.warning(
                "conversation %s: agent window %s (%s), relay expected %s (%s)",
                runner.conversation_id,
                reported,
                report.get("autocompactSource"),
                resolved.window,
                resolved.source,
            )

    async def _apply_window(self, runner: Runner) -> None:
        """Restart the agent once when its conversation's window setting changed."""
        with self.session() as session:
            conversation = self._load(session, runner.conversation_id)
            if conversation.session_id is None:
                return
            old, new = conversation.applied_window, conversation.auto_compact_window
            if old == new:
                return
            if runner.agent is not None and runner.agent.background_work():
                return  # a restart would kill it: applies once the background work has ended
            # Claude Code reads the window only at start: resume the same session with the new one.
            await self._close_agent(runner)
            self._line(session, conversation, restart_line(old, new), data={"type": "restart"})
            store.update_conversation(
                session=session, conversation=conversation, applied_window=new
            )

    async def _run_turn(self, runner: Runner, prompt: str) -> None:
        try:
            await self._apply_window(runner)
            agent = await self._ensure_agent(runner)
        except Exception as error:  # noqa: BLE001 - shown to the user, the queue goes on
            log.warning("agent of conversation %s did not start: %s", runner.conversation_id, error)
            await wait_until_writable(self.engine)
            self._error_line(runner, f"The agent could not start: {error}")
            return
        try:
            async for event in agent.turn(prompt):
                if not isinstance(event, TextDelta) or event.message_id not in runner.streaming:
                    await wait_until_writable(self.engine)  # then the event is stored at once
                self._handle(runner, event)
                if isinstance(event, TurnDone):
                    break
            if runner.reported_agent is not agent:
                # The window is fixed for a process's life: check it once per process. (Fresh
                # categories are fetched when someone opens the 🧠 modal: refresh_context.)
                runner.reported_agent = agent
                runner.reporting = asyncio.create_task(self._report_context(runner, agent))
        except Exception as error:  # noqa: BLE001 - the agent crashed; the next message restarts it
            log.warning("agent of conversation %s failed: %s", runner.conversation_id, error)
            await wait_until_writable(self.engine)
            self._error_line(runner, f"The agent stopped unexpectedly: {error}")
            await self._close_agent(runner)

    def _error_line(self, runner: Runner, text: str) -> None:
        with self.session() as session:
            conversation = store.get_conversation(
                session=session, conversation_id=runner.conversation_id
            )
            if conversation is not None:
                self._line(session, conversation, text, level="error")

    async def _ask(self, runner: Runner, request: PermissionRequest) -> PermissionDecision:
        """Put a permission question in the timeline and wait for the first answer."""
        await wait_until_writable(self.engine)
        with self.session() as session:
            conversation = self._load(session, runner.conversation_id)
            entry = self._add(
                session,
                conversation,
                "activity",
                f"{request.tool_name} wants permission",
                state="pending",
                data={
                    "type": "permission",
                    "tool": request.tool_name,
                    "input": request.tool_input,
                    "tool_id": request.tool_id,
                },
            )
        future: asyncio.Future[PermissionDecision] = asyncio.get_running_loop().create_future()
        runner.questions[entry.id or 0] = future
        return await future

    async def _interrupt_agent(self, runner: Runner) -> None:
        for entry_id, future in list(runner.questions.items()):
            if not future.done():
                future.set_result(PermissionDecision(False, "Stopped by the user."))
            runner.questions.pop(entry_id, None)
        if runner.agent is not None:
            await runner.agent.interrupt()

    async def _close_agent(self, runner: Runner) -> None:
        agent, runner.agent = runner.agent, None
        if agent is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(agent.close(), timeout=10)
            self.publish_agent(runner.conversation_id)

    def _stoppable(self, runner: Runner) -> bool:
        """An idle agent: no turn, no start, no open question, no background work."""
        agent = runner.agent
        return (
            agent is not None
            and runner.state == "idle"
            and not (runner.task is not None and not runner.task.done())
            and not runner.starting
            and not runner.questions
            and not agent.background_work()
        )

    async def _fit_budget(self, *, exclude: int | None = None, incoming: bool = False) -> None:
        """Stop the least recently used idle agents until the live ones fit the budget."""
        live = [
            Live(cid, tree_rss(getattr(r.agent, "pid", None)), r.last_used, self._stoppable(r))
            for cid, r in self.runners.items()
            if r.agent is not None and cid != exclude
        ]
        estimate = largest(agent.rss for agent in live) if incoming else 0
        for conversation_id in to_stop(live, self.agent_budget, estimate):
            runner = self.runners.get(conversation_id)
            if runner is not None and self._stoppable(runner):  # still, after the awaits
                log.info("agent memory budget: stopping the agent of %s", conversation_id)
                await self._close_agent(runner)

    async def _reap_idle(self) -> None:
        """Stop agent processes of conversations idle for longer than the idle timeout."""
        timeout = self.settings.agent_idle_timeout
        while True:
            await asyncio.sleep(max(0.5, min(timeout / 4, 5)))
            now = time.monotonic()
            for runner in list(self.runners.values()):
                idle = runner.state == "idle" and not (runner.task and not runner.task.done())
                expired = runner.archived or now - runner.last_used > timeout
                if runner.agent is not None and idle and expired:
                    log.info("stopping idle agent of conversation %s", runner.conversation_id)
                    await self._close_agent(runner)
            try:
                await self._fit_budget()  # agents grow during their turns
            except Exception:
                log.exception("fitting the agents' memory budget failed")
            try:
                self.release_idle(time.monotonic() - timeout)
            except Exception:  # memory is released on the next pass
                log.exception("releasing idle conversations failed")

    def release_idle(self, before: float) -> list[int]:
        """Forget what idle and archived conversations hold in memory; which ones were released.

        A runner goes when its conversation is archived or unused since `before` and it
        holds nothing live (agent, turn, question, report); the hub's numbering and replay
        go when no runner and no tab needs them, after their last seq is stored.
        """
        released = []
        for conversation_id, runner in list(self.runners.items()):
            busy = (
                runner.agent is not None
                or runner.state != "idle"
                or (runner.task is not None and not runner.task.done())
                or (runner.reporting is not None and not runner.reporting.done())
                or (runner.warming is not None and not runner.warming.done())
                or runner.starting
                or runner.questions
                or runner.streaming
            )
            if not busy and (runner.archived or runner.last_used < before):
                del self.runners[conversation_id]
                released.append(conversation_id)
        # An archived conversation's numbering goes with its runner, however recent.
        idle = self.hub.idle(before, also=released)
        seqs = {cid: seq for cid, seq in idle.items() if cid not in self.runners}
        if seqs:
            with self.session() as session:  # stored first: numbering resumes after them
                store.raise_last_seqs(session=session, seqs=seqs)
            for conversation_id in seqs:
                self.hub.release(conversation_id)
        if released or seqs:
            give_back_memory()  # else what was released stays in the process's RSS
        return released

    # -- agent events ----------------------------------------------------------------------

    def _handle(self, runner: Runner, event: AgentEvent) -> None:
        """Record one agent event: store what lasts, publish everything."""
        runner.last_used = time.monotonic()
        cid = runner.conversation_id
        if isinstance(event, TextDelta):
            self._on_delta(runner, event)
            return
        with self.session() as session:
            conversation = self._load(session, cid)
            match event:
                case SessionStarted(session_id=session_id):
                    if conversation.session_id != session_id:
                        store.update_conversation(
                            session=session, conversation=conversation, session_id=session_id
                        )
                case MessageDone(message_id=message_id, text=text):
                    streaming = runner.streaming.pop(message_id, None)
                    if streaming is None:
                        entry = self._add(session, conversation, "agent", text)
                    else:
                        entry = self._save(
                            session, conversation, streaming.entry, text=text, state="done"
                        )
                    runner.last_agent_entry = entry
                case Activity(phase="call"):
                    data = {"type": "tool", "tool": event.name, "tool_id": event.tool_id}
                    if facts := tool_facts(event.name, event.input):
                        data["backup"] = facts  # what a backup lists of this call
                    runner.tools[event.tool_id] = self._add(
                        session, conversation, "activity", event.summary, state="running", data=data
                    )
                case Activity(phase="result"):
                    entry = runner.tools.pop(event.tool_id, None)
                    data = {
                        "type": "tool",
                        "tool": event.name,
                        "tool_id": event.tool_id,
                        "output": event.output,
                        "is_error": event.is_error,
                    }
                    state = "error" if event.is_error else "done"
                    if entry is None:
                        self._add(
                            session, conversation, "activity", event.summary, state=state, data=data
                        )
                    else:
                        self._save(
                            session, conversation, entry, state=state, data={**entry.data, **data}
                        )
                case Usage():
                    changes: dict[str, Any] = {"context_tokens": event.context_tokens}
                    if event.model:
                        changes["model"] = event.model
                    if event.model_window:
                        changes["model_window"] = event.model_window
                    store.update_conversation(session=session, conversation=conversation, **changes)
                    self.publish_conversation(conversation)
                    self._backup_figure(conversation, event.context_tokens)
                case CompactionStarted(trigger=trigger):
                    style = compaction_style(conversation.provider)
                    runner.state = "compacting"
                    runner.compaction = self._add(
                        session,
                        conversation,
                        style,
                        started_text(style),
                        state="running",
                        data={"type": "compaction", "trigger": trigger, "level": "info"},
                    )
                    self._backup_before(conversation, PRECOMPACT_AUTO, runner.compaction)
                    self.publish_turn(cid, session)
                case CompactionFinished():
                    self._on_compacted(session, runner, conversation, event)
                case CompactionFailed(reason=reason):
                    failed = failed_text(compaction_style(conversation.provider), reason)
                    if runner.compaction is not None and failed is None:
                        self._remove(session, conversation, runner.compaction)
                    elif runner.compaction is not None:
                        data = {**runner.compaction.data, "reason": reason}
                        self._save(
                            session,
                            conversation,
                            runner.compaction,
                            text=failed,
                            state="error",
                            data=data,
                        )
                    elif failed is not None:
                        data = {"type": "compaction", "reason": reason}
                        self._add(
                            session, conversation, "activity", failed, state="error", data=data
                        )
                    runner.compaction = None
                    runner.state = "running"
                    self.publish_turn(cid, session)
                case Notice(text=text, level=level, data=data):
                    self._line(session, conversation, text, level=level, data=data)
                    runner.lines_shown.add(text)
                case TurnDone():
                    self._on_turn_done(session, runner, conversation, event)

    def _on_delta(self, runner: Runner, event: TextDelta) -> None:
        streaming = runner.streaming.get(event.message_id)
        if streaming is None:
            with self.session() as session:
                conversation = self._load(session, runner.conversation_id)
                entry = self._add(session, conversation, "agent", "", state="streaming")
            streaming = runner.streaming[event.message_id] = Streaming(entry)
        streaming.parts.append(event.text)
        self.hub.emit(
            runner.conversation_id,
            {"type": "delta", "entry_id": streaming.entry.id, "text": event.text},
        )
        now = time.monotonic()
        # Skipped while another program holds the write lock: the next delta tries again.
        if now - streaming.checkpoint_at >= CHECKPOINT_SECONDS and write_lock_free(self.engine):
            # A crash-safe checkpoint of the partial text, not a write per delta.
            streaming.checkpoint_at = now
            streaming.entry.text = streaming.text
            with self.session() as session:
                session.add(streaming.entry)
                session.commit()

    def _on_compacted(
        self,
        session: Session,
        runner: Runner,
        conversation: Conversation,
        event: CompactionFinished,
    ) -> None:
        style = compaction_style(conversation.provider)
        numbers = {
            "pre_tokens": event.pre_tokens,
            "post_tokens": event.post_tokens,
            "messages_removed": event.messages_removed,
            "tokens_removed": event.tokens_removed,
        }
        data = {
            "type": "compaction",
            "trigger": event.trigger,
            "level": "info",
            **{key: value for key, value in numbers.items() if value is not None},
        }
        text = finished_text(style, **numbers)
        self.backups.submit(Job(conversation.id or 0, "reset"))  # both rails start over
        if runner.compaction is None:
            self._add(session, conversation, style, text, data=data)
        else:
            merged = {**runner.compaction.data, **data}
            self._save(
                session, conversation, runner.compaction, text=text, state="done", data=merged
            )
            runner.compaction = None
        if event.post_tokens is not None:
            store.update_conversation(
                session=session, conversation=conversation, context_tokens=event.post_tokens
            )
            self.publish_conversation(conversation)
            self._backup_figure(conversation, event.post_tokens)
        runner.state = "running"
        self.publish_turn(runner.conversation_id, session)

    def _on_turn_done(
        self, session: Session, runner: Runner, conversation: Conversation, event: TurnDone
    ) -> None:
        if event.error and event.error not in runner.lines_shown:  # an API error shows once
            self._line(session, conversation, event.error, level="error")
        if event.interrupted:
            text = SHUTDOWN_LINE if self._closing else "Interrupted by the user."
            self._line(session, conversation, text, data={"type": "interrupted"})
        last = runner.last_agent_entry
        if last is not None and (event.cost_usd is not None or event.duration_ms is not None):
            result = {"cost_usd": event.cost_usd, "duration_ms": event.duration_ms}
            self._save(session, conversation, last, data={**last.data, "result": result})

    def _remove(self, session: Session, conversation: Conversation, entry: Entry) -> None:
        entry_id = entry.id
        store.delete_entry(session=session, entry=entry)
        self.hub.emit(conversation.id or 0, {"type": "entry_removed", "entry_id": entry_id})

    # -- backups (SPEC §6): jobs handed to app/backup_files.py, never awaited here -------------

    def _backup_window(self, conversation: Conversation) -> int | None:
        resolved = effective_window(conversation, os.environ.get(ENV_VAR))
        return resolved.window if resolved else None

    def _backup_figure(self, conversation: Conversation, used: int) -> None:
        """Check a new context figure against the rails (a backup may follow)."""
        window = self._backup_window(conversation)
        if window is None:
            # Not before the window is known (Claude Code says it at the end of its first turn):
            # the same figure with its window would fire the free rail as a second backup.
            return
        job = Job(
            conversation.id or 0, "figure", used=used, window=window, upto_seq=conversation.last_seq
        )
        self.backups.submit(job)

    def _backup_before(
        self, conversation: Conversation, trigger: str, link: Entry | None = None
    ) -> None:
        """Back up a conversation before a compaction, from its timeline as it is now."""
        job = Job(
            conversation.id or 0,
            "before",
            used=conversation.context_tokens,
            window=self._backup_window(conversation),
            trigger=trigger,
            upto_seq=conversation.last_seq,
            link_entry_id=link.id if link is not None else None,
        )
        self.backups.submit(job)

    def _on_backup(self, outcome: Outcome) -> None:
        """A backup job ended: link it (header, compaction line) or say why it failed."""
        cid = outcome.conversation_id
        with self.session() as session:
            conversation = store.get_conversation(session=session, conversation_id=cid)
            if conversation is None:
                return
            if outcome.error is not None:
                data = {"type": "backup", "trigger": outcome.trigger}
                self._line(session, conversation, outcome.error, level="warning", data=data)
                return
            if outcome.link_entry_id is not None:
                runner = self.runners.get(cid)
                entry = (
                    runner.compaction
                    if runner is not None
                    and runner.compaction is not None
                    and runner.compaction.id == outcome.link_entry_id
                    else store.get_entry(session=session, entry_id=outcome.link_entry_id)
                )
                if entry is not None:  # (gone when the compaction ended without a result)
                    data = {**entry.data, "backup": outcome.name}
                    self._save(session, conversation, entry, data=data)
            view = conversation_view(conversation)
            view["backup"] = outcome.name
            self.hub.emit(cid, {"type": "conversation", "conversation": view})
