"""Agent events: each one stored (in bursts) and published, compactions and their summaries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from app import store
from app.agents.base import (
    Activity,
    AgentEvent,
    CompactionFailed,
    CompactionFinished,
    CompactionStarted,
    CompactionSummaries,
    MessageDone,
    ModeChanged,
    Notice,
    Receipts,
    SessionStarted,
    TextDelta,
    TurnDone,
    Usage,
)
from app.backup_files import Job
from app.backups import PRECOMPACT_AUTO, tool_facts
from app.cluster.leases import LeaseLost
from app.compaction import clip_summary, failed_text, finished_text, started_text
from app.db import write_lock_free
from app.edits import edit_change
from app.live_render import LiveRender
from app.models import Conversation
from app.providers import compaction_style
from app.supervisor.base import SupervisorState
from app.supervisor.runner import (
    NotBegun,
    Runner,
    Streaming,
    TurnState,
    _logged,
    is_retry,
)

log = logging.getLogger(__name__)


CHECKPOINT_SECONDS = 1.0  # streamed text is written to the database at least this often
SHUTDOWN_LINE = "Interrupted: the relay was shut down."
SUMMARY_WAIT = 30.0  # seconds a compaction's summary is looked for in the agent's own files


def _checkpoint_due(streaming: Streaming, now: float | None = None) -> bool:
    """Whether a streaming message's partial text is due to be written (at `now`)."""
    now = time.monotonic() if now is None else now
    return now - streaming.checkpoint_at >= CHECKPOINT_SECONDS


