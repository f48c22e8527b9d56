"""One runner per conversation: stores messages, delivers them to the agent, records its events.

A user message is stored (state "queued") before it is acknowledged. The
conversation's runner delivers queued messages one turn at a time, in order,
and turns every agent event into stored entries and live events for the hub.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from app import archive, steer, store
from app.agent_memory import Live, largest, to_stop, tree_rss
from app.agents.base import (
    Activity,
    Agent,
    AgentEvent,
    AgentSpec,
    CompactionFailed,
    CompactionFinished,
    CompactionStarted,
    CompactionSummaries,
    MessageDone,
    Notice,
    PermissionDecision,
    PermissionRequest,
    Receipts,
    SessionStarted,
    TextDelta,
    TurnDone,
    Usage,
    received,
)
from app.agents.lifetime import Lifetime
from app.backup_files import Backups, Job, Outcome
from app.backups import PRECOMPACT_AUTO, PRECOMPACT_MANUAL, tool_facts
from app.compaction import clip_summary, failed_text, finished_text, started_text
from app.config import Settings
from app.db import WRITE_PATIENCE, get_session, write_lock_free
from app.edits import edit_change
from app.handoff import (
    HANDOFF_REQUEST,
    HandoffText,
    context_note,
    first_message,
    is_handoff_command,
    parse_handoff,
    saved_text,
    with_note,
)
from app.hub import Hub
from app.limits import give_back_memory
from app.live_render import LiveRender
from app.models import Conversation, Entry, Handoff
from app.providers import agent_env, compaction_style, make_agent
from app.storage import Storage
from app.titles import compacted_title
from app.tools import ToolResult, relay_tools
from app.views import conversation_view, effective_window, entry_view
from app.window import ENV_VAR, restart_line

if TYPE_CHECKING:
    from app.cluster.node import ClusterNode

log = logging.getLogger(__name__)

REFRESH_SECONDS = 3.0  # the longest the 🧠 modal waits for the agent's own report
CHECKPOINT_SECONDS = 1.0  # streamed text is written to the database at least this often
TIMELINE_PAGE = 200
COMPACT_COMMAND = "/compact"
SHUTDOWN_LINE = "Interrupted: the relay was shut down."
RETRY_NOTICES = {"api_retry", "model_retry"}  # Claude Code's and Copilot's retry notices
RESTART_LINE = "The relay restarted while this turn was running; its reply may be incomplete."
UNKNOWN_LINE = (
    "The relay restarted while this turn was running; the agent may not have received your message."
)
REDELIVERED_LINE = (
    "The relay restarted before the agent received your message; it is delivered again."
)
MISSED_AGAIN_LINE = "The relay restarted again before the agent received your message."
RECEIPT_WAIT = 15.0  # seconds a restart waits for agent processes left running to say
RECEIPT_POLL = 0.25
SUMMARY_WAIT = 30.0  # seconds a compaction's summary is looked for in the agent's own files
RETRY_SECONDS = 1.0  # first wait before a runner retries a database that failed
RETRY_MAX_SECONDS = 30.0


class ConversationError(Exception):
    """A request the conversation's state does not allow (HTTP 409)."""


class Locked(Exception):
    """Another program holds SQLite's write lock: the runner's write waits, then tries again."""


def is_retry(notice: Notice) -> bool:
    """True for a notice that the agent is retrying its API request."""
    return notice.data.get("type") in RETRY_NOTICES


def is_compact_command(text: str) -> bool:
    """True when the whole message is the /compact command."""
    return text.strip() == COMPACT_COMMAND


def _settle(future: asyncio.Future[PermissionDecision], decision: PermissionDecision) -> None:
    """Answer a permission question's future (on the loop) unless it has its answer."""
    if not future.done():
        future.set_result(decision)


