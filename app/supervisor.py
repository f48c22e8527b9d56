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
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from app import store
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
from app.compaction import failed_text, finished_text, started_text
from app.config import Settings
from app.db import get_session
from app.hub import Hub
from app.models import Conversation, Entry
from app.providers import agent_env, compaction_style, make_agent
from app.summary import SummaryMessage, build_summary, compose_first_message
from app.titles import compacted_title
from app.views import conversation_view, effective_window, entry_view
from app.window import ENV_VAR, restart_line

log = logging.getLogger(__name__)

REFRESH_SECONDS = 3.0  # the longest the 🧠 modal waits for the agent's own report
CHECKPOINT_SECONDS = 1.0  # streamed text is written to the database at least this often
TIMELINE_PAGE = 200
COMPACT_COMMAND = "/compact"
SHUTDOWN_LINE = "Interrupted: the relay was shut down."
RESTART_LINE = "The relay restarted while this turn was running; its reply may be incomplete."
RETRY_SECONDS = 1.0  # first wait before a runner retries a database that failed
RETRY_MAX_SECONDS = 30.0


class ConversationError(Exception):
    """A request the conversation's state does not allow (HTTP 409)."""


def is_compact_command(text: str) -> bool:
    """True when the whole message is the /compact command."""
    return text.strip() == COMPACT_COMMAND