class Events(SupervisorState):
    """The recording of agent events (mixed into Supervisor)."""

    @staticmethod
    def _stores(runner: Runner, event: AgentEvent, now: float | None = None) -> bool:
        """True for an event that writes: all but more text of a message (or its checkpoint,
        due at `now`)."""
        if not isinstance(event, TextDelta):
            return True
        streaming = runner.streaming.get(event.message_id)
        return streaming is None or _checkpoint_due(streaming, now)

    def _handle_all(self, runner: Runner, events: list[AgentEvent]) -> None:
        """Record a burst of agent events in one storage job: one session, one read of the row."""
        # A message that begins and ends in this burst is stored once, done: no streaming row
        # first (an INSERT and a commit less), no deltas that its entry replaces at once. It
        # is stored where its first delta is: before a tool call that came with it.
        first = {
            e.message_id: e
            for e in events
            if isinstance(e, MessageDone) and e.message_id not in runner.streaming
        }
        whole = set(first)
        deltas = sum(isinstance(e, TextDelta) and e.message_id not in whole for e in events)
        # One reading of the clock for the burst: the checkpoints it writes are the ones found
        # due before it began (a cluster node's burst that writes nothing touches no database).
        now = time.monotonic()
        with contextlib.ExitStack() as stack:
            if self.cluster is None:
                session = stack.enter_context(self.session())
            else:
                writes = any(self._stores(runner, event, now) for event in events)
                session = self._begin_cluster_burst(stack, runner, deltas, writes)
            conversation: Conversation | None = None
            for event in events:
                if isinstance(event, TextDelta) and event.message_id in whole:
                    runner.last_used = time.monotonic()
                    if (done := first.pop(event.message_id, None)) is None:
                        continue  # stored already, at the message's first delta
                    event = done
                elif (
                    isinstance(event, MessageDone)
                    and event.message_id in whole
                    and event.message_id not in first
                ):
                    continue  # stored at its first delta
                if conversation is None and not isinstance(event, TextDelta):
                    conversation = self._load(session, runner.conversation_id)
                self._handle(runner, event, session, conversation, now)
                if isinstance(event, TurnDone):
                    # Its last event stored: end it here, in this session (the conversation
                    # is read already), and look at the queue.
                    self._finish_turn(runner, session, conversation)
                    break

    def _begin_cluster_burst(
        self, stack: contextlib.ExitStack, runner: Runner, deltas: int, writes: bool
    ) -> Session:
        """A cluster node's burst: its numbers (one Redis round trip) and, when it writes
        (anything but more text of a stored message), a database connection.

        Taken before anything of the burst is changed (runner or rows): when Redis or the
        database cannot be reached, NotBegun says the burst may be tried again as it is.
        A burst without deltas takes a number all the same: its first entry uses it.
        """
        assert self.cluster is not None
        try:
            stack.enter_context(self.cluster.numbers(runner.conversation_id, max(deltas, 1)))
            session = stack.enter_context(self.session())
            # Checked out and pinged now, as its first statement would do; more text of a
            # stored message writes nothing: no round trip added to a streaming reply.
            if writes:
                session.connection()
            may_write = self.cluster.may_write(session, runner)
        except (redis.RedisError, OSError, DBAPIError) as error:
            raise NotBegun(error) from error
        if not may_write:
            raise LeaseLost(runner.conversation_id)  # stalled past its lease: store nothing
        return session

    def _handle(
        self,
        runner: Runner,
        event: AgentEvent,
        given: Session | None = None,
        loaded: Conversation | None = None,
        now: float | None = None,
    ) -> None:
        """Record one agent event: store what lasts, publish everything.

        given: the burst's session (a cluster node's, checked out before it began); now: the
        burst's clock, which says whether a delta's checkpoint is due.
        """
        runner.last_used = time.monotonic()
        cid = runner.conversation_id
        if isinstance(event, TextDelta):
            self._on_delta(runner, event, given, now)
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
                    self._figure_checked(runner, conversation)
                case Activity(phase="call"):
                    data = {"type": "tool", "tool": event.name, "tool_id": event.tool_id}
                    if facts := tool_facts(event.name, event.input):
                        data["backup"] = facts  # what a backup lists of this call
                    if change := edit_change(event.name, event.input):
                        data["edit"] = change  # shown as a diff
                    runner.tools[event.tool_id] = self._add(
                        session, conversation, "activity", event.summary, state="running", data=data
                    )
                    self.storage.soon(runner.call_stored, event.tool_id)  # its question may follow
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
                    # The turn's result repeats its last message's usage: as read in this job,
                    # the row has it already (no write, no event; the turn's end touches it).
                    if any(getattr(conversation, k) != v for k, v in changes.items()):
                        store.update_conversation(
                            session=session, conversation=conversation, **changes
                        )
                        self.publish_conversation(conversation)
                    # Checked once the reply it is the figure of is stored (MessageDone, or the
                    # turn's end): a backup it fires holds that reply in its Key Replies.
                    runner.figure = event.context_tokens
                case CompactionStarted(trigger=trigger):
                    style = compaction_style(conversation.provider)
                    runner.state = TurnState.COMPACTING
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
                case ModeChanged(mode=mode) if runner.mode_echoes and runner.mode_echoes[0] == mode:
                    runner.mode_echoes.popleft()  # the relay's own switch: stored already
                case ModeChanged(mode=mode):
                    # The agent's own change (plan mode left by an approved plan): the
                    # conversation's mode, in every tab and for the agent's next start.
                    runner.agent_mode = mode
                    if conversation.permission_mode != mode:
                        store.update_conversation(
                            session=session, conversation=conversation, permission_mode=mode
                        )
                        self.publish_conversation(conversation)
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
                    runner.state = TurnState.RUNNING
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
                    self._figure_checked(runner, conversation)

    def _figure_checked(self, runner: Runner, conversation: Conversation) -> None:
        """Check the context figure that waited for its reply against the backup rails."""
        if runner.figure is not None:
            figure, runner.figure = runner.figure, None
            self._backup_figure(conversation, figure)

    def _stream_now(self, runner: Runner, event: AgentEvent) -> bool:
        """Publish more text of a stored message at once, on the loop, if it stores nothing.

        The hot path of a streaming reply (what `_stores` says false for, as `_handle` would
        do it); False, and nothing done, for any other event.
        """
        if not isinstance(event, TextDelta):
            return False
        streaming = runner.streaming.get(event.message_id)
        if streaming is None:
            return False
        now = time.monotonic()
        if now - streaming.checkpoint_at >= CHECKPOINT_SECONDS:  # (_checkpoint_due, inline)
            return False  # its checkpoint is due: a write
        runner.last_used = now
        self._publish_text(runner, event, streaming, on_loop=True)
        return True

    def _on_delta(
        self,
        runner: Runner,
        event: TextDelta,
        given: Session | None = None,
        now: float | None = None,
    ) -> None:
        streaming = runner.streaming.get(event.message_id)
        if streaming is None:
            with contextlib.nullcontext(given) if given else self.session() as session:
                conversation = self._load(session, runner.conversation_id)
                entry = self._add(session, conversation, "agent", "", state="streaming")
            streaming = runner.streaming[event.message_id] = Streaming(entry)
        self._publish_text(runner, event, streaming)
        if _checkpoint_due(streaming, now):
            # A crash-safe checkpoint of the partial text, not a write per delta.
            streaming.checkpoint_at = time.monotonic() if now is None else now
            if self.storage.on_loop():
                self.storage.submit(self._checkpoint, streaming).add_done_callback(_logged)
            else:
                self._checkpoint(streaming, given)

    def _publish_text(
        self, runner: Runner, event: TextDelta, streaming: Streaming, on_loop: bool = False
    ) -> None:
        """Number a piece of a streaming message's text, keep it, publish it, have it rendered.

        on_loop: called on the loop (not from a storage job): numbered and published at once.
        """
        # As it will be stored: half an emoji could be neither rendered, sent nor checkpointed.
        text = event.text
        if "\x00" in text or not text.isascii():  # (most text is ASCII: no call then)
            text = store.storable(text)
        # Kept before it is numbered and published: a snapshot at a seq shows the text of the
        # parts numbered up to it (text_at), a part without its number yet in none.
        streaming.parts.append(text)
        if on_loop:
            self.hub.stream_delta(runner.conversation_id, streaming.entry_id, text, streaming.seqs)
        else:
            seq = self.hub.next_seq(runner.conversation_id)
            streaming.seqs.append(seq)
            self.hub.publish_delta(runner.conversation_id, seq, streaming.entry_id, text)
        live = streaming.live
        if live is None:
            live = streaming.live = self._live_render(runner, event.message_id, streaming)
        if not live.noted():  # else a rendering already due will read this text too
            if on_loop:
                live.poke()
            else:
                self.storage.soon(live.poke)  # (its timer is the loop's)

    def _checkpoint(self, streaming: Streaming, given: Session | None = None) -> None:
        """Write the partial text; skipped while another program holds the write lock.

        A write whose connection was lost (the database ended it, a network cut), in a session
        holding nothing else (a burst of more text: its checkpoints are its only writes), is
        skipped too: the text is published already, and the next checkpoint writes all of it.
        Before, the database ending the burst's connection at that moment stopped the turn. A
        database that refuses the write (its disk full) still stops the turn at once.
        """
        if not write_lock_free(self.engine):
            return  # the next delta tries again
        with contextlib.nullcontext(given) if given else self.session() as session:
            try:
                store.write_checkpoint(
                    session=session, entry_id=streaming.entry_id, text=streaming.text
                )
            except DBAPIError as error:
                # (a rollback would expire what the burst holds)
                if not error.connection_invalidated or len(session.identity_map):
                    raise
                session.rollback()
                log.warning("a streaming reply's checkpoint was not written: %s", error)

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
        runner.state = TurnState.RUNNING
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

    def _unanswered(self, session: Session, runner: Runner, conversation: Conversation) -> bool:
        """Whether nothing of the agent follows the turn's message, and the agent keeps a record
        to ask: then it may never have taken the message (a CLI interrupted before it
        recorded its prompt, while a hook of the user's ran, drops it)."""
        cut = store.last_sent_message(session=session, conversation_id=conversation.id or 0)
        return (
            isinstance(runner.agent, Receipts)
            and cut is not None
            and "prompt_uuid" in cut.data
            and not store.answered_after(
                session=session, conversation_id=conversation.id or 0, seq=cut.seq
            )
        )

    def _on_turn_done(
        self, session: Session, runner: Runner, conversation: Conversation, event: TurnDone
    ) -> None:
        if event.error and event.error not in runner.lines_shown:  # an API error shows once
            self._line(session, conversation, event.error, level="error")
        if event.interrupted and self._closing and self._unanswered(session, runner, conversation):
            runner.cut_by_shutdown = True  # its line once the agent stopped (Recovery)
        elif event.interrupted and not runner.stopped_untrusted:  # (else the watch's line)
            text = SHUTDOWN_LINE if self._closing else "Interrupted by the user."
            self._line(session, conversation, text, data={"type": "interrupted"})
        last = runner.last_agent_entry
        if last is not None and (event.cost_usd is not None or event.duration_ms is not None):
            result = {"cost_usd": event.cost_usd, "duration_ms": event.duration_ms}
            self._save(session, conversation, last, data={**last.data, "result": result})