def _logged(future: asyncio.Future[Any]) -> None:
    """Log the error of a storage job nobody awaits."""
    if not future.cancelled() and future.exception() is not None:
        log.error("a database job failed", exc_info=future.exception())


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
    seqs: list[int] = field(default_factory=list)  # each part's event seq (snapshot_text)
    checkpoint_at: float = field(default_factory=time.monotonic)
    live: LiveRender | None = None  # renders the text so far now and then (sanitized HTML)
    entry_id: int = field(init=False)  # readable even after a failed write expired entry

    def __post_init__(self) -> None:
        self.entry_id = self.entry.id or 0

    @property
    def text(self) -> str:
        """The text written so far."""
        return "".join(self.parts)

    def text_at(self, seq: int) -> str:
        """The text of the deltas numbered up to seq (what tabs at that seq have)."""
        count = bisect.bisect_right(self.seqs, seq)
        return "".join(self.parts[:count])


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
    compaction_began: float | None = None  # time.monotonic() at the compaction's first sign
    questions: dict[int, asyncio.Future[PermissionDecision]] = field(default_factory=dict)
    last_agent_entry: Entry | None = None
    context_report: dict[str, Any] | None = None  # what the agent last said of its window
    reporting: asyncio.Task[None] | None = None
    reported_agent: Agent | None = None  # the agent process the last report came from
    lines_shown: set[str] = field(default_factory=set)  # this turn's notice lines
    prompt_id: str | None = None  # the uuid the current turn's prompt is sent with
    retry_line: Entry | None = None  # this turn's API-retry line, updated at each attempt
    last_used: float = field(default_factory=time.monotonic)
    stop_requested: bool = False  # Stop came for this turn (maybe while its agent started)
    carried_summary: str | None = None  # the /compact summary this turn's prompt carries
    failure: str | None = None  # an error line the database refused: written when it can
    ending: bool = False  # _end_turn failed (database): finished before the next turn
    archived: bool = False  # the conversation is archived: its agent stops after its turn
    warming: asyncio.Task[None] | None = None  # an agent started before its message (warm)
    starting: bool = False  # the agent's process is being started
    again: bool = False  # a message was queued while the runner was looking at the queue
    turn_conversation: Conversation | None = None  # as _begin_turn left it (read once a turn)
    ended: bool = False  # the job that stored the turn's last event also ended the turn
    looked: bool = False  # ... and looked at the queue: its answer is `upcoming`
    upcoming: str | None = None
    idle_shown: bool = False  # ... and, the queue being empty, told the tabs the turn is idle


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
        # Every database call runs in its threads; the loop only awaits (docs/architecture.md).
        self.storage = Storage(engine)
        hub.soon = self.storage.soon
        self.backups = Backups(settings.resolved_data_dir / "backups", engine, self._on_backup)
        self._reaper: asyncio.Task[None] | None = None
        self._closing = False
        self._summary_reads: set[asyncio.Task[None]] = set()
        self.lifetime = Lifetime(settings.resolved_data_dir)  # agents end with this relay
        self.agent_budget = settings.agent_budget  # bytes; read once (MemTotal by default)
        # Several nodes (app/cluster/): this node runs only the conversations it holds a lease of.
        self.cluster: ClusterNode | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover from a previous run, deliver what was queued, start the idle reaper."""
        self.lifetime.start()  # kills the agent processes a crash left running, first
        self.storage.start()
        if self.cluster is not None:  # recovery comes with each lease taken (node.py)
            await self.cluster.start()
        else:
            await self.storage.write(self._recover_all)
        self._reaper = asyncio.create_task(self._reap_idle())

    def _recover_all(self) -> None:
        with self.session() as session:
            for conversation in store.conversations_with_work(session=session):
                self._recover(session, conversation)

    async def stop(self) -> None:
        """Interrupt running turns, keep what was streamed, stop every agent."""
        self._closing = True
        if self._reaper:
            self._reaper.cancel()
        for read in self._summary_reads:
            read.cancel()
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
            if not self._recover_turn(session, conversation):
                return  # decided a little later, and the queue resumed then (_recover_later)
            store.update_conversation(session=session, conversation=conversation, turn_active=False)
        if store.count_queued(session=session, conversation_id=conversation_id):
            self._wake(conversation_id)

    def _recover_turn(self, session: Session, conversation: Conversation) -> bool:
        """Resolve a cut turn now; False when it waits for an agent process left running."""
        cut = store.last_sent_message(session=session, conversation_id=conversation.id or 0)
        if cut is None:
            self._line(session, conversation, RESTART_LINE, level="warning")
            return True
        agent = self._receipt_agent(conversation)
        got = self._received(agent, conversation, cut)
        if got is None and agent is not None and "prompt_uuid" in cut.data:
            # An agent process of the crashed relay may still be taking the message.
            runner = self.runner(conversation.id or 0)
            runner.state = "running"
            self.storage.soon(self._start_recover_later, runner, cut.id or 0, agent)
            return False
        self._resolve_cut(session, conversation, cut, got)
        return True

    def _start_recover_later(self, runner: Runner, entry_id: int, agent: Agent) -> None:
        runner.task = asyncio.create_task(
            self._recover_later(runner, entry_id, agent), name=f"recover-{runner.conversation_id}"
        )

    async def _recover_later(self, runner: Runner, entry_id: int, agent: Agent) -> None:
        """Ask again until the agent knows (or RECEIPT_WAIT passed), resolve, deliver the queue."""
        deadline = time.monotonic() + RECEIPT_WAIT
        got: bool | None = None

        def ask() -> bool | None:
            with self.session() as session:
                conversation = self._load(session, runner.conversation_id)
                cut = store.get_entry(session=session, entry_id=entry_id)
                return self._received(agent, conversation, cut) if cut else None

        def resolve() -> None:
            with self.session() as session:
                conversation = self._load(session, runner.conversation_id)
                cut = store.get_entry(session=session, entry_id=entry_id)
                if cut is not None:
                    self._resolve_cut(session, conversation, cut, got)
                store.update_conversation(
                    session=session, conversation=conversation, turn_active=False
                )

        try:
            while got is None and time.monotonic() < deadline:
                await asyncio.sleep(RECEIPT_POLL)
                if self._closing:
                    return  # still marked active: the next start decides
                got = await self.storage.read(ask)
            await self.storage.write(resolve)
        except Exception:  # the queue must not stall behind a failed check
            log.exception("recovering conversation %s failed", runner.conversation_id)
        await self._deliver(runner)

    def _resolve_cut(
        self, session: Session, conversation: Conversation, cut: Entry, got: bool | None
    ) -> None:
        """Received: a cut line. Not received: delivered again (once). Unknown: Resend."""
        if got is False and not cut.data.get("redelivered"):
            self._redeliver(session, conversation, cut)
            return
        if got:
            text, data = RESTART_LINE, {"type": "cut", "entry_id": cut.id, "received": True}
        else:  # unknown, or missed a second time: the user decides (Resend)
            text = MISSED_AGAIN_LINE if got is False else UNKNOWN_LINE
            data = {"type": "cut", "entry_id": cut.id, "received": got, "resend": True}
        line = self._line(session, conversation, text, level="warning", data=data)
        cut_as = "received" if got else "unknown" if got is None else "missed"
        self._save(
            session, conversation, cut, data={**cut.data, "cut": cut_as, "cut_line": line.id}
        )

    def _receipt_agent(self, conversation: Conversation) -> Agent | None:
        """The conversation's agent, not started, when it can tell what it received."""
        try:
            spec = self._agent_spec(conversation, None)
            agent = self.agent_factory(conversation.provider, spec, self.settings)
        except Exception:  # then it cannot tell
            log.warning("no agent for conversation %s", conversation.id, exc_info=True)
            return None
        return agent if isinstance(agent, Receipts) else None

    def _received(
        self, agent: Agent | None, conversation: Conversation, entry: Entry
    ) -> bool | None:
        """Ask the agent whether it got the message; None when it cannot know."""
        prompt_id = entry.data.get("prompt_uuid")
        if agent is None or not isinstance(prompt_id, str):
            return None  # no record, or sent by a relay that did not store the id
        try:
            created = entry.created_at.replace(tzinfo=entry.created_at.tzinfo or UTC)
            return received(agent, conversation.session_id, prompt_id, created.timestamp())
        except Exception:  # a failed check only means "cannot know"
            log.warning("cannot tell whether entry %s reached the agent", entry.id, exc_info=True)
            return None

    def _redeliver(self, session: Session, conversation: Conversation, entry: Entry) -> None:
        """Queue a message the agent never received again, ahead of every other queued one."""
        queued = store.entries_in_state(
            session=session, conversation_id=conversation.id or 0, state="queued"
        )
        data = {key: value for key, value in entry.data.items() if key != "prompt_uuid"}
        summary = data.pop("summary", None)
        if isinstance(summary, str) and conversation.pending_summary is None:
            conversation.pending_summary = summary  # it went out with the message: it goes again
            session.add(conversation)
        data["redelivered"] = True
        line_data = {"type": "redelivered", "entry_id": entry.id}
        self._line(session, conversation, REDELIVERED_LINE, level="warning", data=line_data)
        self._save(session, conversation, entry, move=True, state="queued", data=data)
        for later in queued:  # the queue is delivered by seq: these go after it, in their order
            self._save(session, conversation, later, move=True)

    # -- reading ---------------------------------------------------------------------------

    def turn_view(self, conversation_id: int, session: Session) -> dict[str, Any]:
        """The turn state and the number of queued messages."""
        runner = self.runners.get(conversation_id)
        state = runner.state if runner else "idle"
        queued = store.count_queued(session=session, conversation_id=conversation_id)
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            # Another node runs it: its last turn event, else the database's word.
            told = self.hub.state(conversation_id, "turn")
            conversation = store.get_conversation(session=session, conversation_id=conversation_id)
            busy = queued or (conversation is not None and conversation.turn_active)
            state = "idle"
            if busy:  # compacting, when the owner last said so
                state = "compacting" if told and told.get("state") == "compacting" else "running"
        return {"state": state, "queued": queued}

    def snapshot(
        self,
        conversation: Conversation,
        session: Session,
        *,
        limit: int = TIMELINE_PAGE,
        before_seq: int | None = None,
    ) -> dict[str, Any]:
        """A conversation with its latest timeline page and turn; live text included.

        Its seq is the last one published, read before the database: every event up to it is
        in what is read after, and a later one reaches a tab that follows from that seq.
        """
        conversation_id = conversation.id or 0
        self.hub.prime(conversation_id)
        shown = self.hub.shown_seq(conversation_id)
        runner = self.runners.get(conversation_id)
        # Read before the rows too: "idle" is set only after a turn's last rows are committed.
        here = self.cluster is None or self.cluster.holds(conversation_id)
        state = runner.state if runner is not None and here else None  # else the owner's word
        streaming = list(runner.streaming.values()) if runner is not None else []
        live = {s.entry_id: s.text_at(shown) for s in streaming}
        if self.cluster is not None:  # the text as delivered here up to seq, owner or not
            live = self.hub.live_text(conversation_id)
        entries = store.last_entries(
            session=session, conversation_id=conversation_id, limit=limit + 1, before_seq=before_seq
        )
        has_more = len(entries) > limit
        entries = entries[-limit:]
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
        if state is not None:  # this node runs it
            view["turn"]["state"] = state
        view["agent"] = self.agent_state(conversation_id)
        view["seq"] = shown
        view["epoch"] = self.hub.epoch
        return view

    async def view(
        self, conversation_id: int, *, limit: int = TIMELINE_PAGE, before_seq: int | None = None
    ) -> dict[str, Any]:
        """The snapshot of a conversation, read in a storage thread (LookupError: none)."""

        def read() -> dict[str, Any]:
            with self.session() as session:
                conversation = self._load(session, conversation_id)
                return self.snapshot(conversation, session, limit=limit, before_seq=before_seq)

        return await self.storage.read(read)

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
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            return self.hub.state(conversation_id, "agent") or "asleep"  # the owner's last word
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
        if self.cluster is not None:  # this node runs it if nobody does
            self.cluster.claim_here(conversation.id or 0, conversation.cwd)
        with self.session() as session:
            session.add(conversation)
            self._still_active(session, conversation)
            entry = self._add(session, conversation, "user", text, state="queued")
            self._wake(conversation.id or 0)
            self.publish_turn(conversation.id or 0, session)
        self.hub.broadcast(
            {"type": "conversation", "conversation": conversation_view(conversation)}
        )
        return entry

    def compact(
        self,
        conversation: Conversation,
        *,
        carry: str | None = None,
        handoff: bool = False,
        edited: str | None = None,
        revision: str | None = None,
    ) -> Conversation:
        """Archive a conversation and open its successor with a carry-over summary.

        carry replaces the summary: a backup's carry-over ("Start fresh from this backup").
        With handoff (/clear) the carry-over is the project's latest handoff, or nothing.
        Pins head every carry-over and move to the successor (SPEC §8); edited is the user's
        own carry-over, revision the preview's (refused, steer.STALE, when it no longer holds).
        Its queued messages move into the successor (same transaction); its agent process
        stops now, or once its running turn ends (a running turn is neither awaited nor
        stopped, SPEC §2).
        """
        if conversation.status != "active":
            raise ConversationError("This conversation is archived; it cannot be compacted again.")
        old_id = conversation.id or 0
        with self.session() as session:
            session.add(conversation)
            if handoff or carry is not None:
                plan = steer.plan_fresh(
                    session, conversation, carry, "clear" if handoff else "backup"
                )
            else:
                plan = steer.plan_compact(session, conversation)
            if revision is not None and revision != plan.revision:
                raise ConversationError(steer.STALE)  # before the backup: a refusal writes nothing
            if carry is None:
                self._backup_before(conversation, PRECOMPACT_MANUAL)
            plan = steer.apply_edit(plan, edited)
            try:
                new = store.compact_conversation(
                    session=session,
                    old=conversation,
                    summary=plan.summary,
                    title=compacted_title(conversation.title),
                    carry=plan.record(old_id),
                )
            except store.AlreadyArchived as error:  # another relay process compacted it first
                raise ConversationError(
                    "This conversation is archived; it cannot be compacted again."
                ) from error
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
        archived = self.runners.get(old_id)
        if archived is not None:
            archived.archived = True  # released by the reaper once its last turn has ended
        self._retire(old_id)
        return new

    @staticmethod
    def _still_active(session: Session, conversation: Conversation) -> None:
        """Refuse when a /compact stored since the route read the row archived it."""
        # Read in the writer's turn, after every earlier job; locked, so that a /compact on
        # another node moves this message with the queue or comes after it.
        session.refresh(conversation, with_for_update=True)
        if conversation.status != "active":
            raise ConversationError("This conversation is archived; it can be read, not written.")

    def resend(self, conversation: Conversation, entry_id: int) -> Entry:
        """Queue a cut turn's message again as a new message; the cut one remembers it."""
        if conversation.status != "active":
            raise ConversationError("This conversation is archived; it can be read, not written.")
        with self.session() as session:
            session.add(conversation)
            self._still_active(session, conversation)
            entry = store.get_entry(session=session, entry_id=entry_id)
            if entry is None or entry.conversation_id != conversation.id or entry.kind != "user":
                raise LookupError("No such message in this conversation.")
            if "cut" not in entry.data:
                raise ConversationError(
                    "Only a message whose turn a relay restart cut can be resent."
                )
            if entry.data.get("resent"):
                raise ConversationError("This message was already resent.")
            # Marked in the transaction that stores the new message: resent once, never lost.
            entry.data = {**entry.data, "resent": True}
            session.add(entry)
            line_id = entry.data.get("cut_line")
            line = store.get_entry(session=session, entry_id=line_id) if line_id else None
            if line is not None:
                line.data = {**line.data, "resent": True}
                session.add(line)
            data = {"resent_from": entry.id}
            new = self._add(session, conversation, "user", entry.text, state="queued", data=data)
            self._save(session, conversation, entry)
            if line is not None:
                self._save(session, conversation, line)
            self._wake(conversation.id or 0)
            self.publish_turn(conversation.id or 0, session)
        self.hub.broadcast(
            {"type": "conversation", "conversation": conversation_view(conversation)}
        )
        return new

    def _retire(self, conversation_id: int) -> None:
        """Stop an archived conversation's agent now; a running turn's loop stops it after."""
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            self.cluster.send("retire", conversation_id)  # its owner runs the agent
        self.storage.soon(self._retire_now, conversation_id)

    def _retire_now(self, conversation_id: int) -> None:
        runner = self.runners.get(conversation_id)
        if runner is None or runner.agent is None or (runner.task and not runner.task.done()):
            return  # _deliver_queue closes it once the running turn has ended
        runner.task = asyncio.create_task(
            self._close_agent(runner), name=f"retire-{conversation_id}"
        )

    def _refuse_while_busy(self, conversation: Conversation, action: str) -> None:
        """409 while a turn runs or messages wait (they would be lost or half-done)."""
        cid = conversation.id or 0
        runner = self.runners.get(cid)
        running = runner is not None and (
            runner.state != "idle" or (runner.task is not None and not runner.task.done())
        )
        with self.session() as session:
            queued = store.count_queued(session=session, conversation_id=cid)
        if running or queued or conversation.turn_active:
            raise ConversationError(
                f"A turn is running in this conversation; stop it before you {action} it."
            )

    def archive(self, conversation: Conversation) -> Conversation:
        """Archive a conversation without compacting it (read-only from now on)."""
        if conversation.status != "active":
            raise ConversationError("This conversation is already archived.")
        self._refuse_while_busy(conversation, "archive")
        conversation = self.update_conversation(conversation, status="archived")
        runner = self.runners.get(conversation.id or 0)
        if runner is not None:
            runner.archived = True  # released by the reaper
        return conversation

    async def delete(self, conversation: Conversation) -> None:
        """Delete a conversation: entries (search index too), backups, runner; tell every tab.

        Conversations it was compacted from or into stay, without the link to it.
        """
        cid = conversation.id or 0
        await self.storage.write(self._refuse_while_busy, conversation, "delete")
        runner = self.runners.pop(cid, None)
        if runner is not None:
            await self._close_agent(runner)
        changed = await self.storage.write(self._delete_rows, conversation)
        if self.cluster is not None and not self.cluster.holds(cid):
            self.cluster.send("deleted", cid)  # its owner may still have its agent
        await self.backups.forget(cid)
        self.hub.release(cid)
        self.hub.forget(cid)
        self.hub.broadcast({"type": "conversation_removed", "conversation_id": cid})
        for other in changed:
            if other is not None:
                self.publish_conversation(other)

    def _delete_rows(self, conversation: Conversation) -> list[Conversation | None]:
        """Delete the rows; the conversations that were linked to it, as they are now."""
        with self.session() as session:
            session.add(conversation)
            neighbours = [
                link
                for link in (conversation.compacted_from_id, conversation.compacted_into_id)
                if link is not None
            ]
            store.delete_conversation(session=session, conversation=conversation)
            for neighbour in neighbours:
                self.hub.prime(neighbour)  # told below, from the loop
            return [store.get_conversation(session=session, conversation_id=n) for n in neighbours]

    def warm(self, conversation: Conversation) -> str:
        """Start the agent of a conversation about to get a message; its agent state.

        Nothing happens when the agent is live or starting, or a turn will start it.
        """
        if conversation.status != "active":
            raise ConversationError("This conversation is archived; its agent is not started.")
        conversation_id = conversation.id or 0
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            self.cluster.warm(conversation_id)  # here if it is free, else on its owner
            return self.agent_state(conversation_id)
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
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            self.cluster.send("interrupt", conversation_id)
            return await self.storage.read(self._busy_elsewhere, conversation_id)
        runner = self.runners.get(conversation_id)
        if runner is None or runner.state == "idle":
            return False
        runner.stop_requested = True  # seen by _run_turn when the agent is still starting
        await self._interrupt_agent(runner)
        return True

    def _busy_elsewhere(self, conversation_id: int) -> bool:
        """Whether another node's conversation has a turn running (in a storage thread)."""
        with self.session() as session:
            return self.turn_view(conversation_id, session)["state"] != "idle"

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
        if future is not None:
            self.storage.soon(_settle, future, decision)
        elif self.cluster is not None and not self.cluster.holds(conversation.id or 0):
            fields = {"entry_id": entry_id, "allow": decision.allow, "message": decision.message}
            self.cluster.send("answer", conversation.id or 0, **fields)
        return entry

    # -- delivery --------------------------------------------------------------------------

    def _wake(self, conversation_id: int) -> None:
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            self.cluster.wake(conversation_id)  # taken here, or its owner is woken
            return
        runner = self.runner(conversation_id)
        if runner.task and not runner.task.done():
            runner.again = True  # its last look may predate this message: it looks again
        if not self._closing and runner.state == "idle":
            runner.state = "running"  # from now until the queue is empty
        self.storage.soon(self._wake_now, conversation_id)  # (tasks start on the loop)

    def _wake_now(self, conversation_id: int) -> None:
        runner = self.runner(conversation_id)
        if self._closing:
            return
        if runner.task and not runner.task.done():
            # Its last look at the queue may predate this message (it was stored in the
            # writer thread meanwhile): it looks again before it ends.
            runner.again = True
            return
        runner.state = "running"  # from now until the queue is empty
        runner.task = asyncio.create_task(self._deliver(runner), name=f"deliver-{conversation_id}")

    async def _deliver(self, runner: Runner) -> None:
        """Deliver queued messages one turn at a time until none is left."""
        while True:
            runner.again = False
            try:
                await self._deliver_queue(runner)
            finally:
                if not runner.again:  # else a message came meanwhile: it stays running
                    runner.state = "idle"
                try:
                    if not runner.again and not runner.idle_shown:
                        await self.storage.write(self._publish_turn, runner.conversation_id)
                except Exception:  # the tabs learn the state on their next load
                    log.exception(
                        "conversation %s: could not publish the idle turn", runner.conversation_id
                    )
            runner.idle_shown = False
            if not runner.again or self._closing:
                return
            runner.state = "running"

    def _publish_turn(self, conversation_id: int) -> None:
        with self.session() as session:
            self.publish_turn(conversation_id, session)

    async def _deliver_queue(self, runner: Runner) -> None:
        delay = RETRY_SECONDS
        while not self._closing:
            if self.cluster is not None and not self.cluster.holds(runner.conversation_id):
                return  # the lease went to another node: it delivers the rest
            try:
                if runner.looked:  # by the job that ended the last turn
                    runner.looked, prompt = False, runner.upcoming
                else:
                    runner.again = False  # this look sees every message stored before it
                    prompt = await self._patiently(self._next_turn, runner)
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
                if runner.again:  # a message came while the writer looked
                    runner.idle_shown = False
                    continue
                if runner.archived:  # /compact came during its last turn (SPEC §2)
                    await self._close_agent(runner)
                return
            try:
                await self._run_turn(runner, prompt)
            except Exception as error:  # one failing turn must not stop the queue
                log.exception("turn failed in conversation %s", runner.conversation_id)
                await self._error_line_soon(runner, f"The turn failed: {failure_reason(error)}")
            finally:
                try:
                    if runner.ended:
                        runner.ended = False
                    else:
                        await self._patiently(self._end_turn, runner)
                except Exception:  # retried by _next_turn once the database works
                    log.exception(
                        "conversation %s: could not close the turn", runner.conversation_id
                    )
                    runner.ending = True

    async def _patiently(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a runner's write; while another program holds SQLite's write lock, wait for it.

        The check is made in the writer thread, just before the write: no extra round trip.
        Answered once committed (Storage.write_early): the agent's records and the turn's
        bookkeeping; user messages are acknowledged only after their fsync (Storage.write).
        """
        deadline = time.monotonic() + WRITE_PATIENCE
        while True:
            try:
                return await self.storage.write_early(self._if_writable, fn, *args)
            except Locked:
                if time.monotonic() >= deadline:  # then it fails as any database error does
                    return await self.storage.write(fn, *args)
                await asyncio.sleep(0.05)  # polled: another process's lock sends no signal

    def _if_writable(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not write_lock_free(self.engine):
            raise Locked
        return fn(*args)

    def _finish_turn(self, runner: Runner) -> None:
        """End the turn and look at the queue, in the job that stored its last event."""
        try:
            self._end_turn(runner)
        except Exception:  # retried by _next_turn once the database works
            log.exception("conversation %s: could not close the turn", runner.conversation_id)
            runner.ending = True
        runner.ended = True
        if self._closing:  # no new turn begins once the relay is stopping
            return
        try:
            runner.upcoming = self._next_turn(runner)
        except Exception:  # the runner's loop looks again, and retries
            log.exception("conversation %s: could not look at the queue", runner.conversation_id)
            return
        runner.looked = True
        if runner.upcoming is None and not runner.archived:
            runner.state = "idle"  # as _deliver sets it: said now, in this burst
            with self.session() as session:
                self.publish_turn(runner.conversation_id, session)
            runner.idle_shown = True

    def _next_turn(self, runner: Runner) -> str | None:
        """Finish what a failed turn left, then begin the next queued message (None: none)."""
        if runner.ending:
            self._end_turn(runner)
            runner.ending = False
        if runner.failure is not None:
            self._write_error(runner, runner.failure)
            runner.failure = None
        with self.session() as session:
            # Locked: a /compact on another node moves the queue before or after, never during.
            conversation = store.lock_conversation(
                session=session, conversation_id=runner.conversation_id
            )
            if conversation is None:
                return None
            if self.cluster is not None and not self.cluster.still_owner(session, runner):
                return None  # the lease lapsed (this node stalled): its new owner delivers
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
        command = is_handoff_command(entry.text)
        prompt = HANDOFF_REQUEST if command else entry.text
        data = dict(entry.data)
        # The context watch: past soft, a note after the user's text (never for /handoff).
        note = None if command else self._context_note(conversation)
        if note is not None:
            prompt = with_note(prompt, note)
            data["context_note"] = note
        changes: dict[str, Any] = {"turn_active": True}
        runner.carried_summary = conversation.pending_summary
        if conversation.pending_summary is not None:
            # Consumed in the same transaction that marks the message sent: never sent twice.
            prompt = first_message(conversation.pending_summary, prompt)
            changes["pending_summary"] = None
            data["summary"] = conversation.pending_summary  # to send again if it never arrived
        for name, value in changes.items():
            setattr(conversation, name, value)
        session.add(conversation)  # saved in the same transaction as the entry
        # The prompt's id is stored before it goes out: after a crash the agent's own record
        # tells whether it arrived (Receipts).
        runner.prompt_id = data["prompt_uuid"] = str(uuid.uuid4())
        self._save(session, conversation, entry, move=True, state="sent", data=data)
        if "pending_summary" in changes:
            self.publish_conversation(conversation)
        runner.state = "running"
        runner.last_agent_entry = None
        runner.lines_shown.clear()
        runner.retry_line = None
        self.publish_turn(conversation.id or 0, session)
        self.hub.broadcast(
            {"type": "conversation", "conversation": conversation_view(conversation)}
        )
        runner.turn_conversation = conversation
        return prompt

    def _context_note(self, conversation: Conversation) -> str | None:
        """The context watch's paragraph for this conversation's size, if any."""
        soft, hard = self.settings.context_soft, self.settings.context_hard
        return context_note(conversation.context_tokens, soft, hard)

    def save_handoff(
        self, conversation: Conversation, handoff: HandoffText, *, source: str
    ) -> Handoff:
        """Store a handoff for the conversation's project; the agent's also shows as a card."""
        with self.session() as session:
            session.add(conversation)
            row = store.save_handoff(
                session=session,
                cwd=conversation.cwd,
                done=handoff.done,
                next=handoff.next,
                files=list(handoff.files),
                source=source,
                conversation_id=conversation.id,
            )
            if source == "agent":
                data = {"type": "handoff", "handoff_id": row.id, "done": row.done}
                data |= {"next": row.next, "files": row.files}
                self._add(session, conversation, "activity", "Handoff saved", data=data)
        return row

    async def _tool_save_handoff(
        self, conversation_id: int, arguments: dict[str, Any]
    ) -> ToolResult:
        """The save_handoff tool: check the arguments (errors go back to the agent), store."""
        handoff = parse_handoff(arguments)
        conversation = await self._conversation(conversation_id)
        await self.storage.write(self.save_handoff, conversation, handoff, source="agent")
        return ToolResult(saved_text(handoff))

    async def _tool_archive(
        self,
        tool: Callable[[Session, int, dict[str, Any]], str],
        conversation_id: int,
        arguments: dict[str, Any],
    ) -> ToolResult:
        """search_archive or read_archive for this conversation (ValueError: a tool error)."""

        def read() -> ToolResult:
            with self.session() as session:
                return ToolResult(tool(session, conversation_id, arguments))

        return await self.storage.read(read)

    def _end_turn(self, runner: Runner) -> None:
        runner.state = "running"  # _deliver sets idle once the queue is empty
        runner.stop_requested = False  # a Stop after this point is for the next turn
        runner.carried_summary = None
        runner.last_used = time.monotonic()
        for future in list(runner.questions.values()):
            self.storage.soon(_settle, future, PermissionDecision(False, "The turn ended."))
        with self.session() as session:
            conversation = store.get_conversation(
                session=session, conversation_id=runner.conversation_id
            )
            if conversation is None:
                return
            for streaming in list(runner.streaming.values()):
                if streaming.live is not None:
                    self.storage.soon(streaming.live.close)
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
            runner.compaction_began = None
            runner.tools.clear()
            store.update_conversation(session=session, conversation=conversation, turn_active=False)
        # Every tab's sidebar: not running any more, and when it was last active.
        self.hub.broadcast(
            {"type": "conversation", "conversation": conversation_view(conversation)}
        )

    async def _ensure_agent(self, runner: Runner) -> Agent:
        warming = runner.warming
        if warming is not None and warming is not asyncio.current_task():
            # A warm-up under way: its agent serves this turn (if it fails, this one starts).
            await asyncio.wait({warming})  # never raises its error, never cancels it
        if runner.agent is not None:
            return runner.agent
        conversation = await self._conversation(runner.conversation_id)
        spec = self._agent_spec(conversation, runner)
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
            await self.storage.write(self._applied, conversation)
        return agent

    def _applied(self, conversation: Conversation) -> None:
        with self.session() as session:
            session.add(conversation)
            store.update_conversation(
                session=session,
                conversation=conversation,
                applied_window=conversation.auto_compact_window,
            )

    def _agent_spec(self, conversation: Conversation, runner: Runner | None) -> AgentSpec:
        """What the conversation's agent starts with; without a runner it asks nothing."""

        async def ask(request: PermissionRequest) -> PermissionDecision:
            if runner is None:
                return PermissionDecision(False, "No turn is running.")
            return await self._ask(runner, request)

        return AgentSpec(
            conversation_id=conversation.id or 0,
            cwd=Path(conversation.cwd),
            session_id=conversation.session_id,
            permission_mode=conversation.permission_mode,
            auto_compact_window=conversation.auto_compact_window,
            env=agent_env(conversation.provider, self.settings, conversation.auto_compact_window),
            ask_permission=ask,
            context_tokens=conversation.context_tokens,
            tools=relay_tools(
                save_handoff=lambda arguments: self._tool_save_handoff(
                    conversation.id or 0, arguments
                ),
                search_archive=lambda arguments: self._tool_archive(
                    archive.search_archive, conversation.id or 0, arguments
                ),
                read_archive=lambda arguments: self._tool_archive(
                    archive.read_archive, conversation.id or 0, arguments
                ),
            ),
        )

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
        try:
            conversation = await self._conversation(runner.conversation_id)
        except LookupError:
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
        conversation = runner.turn_conversation or await self._conversation(runner.conversation_id)
        if conversation.session_id is None:
            return
        old, new = conversation.applied_window, conversation.auto_compact_window
        if old == new:
            return
        if runner.agent is not None and runner.agent.background_work():
            return  # a restart would kill it: applies once the background work has ended
        # Claude Code reads the window only at start: resume the same session with the new one.
        await self._close_agent(runner)

        def restarted() -> None:
            with self.session() as session:
                session.add(conversation)
                self._line(session, conversation, restart_line(old, new), data={"type": "restart"})
                store.update_conversation(
                    session=session, conversation=conversation, applied_window=new
                )

        await self.storage.write(restarted)

    async def _run_turn(self, runner: Runner, prompt: str) -> None:
        try:
            await self._apply_window(runner)
            agent = await self._ensure_agent(runner)
        except Exception as error:  # noqa: BLE001 - shown to the user, the queue goes on
            log.warning("agent of conversation %s did not start: %s", runner.conversation_id, error)
            await self._error_line_soon(
                runner, f"The agent could not start: {failure_reason(error)}"
            )
            return
        finally:
            runner.turn_conversation = None
        if runner.stop_requested:  # Stop came while the agent was starting: send nothing
            await self.storage.write(self._stop_before_delivery, runner)
            return
        try:
            if isinstance(agent, Receipts) and runner.prompt_id:
                turn = agent.turn(prompt, prompt_id=runner.prompt_id)
            else:
                turn = agent.turn(prompt)
            # The events that arrived while the last burst was being stored are stored together,
            # in one storage job: one read of the conversation, one fsync.
            async for burst in bursts(turn):
                try:
                    # On a cluster node every burst goes to the writer: a number is a Redis
                    # round trip there, never taken on the loop.
                    if self.cluster is not None or any(self._stores(runner, e) for e in burst):
                        if any(isinstance(event, TurnDone) for event in burst):
                            runner.again = False  # the job looks at the queue (_finish_turn)
                        await self._patiently(self._handle_all, runner, burst)
                    else:  # text of messages already stored: published from here
                        for event in burst:
                            self._handle(runner, event)
                except Exception as error:  # the database failed: this turn cannot be recorded
                    log.exception(
                        "conversation %s: could not store an agent event", runner.conversation_id
                    )
                    await self._error_line_soon(
                        runner,
                        "The relay could not store this turn "
                        f"({failure_reason(error)}); the turn was stopped.",
                    )
                    await self._close_agent(runner)
                    return
                if any(isinstance(event, TurnDone) for event in burst):
                    break
            if runner.reported_agent is not agent:
                # The window is fixed for a process's life: check it once per process. (Fresh
                # categories are fetched when someone opens the 🧠 modal: refresh_context.)
                runner.reported_agent = agent
                runner.reporting = asyncio.create_task(self._report_context(runner, agent))
        except Exception as error:  # noqa: BLE001 - the agent crashed; the next message restarts it
            log.warning("agent of conversation %s failed: %s", runner.conversation_id, error)
            await self._error_line_soon(
                runner, f"The agent stopped unexpectedly: {failure_reason(error)}"
            )
            await self._close_agent(runner)

    @staticmethod
    def _stores(runner: Runner, event: AgentEvent) -> bool:
        """True for an event that writes: all but more text of a message (or its checkpoint)."""
        if not isinstance(event, TextDelta):
            return True
        streaming = runner.streaming.get(event.message_id)
        return streaming is None or time.monotonic() - streaming.checkpoint_at >= CHECKPOINT_SECONDS

    async def _error_line_soon(self, runner: Runner, text: str) -> None:
        """Show an error line, written in the storage thread (see _error_line)."""
        await self._patiently(self._error_line, runner, text)

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
        future: asyncio.Future[PermissionDecision] = asyncio.get_running_loop().create_future()
        await self._patiently(self._question, runner, request, future)
        return await future

    def _question(
        self,
        runner: Runner,
        request: PermissionRequest,
        future: asyncio.Future[PermissionDecision],
    ) -> None:
        change = edit_change(request.tool_name, request.tool_input)
        edit = {"edit": change} if change else {}
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
                    **edit,  # what an edit or write would change, shown as a diff
                },
            )
        runner.questions[entry.id or 0] = future  # before any answer can come (tabs see it after)

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
                await self.storage.write(self.release_idle, time.monotonic() - timeout)
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

    def _handle_all(self, runner: Runner, events: list[AgentEvent]) -> None:
        """Record a burst of agent events in one storage job: one session, one read of the row."""
        with self.session() as session:
            conversation: Conversation | None = None
            for event in events:
                if conversation is None and not isinstance(event, TextDelta):
                    conversation = self._load(session, runner.conversation_id)
                self._handle(runner, event, session, conversation)
                if isinstance(event, TurnDone):
                    break
        if any(isinstance(event, TurnDone) for event in events):
            self._finish_turn(runner)  # its last event stored: end it here, one fsync for all

    def _handle(
        self,
        runner: Runner,
        event: AgentEvent,
        given: Session | None = None,
        loaded: Conversation | None = None,
    ) -> None:
        """Record one agent event: store what lasts, publish everything."""
        runner.last_used = time.monotonic()
        cid = runner.conversation_id
        if isinstance(event, TextDelta):
            self._on_delta(runner, event)
            return
        with contextlib.nullcontext(given) if given else self.session() as session:
            conversation = loaded or self._load(session, cid)
            match event:
                case SessionStarted(session_id=session_id):
                    if conversation.session_id != session_id:
                        store.update_conversation(
                            session=session, conversation=conversation, session_id=session_id
                        )
                case MessageDone(message_id=message_id, text=text):
                    streaming = runner.streaming.pop(message_id, None)
                    if streaming is not None and streaming.live is not None:
                        streaming.live.close()
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
                    if change := edit_change(event.name, event.input):
                        data["edit"] = change  # shown as a diff
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
                    runner.compaction_began = time.monotonic()
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
                    runner.compaction_began = None
                    runner.state = "running"
                    self.publish_turn(cid, session)
                case Notice(text=text, level=level, data=data) if is_retry(event):
                    # One line per turn, updated in place, not a line per attempt.
                    if runner.retry_line is None:
                        runner.retry_line = self._line(
                            session, conversation, text, level=level, data=data
                        )
                    else:
                        data = {"level": level, **data}
                        self._save(session, conversation, runner.retry_line, text=text, data=data)
                    runner.lines_shown.add(text)
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
        seq = self.hub.next_seq(runner.conversation_id)
        streaming.parts.append(event.text)
        streaming.seqs.append(seq)  # a snapshot at a seq shows the text up to it (text_at)
        delta = {"type": "delta", "entry_id": streaming.entry_id, "text": event.text, "seq": seq}
        self.hub.publish(runner.conversation_id, delta)
        if streaming.live is None:
            streaming.live = self._live_render(runner, event.message_id, streaming)
        self.storage.soon(streaming.live.poke)  # (its timer is the loop's)
        now = time.monotonic()
        if now - streaming.checkpoint_at >= CHECKPOINT_SECONDS:
            # A crash-safe checkpoint of the partial text, not a write per delta.
            streaming.checkpoint_at = now
            if self.storage.on_loop():
                self.storage.submit(self._checkpoint, streaming).add_done_callback(_logged)
            else:
                self._checkpoint(streaming)

    def _checkpoint(self, streaming: Streaming) -> None:
        """Write the partial text; skipped while another program holds the write lock."""
        if not write_lock_free(self.engine):
            return  # the next delta tries again
        streaming.entry.text = streaming.text
        with self.session() as session:
            session.add(streaming.entry)
            session.commit()

    def _live_render(self, runner: Runner, message_id: str, streaming: Streaming) -> LiveRender:
        """Rendering of a streaming message, sent as a delta with html and no text."""

        def emit(html: str, rendered: int) -> None:
            if runner.streaming.get(message_id) is streaming:  # else done or dropped
                event = {"type": "delta", "entry_id": streaming.entry_id, "text": ""}
                self.hub.emit(runner.conversation_id, event | {"html": html, "rendered": rendered})

        return LiveRender(lambda: streaming.text, emit)

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
        began, runner.compaction_began = runner.compaction_began, None
        details = {  # what the line's details show (README: "What each compaction did")
            "duration_ms": (
                round((time.monotonic() - began) * 1000) if began is not None else event.duration_ms
            ),
            "summary": store.storable(clip_summary(event.summary)) if event.summary else None,
        }
        data = {
            "type": "compaction",
            "trigger": event.trigger,
            "level": "info",
            **{key: value for key, value in (numbers | details).items() if value is not None},
        }
        text = finished_text(style, **numbers)
        self.storage.soon(self.backups.submit, Job(conversation.id or 0, "reset"))  # rails anew
        if runner.compaction is None:
            entry = self._add(session, conversation, style, text, data=data)
        else:
            entry = runner.compaction
            merged = {**entry.data, **data}
            self._save(session, conversation, entry, text=text, state="done", data=merged)
            runner.compaction = None
        agent = runner.agent
        if event.record_id and not event.summary and isinstance(agent, CompactionSummaries):
            self.storage.soon(  # a task is made on the loop, not in this storage job
                self._start_summary_read,
                runner.conversation_id,
                entry.id or 0,
                agent,
                event.record_id,
            )
        if event.post_tokens is not None:
            store.update_conversation(
                session=session, conversation=conversation, context_tokens=event.post_tokens
            )
            self.publish_conversation(conversation)
            self._backup_figure(conversation, event.post_tokens)
        runner.state = "running"
        self.publish_turn(runner.conversation_id, session)

    def _start_summary_read(
        self, cid: int, entry_id: int, agent: CompactionSummaries, record_id: str
    ) -> None:
        read = asyncio.create_task(self._read_summary(cid, entry_id, agent, record_id))
        self._summary_reads.add(read)
        read.add_done_callback(self._summary_reads.discard)

    async def _read_summary(
        self, cid: int, entry_id: int, agent: CompactionSummaries, record_id: str
    ) -> None:
        """Add the agent's summary to a compaction line once its own files hold it.

        Claude Code writes its transcript a moment after it reports the compaction: look a few
        times, then give up (the details then say the agent reported none).
        """
        delay, deadline = 0.1, time.monotonic() + SUMMARY_WAIT
        while True:
            try:
                summary = await asyncio.to_thread(agent.compaction_summary, record_id)
            except Exception:  # an unreadable file: the line stays without a summary
                log.exception("conversation %s: could not read a compaction summary", cid)
                return
            if summary or time.monotonic() >= deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        if not summary:
            log.info("conversation %s: no summary found for compaction %s", cid, record_id)
            return
        try:
            await self._patiently(self._store_summary, cid, entry_id, summary)
        except Exception:  # the summary is an extra: never let it reach the turn
            log.exception("conversation %s: could not store a compaction summary", cid)

    def _store_summary(self, cid: int, entry_id: int, summary: str) -> None:
        """Add a compaction's summary to its line (a storage job)."""
        with self.session() as session:
            conversation = store.get_conversation(session=session, conversation_id=cid)
            entry = store.get_entry(session=session, entry_id=entry_id)
            if conversation is None or entry is None:
                return  # deleted meanwhile
            data = {**entry.data, "summary": store.storable(clip_summary(summary))}
            self._save(session, conversation, entry, data=data)

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
        self.storage.soon(self.backups.submit, job)

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
        self.storage.soon(self.backups.submit, job)

    def _on_backup(self, outcome: Outcome) -> None:
        """A backup job ended: link it (header, compaction line) or say why it failed."""
        try:
            self.storage.submit(self._record_backup, outcome).add_done_callback(_logged)
        except RuntimeError:  # the relay is stopping: the backup's file is there all the same
            log.info("backup of conversation %s not linked (shutdown)", outcome.conversation_id)

    def _record_backup(self, outcome: Outcome) -> None:
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


async def bursts(events: AsyncIterator[AgentEvent]) -> AsyncIterator[list[AgentEvent]]:
    """The agent's events in bursts: each time, every event that arrived since the last burst.

    A reader task drains the agent while the consumer stores the previous burst; an error of
    the agent is raised after the events that came before it.
    """
    queue: asyncio.Queue[AgentEvent | BaseException | None] = asyncio.Queue()

    async def read() -> None:
        try:
            async for event in events:
                queue.put_nowait(event)
                if isinstance(event, TurnDone):
                    break
        except Exception as error:  # noqa: BLE001 - handed to the consumer, in order
            queue.put_nowait(error)
        finally:
            queue.put_nowait(None)

    reader = asyncio.create_task(read(), name="agent-events")
    try:
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            burst = [i for i in items if i is not None and not isinstance(i, BaseException)]
            if burst:
                yield burst
            for item in items:
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    return
    finally:
        if not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