def failure_reason(error: BaseException) -> str:
    """A short reason for an error line: the driver's message, never the SQL and its data."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        return str(error.orig)
    return str(error) or type(error).__name__


@dataclass
class Streaming:
    """An agent message being written."""

    entry: Entry
    parts: list[str] = field(default_factory=list)  # joined only when read: no copy per delta
    checkpoint_at: float = field(default_factory=time.monotonic)
    entry_id: int = field(init=False)  # readable even after a failed write expired entry

    def __post_init__(self) -> None:
        self.entry_id = self.entry.id or 0

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
    stop_requested: bool = False  # Stop came for this turn (maybe while its agent started)
    carried_summary: str | None = None  # the /compact summary this turn's prompt carries
    failure: str | None = None  # an error line the database refused: written when it can
    ending: bool = False  # _end_turn failed (database): finished before the next turn
    archived: bool = False  # the conversation is archived: its agent stops after its turn


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
        self._reaper: asyncio.Task[None] | None = None
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover from a previous run, deliver what was queued, start the idle reaper."""
        with self.session() as session:
            for conversation in store.conversations_with_work(session=session):
                self._recover(session, conversation)
        self._reaper = asyncio.create_task(self._reap_idle())

    async def stop(self) -> None:
        """Interrupt running turns, keep what was streamed, stop every agent."""
        self._closing = True
        if self._reaper:
            self._reaper.cancel()
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
            s.entry_id: s.text
            for s in self.runners.get(conversation_id, Runner(0)).streaming.values()
        }
        # Queued messages are shown at the end, whichever page is asked for.
        queued = store.entries_in_state(
            session=session, conversation_id=conversation_id, state="queued"
        )
        seen = {entry.id for entry in entries}
        entries += [entry for entry in queued if entry.id not in seen]
        view = conversation_view(conversation)
        view["timeline"] = [entry_view(entry, live.get(entry.id)) for entry in entries]
        view["has_more"] = has_more
        view["turn"] = self.turn_view(conversation_id, session)
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

    def compact(self, conversation: Conversation) -> Conversation:
        """Archive a conversation and open its successor with a carry-over summary.

        Its queued messages move into the successor (same transaction); its agent process
        stops now, or once its running turn ends (a running turn is neither awaited nor
        stopped, SPEC §2).
        """
        if conversation.status != "active":
            raise ConversationError("This conversation is archived; it cannot be compacted again.")
        old_id = conversation.id or 0
        with self.session() as session:
            session.add(conversation)
            messages = store.recent_messages(session=session, conversation_id=old_id)
            summary = build_summary(
                conversation.title,
                [SummaryMessage("user" if m.kind == "user" else "agent", m.text) for m in messages],
            )
            new = store.compact_conversation(
                session=session,
                old=conversation,
                summary=summary,
                title=compacted_title(conversation.title),
            )
            moved = store.entries_in_state(
                session=session, conversation_id=new.id or 0, state="queued"
            )
        for entry in moved:
            self.hub.emit(old_id, {"type": "entry_removed", "entry_id": entry.id})
        old_view = conversation_view(conversation)
        self.hub.emit(old_id, {"type": "conversation", "conversation": old_view})
        self.hub.emit(old_id, {"type": "compacted", "into": conversation_view(new)})
        self.hub.broadcast({"type": "conversation", "conversation": old_view})
        self.hub.broadcast({"type": "conversation", "conversation": conversation_view(new)})
        if moved:
            self._wake(new.id or 0)
        self._retire(old_id)
        return new

    def _retire(self, conversation_id: int) -> None:
        """Stop an archived conversation's agent now; a running turn's loop stops it after."""
        runner = self.runners.get(conversation_id)
        if runner is None or runner.agent is None or (runner.task and not runner.task.done()):
            return  # _deliver_queue closes it once the running turn has ended
        runner.task = asyncio.create_task(
            self._close_agent(runner), name=f"retire-{conversation_id}"
        )

    async def interrupt(self, conversation_id: int) -> bool:
        """Stop the running turn, if any (queued messages stay queued)."""
        runner = self.runners.get(conversation_id)
        if runner is None or runner.state == "idle":
            return False
        runner.stop_requested = True  # seen by _run_turn when the agent is still starting
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
            try:
                with self.session() as session:
                    self.publish_turn(runner.conversation_id, session)
            except Exception:  # the tabs learn the state on their next load
                log.exception(
                    "conversation %s: could not publish the idle turn", runner.conversation_id
                )

    async def _deliver_queue(self, runner: Runner) -> None:
        delay = RETRY_SECONDS
        while not self._closing:
            try:
                prompt = self._next_turn(runner)
            except Exception:  # the database failed: wait for it; the queue must not stall
                log.exception(
                    "conversation %s: database failure before the next turn; retrying in %.0f s",
                    runner.conversation_id,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)
                continue
            delay = RETRY_SECONDS
            if prompt is None:
                if runner.archived:  # /compact came during its last turn (SPEC §2)
                    await self._close_agent(runner)
                return
            try:
                await self._run_turn(runner, prompt)
            except Exception as error:  # one failing turn must not stop the queue
                log.exception("turn failed in conversation %s", runner.conversation_id)
                self._error_line(runner, f"The turn failed: {failure_reason(error)}")
            finally:
                try:
                    self._end_turn(runner)
                except Exception:  # retried by _next_turn once the database works
                    log.exception(
                        "conversation %s: could not close the turn", runner.conversation_id
                    )
                    runner.ending = True

    def _next_turn(self, runner: Runner) -> str | None:
        """Finish what a failed turn left, then begin the next queued message (None: none)."""
        if runner.ending:
            self._end_turn(runner)
            runner.ending = False
        if runner.failure is not None:
            self._write_error(runner, runner.failure)
            runner.failure = None
        with self.session() as session:
            conversation = store.get_conversation(
                session=session, conversation_id=runner.conversation_id
            )
            if conversation is None:
                return None
            if conversation.status != "active":  # an archived conversation never runs a turn
                runner.archived = True
                self._hand_over(session, conversation)
                return None
            queued = store.entries_in_state(
                session=session, conversation_id=runner.conversation_id, state="queued"
            )
            if not queued:
                return None
            return self._begin_turn(session, runner, conversation, queued[0])

    def _hand_over(self, session: Session, archived: Conversation) -> None:
        """Move what an archived conversation still has queued (from an older relay) onward."""
        queued = store.entries_in_state(
            session=session, conversation_id=archived.id or 0, state="queued"
        )
        if not queued:
            return
        successor, seen = archived, {archived.id}
        while successor.compacted_into_id is not None and successor.compacted_into_id not in seen:
            seen.add(successor.compacted_into_id)
            found = store.get_conversation(
                session=session, conversation_id=successor.compacted_into_id
            )
            if found is None:
                break
            successor = found
        if successor.status != "active":
            return  # nowhere to go: they stay visible, queued, in the archive
        for entry in queued:  # each move is one transaction: a crash midway loses nothing
            entry_id = entry.id
            self._save(session, successor, entry, move=True, conversation_id=successor.id or 0)
            self.hub.emit(archived.id or 0, {"type": "entry_removed", "entry_id": entry_id})
        self._wake(successor.id or 0)

    def _begin_turn(
        self, session: Session, runner: Runner, conversation: Conversation, entry: Entry
    ) -> str:
        """Mark a message delivered (at the end of the timeline) and build the agent's prompt."""
        prompt = entry.text
        changes: dict[str, Any] = {"turn_active": True}
        runner.carried_summary = conversation.pending_summary
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
        runner.stop_requested = False  # a Stop after this point is for the next turn
        runner.carried_summary = None
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
        await agent.start()
        runner.agent = agent
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
            self._error_line(runner, f"The agent could not start: {failure_reason(error)}")
            return
        if runner.stop_requested:  # Stop came while the agent was starting: send nothing
            self._stop_before_delivery(runner)
            return
        try:
            async for event in agent.turn(prompt):
                try:
                    self._handle(runner, event)
                except Exception as error:  # the database failed: this turn cannot be recorded
                    log.exception(
                        "conversation %s: could not store an agent event", runner.conversation_id
                    )
                    self._error_line(
                        runner,
                        "The relay could not store this turn "
                        f"({failure_reason(error)}); the turn was stopped.",
                    )
                    await self._close_agent(runner)
                    return
                if isinstance(event, TurnDone):
                    break
            if runner.reported_agent is not agent:
                # The window is fixed for a process's life: check it once per process. (Fresh
                # categories are fetched when someone opens the 🧠 modal: refresh_context.)
                runner.reported_agent = agent
                runner.reporting = asyncio.create_task(self._report_context(runner, agent))
        except Exception as error:  # noqa: BLE001 - the agent crashed; the next message restarts it
            log.warning("agent of conversation %s failed: %s", runner.conversation_id, error)
            self._error_line(runner, f"The agent stopped unexpectedly: {failure_reason(error)}")
            await self._close_agent(runner)

    def _error_line(self, runner: Runner, text: str) -> None:
        """Show an error line; one the database refuses is logged, then written later."""
        try:
            self._write_error(runner, text)
        except Exception:  # kept in runner.failure, retried by _next_turn
            log.exception(
                "conversation %s: could not store the line %r", runner.conversation_id, text
            )
            runner.failure = text

    def _write_error(self, runner: Runner, text: str) -> None:
        with self.session() as session:
            conversation = store.get_conversation(
                session=session, conversation_id=runner.conversation_id
            )
            if conversation is not None:
                self._line(session, conversation, text, level="error")

    def _stop_before_delivery(self, runner: Runner) -> None:
        """End a turn stopped before its prompt was sent; a carried summary waits for the next."""
        with self.session() as session:
            conversation = self._load(session, runner.conversation_id)
            restore = runner.carried_summary is not None and conversation.pending_summary is None
            if restore:  # saved with the line below, in one transaction
                conversation.pending_summary = runner.carried_summary
                session.add(conversation)
            self._on_turn_done(session, runner, conversation, TurnDone(interrupted=True))
            if restore:
                self.publish_conversation(conversation)

    async def _ask(self, runner: Runner, request: PermissionRequest) -> PermissionDecision:
        """Put a permission question in the timeline and wait for the first answer."""
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
            try:
                await asyncio.wait_for(agent.close(), timeout=10)
            except Exception:  # the process is gone from the runner either way
                log.warning(
                    "conversation %s: stopping its agent failed",
                    runner.conversation_id,
                    exc_info=True,
                )

    async def _reap_idle(self) -> None:
        """Stop agent processes of conversations idle for longer than the idle timeout."""
        timeout = self.settings.agent_idle_timeout
        while True:
            await asyncio.sleep(max(0.5, min(timeout / 4, 30)))
            now = time.monotonic()
            for runner in list(self.runners.values()):
                idle = runner.state == "idle" and not (runner.task and not runner.task.done())
                if runner.agent is not None and idle and now - runner.last_used > timeout:
                    log.info("stopping idle agent of conversation %s", runner.conversation_id)
                    await self._close_agent(runner)

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
                    runner.tools[event.tool_id] = self._add(
                        session,
                        conversation,
                        "activity",
                        event.summary,
                        state="running",
                        data={"type": "tool", "tool": event.name, "tool_id": event.tool_id},
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
            {"type": "delta", "entry_id": streaming.entry_id, "text": event.text},
        )
        now = time.monotonic()
        if now - streaming.checkpoint_at >= CHECKPOINT_SECONDS:
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
