"""Delivery: one turn at a time per conversation, from the queue to the agent and back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from sqlmodel import Session

from app import attachment_store, store
from app.agents.base import (
    Agent,
    AgentEvent,
    OwnTurns,
    PermissionDecision,
    PermissionRequest,
    Receipts,
    SeesImages,
    TurnDone,
)
from app.attachments import Image
from app.cluster.leases import LeaseLost
from app.db import WRITE_PATIENCE, write_lock_free
from app.edits import edit_change, written_path
from app.handoff import HANDOFF_REQUEST, context_note, first_message, is_handoff_command, with_note
from app.models import Conversation, Entry
from app.overwrite import existing_text
from app.questions import EXPIRED_ENDED, EXPIRED_SHUTDOWN, EXPIRED_STOPPED, QUESTION_TOOL, asked
from app.supervisor.base import SupervisorState
from app.supervisor.pool import ARCHIVED_WORK_LINE, STOPPED_BY_USER
from app.supervisor.runner import (
    ANNOUNCE_WAIT,
    Locked,
    NotBegun,
    Runner,
    TurnState,
    _settle,
    failure_reason,
)
from app.supervisor.timeline import rolled_back
from app.trust import UntrustedSettings

log = logging.getLogger(__name__)

BURST_AHEAD = 256  # agent events a cluster node reads ahead of those being stored
OUTAGE_PATIENCE = 120.0  # seconds a cluster node's turn waits for Redis or the database
OUTAGE_RETRY = 0.25  # first wait before its burst is tried again (doubling)
OUTAGE_RETRY_MAX = 2.0


RETRY_SECONDS = 1.0  # first wait before a runner retries a database that failed
RETRY_MAX_SECONDS = 30.0


IMAGES_GONE = "{} image(s) of this message no longer exist; it was sent without them."


class Turns(SupervisorState):
    """The delivery of queued messages, one turn at a time (mixed into Supervisor)."""

    def _wake(self, conversation_id: int) -> None:
        if conversation_id in self.deleting:
            return  # nothing of it is delivered any more (a failed delete wakes it itself)
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            self.cluster.wake(conversation_id)  # taken here, or its owner is woken
            return
        runner = self.runner(conversation_id)
        if runner.task and not runner.task.done():
            runner.again = True  # its last look may predate this message: it looks again
        if not self._closing and runner.state == TurnState.IDLE:
            runner.state = TurnState.RUNNING  # from now until the queue is empty
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
        runner.state = TurnState.RUNNING  # from now until the queue is empty
        runner.task = asyncio.create_task(self._deliver(runner), name=f"deliver-{conversation_id}")

    async def _deliver(self, runner: Runner) -> None:
        """Deliver queued messages one turn at a time until none is left."""
        while True:
            runner.again = False
            try:
                await self._deliver_queue(runner)
            finally:
                if not runner.again:  # else a message came meanwhile: it stays running
                    runner.state = TurnState.IDLE
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
            runner.state = TurnState.RUNNING

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
                    await self._stop_with_work(runner, ARCHIVED_WORK_LINE)
                    return
                own, runner.own_turn = runner.own_turn, False
                agent = runner.agent
                if not (own and isinstance(agent, OwnTurns) and agent.own_turn_waiting()):
                    return
                runner.idle_shown = False
            try:
                if prompt is None:
                    await self._run_own_turn(runner)
                else:
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

    def _next_turn(
        self,
        runner: Runner,
        given: Session | None = None,
        read: Conversation | None = None,
    ) -> str | None:
        """Finish what a failed turn left, then begin the next queued message (None: none).

        given: the job's own session (one session per job); read: the conversation as this job
        just read it, locked (no other writer can change it before this job ends).
        """
        if runner.ending:
            self._end_turn(runner, given)
            runner.ending = False
        if runner.failure is not None:
            text, data = runner.failure
            self._write_line(runner, text, data=data)
            runner.failure = None
        with contextlib.nullcontext(given) if given is not None else self.session() as session:
            conversation = read
            if conversation is None:
                # Locked: a /compact on another node moves the queue before or after, never
                # during.
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
            return self._begin_turn(session, runner, conversation, queued[0], len(queued) - 1)

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
            connection = session.connection()  # its images go with it (and those unsent)
            attachment_store.move(connection, archived.id or 0, successor.id or 0, [entry_id or 0])
            self._save(session, successor, entry, move=True, conversation_id=successor.id or 0)
            self.hub.emit(archived.id or 0, {"type": "entry_removed", "entry_id": entry_id})
        self._wake(successor.id or 0)

    def _begin_turn(
        self,
        session: Session,
        runner: Runner,
        conversation: Conversation,
        entry: Entry,
        waiting: int | None = None,
    ) -> str:
        """Mark a message delivered (at the end of the timeline) and build the agent's prompt.

        waiting: how many other messages stay queued, as this transaction read them.
        """
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
        # The prompt's id is stored before it goes out: after a crash the agent's own record
        # tells whether it arrived (Receipts). The row's changes: in the same UPDATE.
        runner.prompt_id = data["prompt_uuid"] = str(uuid.uuid4())
        # Their bytes are read as the turn starts, in a reader thread (not in this job).
        runner.image_ids = [image["id"] for image in data.get("attachments", ())]
        self._save(session, conversation, entry, move=True, row=changes, state="sent", data=data)
        if "pending_summary" in changes:
            self.publish_conversation(conversation)
        _turn_begins(runner)
        self.publish_turn(conversation.id or 0, session, queued=waiting)
        self.publish_conversation(conversation)  # on its stream too: a snapshot's replay has it
        runner.turn_conversation = conversation
        return prompt

    def _context_note(self, conversation: Conversation) -> str | None:
        """The context watch's paragraph for this conversation's size, if any."""
        soft, hard = self.settings.context_soft, self.settings.context_hard
        return context_note(conversation.context_tokens, soft, hard)

    async def _run_turn(self, runner: Runner, prompt: str) -> None:
        if self._closing:  # begun as the relay stops: no agent starts for it
            runner.turn_conversation = None
            await self.storage.write(self._stop_before_delivery, runner)
            return
        try:
            await self._apply_window(runner)
            if runner.turn_conversation is not None:  # changed since the agent started?
                mode = runner.turn_conversation.permission_mode
                await self._apply_mode(runner, mode, turn_begins=True)
                # (a change another node passed on may have been lost: read with the turn)
                await self._model_for_turn(runner, runner.turn_conversation.chosen_model)
            agent = await self._ensure_agent(runner)
        except Exception as error:  # noqa: BLE001 - shown to the user, the queue goes on
            log.warning("agent of conversation %s did not start: %s", runner.conversation_id, error)
            # New project files: the line's button trusts them and sends the message again.
            trust = {"trust": error.files} if isinstance(error, UntrustedSettings) else None
            await self._error_line_soon(
                runner, f"The agent could not start: {failure_reason(error)}", trust
            )
            if runner.carried_summary is not None:  # the next message carries it instead
                await self._patiently(self._summary_not_sent, runner)
            return
        finally:
            runner.turn_conversation = None
        ids, runner.image_ids = runner.image_ids, []
        images = await self._read_images(runner, ids) if ids else []
        if runner.stop_requested or self._closing:  # Stop, or shutdown, came while it started
            await self.storage.write(self._stop_before_delivery, runner)
            return
        if images and isinstance(agent, SeesImages):
            turn = agent.turn_with_images(prompt, images, prompt_id=runner.prompt_id)
        elif isinstance(agent, Receipts) and runner.prompt_id:
            turn = agent.turn(prompt, prompt_id=runner.prompt_id)
        else:
            turn = agent.turn(prompt)
        await self._stream_turn(runner, agent, turn)

    async def _read_images(self, runner: Runner, ids: list[int]) -> list[Image]:
        """A message's images (up to 5 × 3.75 MiB), read off the writer thread; those gone
        meanwhile are left out, with a line that says so."""
        images = await self.storage.read(self._images, ids)
        if len(images) < len(ids):
            text = IMAGES_GONE.format(len(ids) - len(images))
            await self._patiently(self._write_line, runner, text, "warning")
        return images

    def _images(self, ids: list[int]) -> list[Image]:
        with self.session() as session:
            return attachment_store.images(session=session, ids=ids)

    def _own_turn_began(self, runner: Runner) -> None:
        """Its agent began a turn by itself (OwnTurns: a background task ended...): it runs
        as a turn of the relay's, shown as it comes, once no message is queued before it. A
        message delivered first takes its events into its own turn (the agent's turn())."""
        if self._closing or self.runners.get(runner.conversation_id) is not runner:
            return
        if runner.archived:  # nothing acts for an archived conversation: the agent stops
            self._retire_now(runner.conversation_id)
            return
        runner.own_turn = True
        self._wake(runner.conversation_id)

    async def _run_own_turn(self, runner: Runner) -> None:
        agent = runner.agent
        assert isinstance(agent, OwnTurns)
        if not await self._patiently(self._begin_own_turn, runner):
            return
        await self._stream_turn(runner, agent, agent.own_turn())

    def _begin_own_turn(self, runner: Runner) -> bool:
        """Tell the tabs a turn runs that no message began; False when it cannot run here."""
        with self.session() as session:
            conversation = store.lock_conversation(
                session=session, conversation_id=runner.conversation_id
            )
            if conversation is None or conversation.status != "active":
                return False
            if self.cluster is not None and not self.cluster.still_owner(session, runner):
                return False
            _turn_begins(runner)
            # It goes on from the last message's turn: a Stop sent for that turn (from
            # another node, which knows no other) stops it.
            last = store.last_sent_message(session=session, conversation_id=runner.conversation_id)
            prompt_id = last.data.get("prompt_uuid") if last is not None else None
            runner.prompt_id = prompt_id if isinstance(prompt_id, str) else None
            # Active while it runs: after a crash, a restart says it was cut (Recovery).
            store.update_conversation(session=session, conversation=conversation, turn_active=True)
            self.publish_turn(runner.conversation_id, session)
            self.publish_conversation(conversation)
            return True

    async def _stream_turn(
        self, runner: Runner, agent: Agent, turn: AsyncIterator[AgentEvent]
    ) -> None:
        """Store and publish a turn's events as they come, until its TurnDone."""
        try:
            # The events that arrived while the last burst was being stored are stored together,
            # in one storage job: one read of the conversation, one fsync.
            # A cluster node's events go on through Redis after the burst's job: the agent is
            # read no further ahead than BURST_AHEAD events, so none waits behind a backlog.
            ahead = BURST_AHEAD if self.cluster is not None else 0
            # More text of a stored message, arriving while nothing is being stored, is
            # published by the task reading the agent: no queue, no hop to this one.
            inline = None if self.cluster is not None else partial(self._stream_now, runner)
            # Closed here, at once (its reader closes the agent's turn): see bursts.
            async with contextlib.aclosing(bursts(turn, ahead, inline)) as stream:
                async for burst in stream:
                    try:
                        # On a cluster node every burst goes to the writer: a number is a
                        # Redis round trip there, never taken on the loop.
                        cluster = self.cluster is not None
                        if cluster or any(self._stores(runner, event) for event in burst):
                            if any(isinstance(event, TurnDone) for event in burst):
                                runner.again = False  # the job looks at the queue (_finish_turn)
                            await self._store_burst(runner, burst)
                        else:  # text of messages already stored: published from here
                            for event in burst:
                                self._handle(runner, event)
                    except LeaseLost:  # this node stalled: the new owner closes the turn
                        runner.ended = True
                        return
                    except Exception as error:  # noqa: BLE001 - the database failed
                        await self._unrecorded(runner, error)  # (the turn not recorded)
                        return
                    if any(isinstance(event, TurnDone) for event in burst):
                        break
            await self._close_if_gone(runner)  # crashed in its turn: asleep now
            if runner.agent is None:
                return
            if runner.reported_agent is not agent:
                # The window is fixed for a process's life: check it once per process. (Fresh
                # categories are fetched when someone opens the 🧠 modal: refresh_context.)
                runner.reported_agent = agent
                runner.reporting = asyncio.create_task(self._report_context(runner, agent))
        except Unhandled as failed:  # the database failed an event handled inline
            await self._unrecorded(runner, failed.error)
        except Exception as error:  # noqa: BLE001 - the agent crashed; the next message restarts it
            log.warning("agent of conversation %s failed: %s", runner.conversation_id, error)
            await self._error_line_soon(
                runner, f"The agent stopped unexpectedly: {failure_reason(error)}"
            )
            await self._close_agent(runner)

    async def _store_burst(self, runner: Runner, burst: list[AgentEvent]) -> None:
        """Store a burst of the agent's events; through a short outage, wait and try again.

        A cluster node's job that could not reach Redis or the database before it changed
        anything (NotBegun) is tried again as it is, once Redis answers, for up to
        OUTAGE_PATIENCE; the agent is read no further ahead meanwhile (BURST_AHEAD), its
        output waits in its pipe. Past that, the turn fails as on any database error.
        """
        deadline = time.monotonic() + OUTAGE_PATIENCE
        delay = OUTAGE_RETRY
        while True:
            try:
                await self._patiently(self._handle_all, runner, burst)
                return
            except NotBegun as failed:
                if self._closing or time.monotonic() + delay > deadline:
                    raise failed.error from None
                log.warning(
                    "conversation %s: the turn's events wait (%s); trying again in %.1f s",
                    runner.conversation_id,
                    failed.error,
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, OUTAGE_RETRY_MAX)
            # A job waiting on a Redis that answers nothing holds the writer: ask first.
            while self.cluster is not None and not await self.cluster.reachable():
                if self._closing or time.monotonic() + delay > deadline:
                    break  # the job's own error ends it
                await asyncio.sleep(delay)

    async def _unrecorded(self, runner: Runner, error: Exception) -> None:
        """The database failed an agent event: the turn is stopped, the user told why."""
        log.error(
            "conversation %s: could not store an agent event",
            runner.conversation_id,
            exc_info=error,
        )
        await self._error_line_soon(
            runner,
            f"The relay could not store this turn ({failure_reason(error)}); the turn was stopped.",
        )
        await self._close_agent(runner)

    def _end_turn(self, runner: Runner, given: Session | None = None) -> None:
        """Close the turn: what it left open is kept or expired, the row says it ended.

        given: the job's own session (the last burst's: its conversation is read already).
        """
        runner.state = TurnState.RUNNING  # _deliver sets idle once the queue is empty
        runner.stop_requested = False  # a Stop after this point is for the next turn
        runner.stopped_untrusted = False
        runner.prompt_id = None  # (a Stop for this turn that comes late stops no other)
        runner.image_ids = []
        runner.carried_summary = None
        runner.last_used = time.monotonic()
        # A background subagent's question (lasting) stays open: its agent may go on.
        runner.lasting &= runner.questions.keys()
        for entry_id, future in list(runner.questions.items()):
            if entry_id not in runner.lasting:
                self.storage.soon(_settle, future, PermissionDecision(False, "The turn ended."))
        with contextlib.nullcontext(given) if given is not None else self.session() as session:
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
            why = EXPIRED_SHUTDOWN if self._closing else EXPIRED_ENDED
            self._expire_pending(session, conversation, why, keep=runner.lasting)
            for entry_id in [i for i in runner.questions if i not in runner.lasting]:
                runner.questions.pop(entry_id, None)
            if runner.compaction is not None:
                self._remove(session, conversation, runner.compaction)
                runner.compaction = None
            runner.compaction_began = None
            for entry in runner.tools.values():  # calls whose result never came (agent crashed)
                self._save(session, conversation, entry, state="interrupted", data=entry.data)
            runner.tools.clear()
            self.storage.soon(runner.calls.clear)
            self.storage.soon(runner.handoff_calls.clear)
            # Cut by the shutdown before an answer: still active, for the next start (Recovery).
            store.update_conversation(
                session=session, conversation=conversation, turn_active=runner.cut_by_shutdown
            )
        # Every tab's sidebar: not running any more, and when it was last active.
        self.publish_conversation(conversation)  # on its stream too: a snapshot's replay has it

    def _finish_turn(
        self, runner: Runner, session: Session, conversation: Conversation | None
    ) -> None:
        """End the turn and look at the queue, in the job (and session) that stored its last
        event: one session for the burst, the end and the look.

        conversation: as this job read it. Without a cluster no other writer can change it
        before the job ends (one writer thread): the look needs no second read.
        """
        try:
            self._end_turn(runner, session)
        except Exception:  # retried by _next_turn once the database works
            log.exception("conversation %s: could not close the turn", runner.conversation_id)
            rolled_back(session)
            runner.ending = True
        runner.ended = True
        if self._closing:  # no new turn begins once the relay is stopping
            return
        try:
            read = conversation if self.cluster is None and not runner.ending else None
            runner.upcoming = self._next_turn(runner, session, read)
        except Exception:  # the runner's loop looks again, and retries
            log.exception("conversation %s: could not look at the queue", runner.conversation_id)
            rolled_back(session)
            return
        runner.looked = True
        if runner.upcoming is None and not runner.archived:
            runner.state = TurnState.IDLE  # as _deliver sets it: said now, in this burst
            if self.cluster is None:  # _next_turn just found the queue empty, in this job
                idle = {"state": "idle", "queued": 0}
                self.hub.emit(runner.conversation_id, {"type": "turn", "turn": idle})
            else:
                self.publish_turn(runner.conversation_id, session)
            runner.idle_shown = True

    def _summary_not_sent(self, runner: Runner) -> None:
        """A turn whose agent never started: the /compact or /clear carry-over its message took
        waits for the next message (the "will be sent" bar shows again)."""
        with self.session() as session:
            conversation = self._load(session, runner.conversation_id)
            sent = store.last_sent_message(session=session, conversation_id=runner.conversation_id)
            if sent is not None and "summary" in sent.data:
                data = self._summary_back(session, conversation, sent.data)
                self._save(session, conversation, sent, data=data)
        runner.carried_summary = None

    def _stop_before_delivery(self, runner: Runner) -> None:
        """End a turn stopped before its prompt was sent; a carried summary waits for the next.
        Stopped by the relay's shutdown, its message is queued again, first (Recovery)."""
        with self.session() as session:
            conversation = self._load(session, runner.conversation_id)
            cut = store.last_sent_message(session=session, conversation_id=runner.conversation_id)
            if self._closing and cut is not None:
                self._redeliver(session, conversation, cut)  # the summary back with it
                return
            restore = runner.carried_summary is not None and conversation.pending_summary is None
            if restore:  # saved with the line below, in one transaction
                conversation.pending_summary = runner.carried_summary
                session.add(conversation)
            self._on_turn_done(session, runner, conversation, TurnDone(interrupted=True))
            if restore:
                self.publish_conversation(conversation)

    async def _ask(
        self, runner: Runner, request: PermissionRequest, cwd: str = ""
    ) -> PermissionDecision:
        """Put a permission question in the timeline and wait for the first answer.

        cwd: the agent's working directory: a whole-file write over a file in it shows what it
        replaces, read now (the tool waits for the answer) in a worker thread, not the writer's.

        A question about an announced call waits (ANNOUNCE_WAIT at most) for that call's row:
        the agent's events before the call may still be queued behind a storage job while
        its question comes on its own, and stored first it would stand above the text that
        led to it.
        """
        if request.announced and request.tool_id:
            try:
                async with asyncio.timeout(ANNOUNCE_WAIT):
                    await runner.until_call_stored(request.tool_id)
            except TimeoutError:
                log.warning(
                    "conversation %s: asked about tool call %s before announcing it",
                    runner.conversation_id,
                    request.tool_id,
                )
        written = written_path(request.tool_name, request.tool_input)
        existing = (False, None)
        if written and cwd:
            existing = await asyncio.to_thread(existing_text, written, cwd)
        future: asyncio.Future[PermissionDecision] = asyncio.get_running_loop().create_future()
        await self._patiently(self._question, runner, request, future, existing)
        return await future

    def _question(
        self,
        runner: Runner,
        request: PermissionRequest,
        future: asyncio.Future[PermissionDecision],
        existing: tuple[bool, str | None] = (False, None),
    ) -> None:
        text = f"{request.tool_name} wants permission"
        if request.tool_name == QUESTION_TOOL:  # the agent asks the user (a form of answers)
            text = "The agent asks: " + " · ".join(asked(request.tool_input))
        with self.session() as session:
            conversation = self._load(session, runner.conversation_id)
            change = edit_change(request.tool_name, request.tool_input, existing)
            edit = {"edit": change} if change else {}
            entry = self._add(
                session,
                conversation,
                "activity",
                store.storable(text[:2000]),
                state="pending",
                data={
                    "type": "permission",
                    "tool": request.tool_name,
                    "input": request.tool_input,
                    "tool_id": request.tool_id,
                    **edit,  # what an edit or write would change, shown as a diff
                },
            )
            entry_id = entry.id or 0
            runner.questions[entry_id] = future  # before any answer can come (tabs see it after)
            if request.lasting:
                runner.lasting.add(entry_id)
            # A Stop that came once the question was stored (a tab or a GET may see it before
            # the line above) found no question to deny: this one is denied and expired here,
            # or the agent would wait for an answer nobody can give. (Held first, then looked
            # at: a Stop after the line above finds the question itself.)
            if runner.stop_requested and runner.questions.pop(entry_id, None) is not None:
                runner.lasting.discard(entry_id)
                self._expire_if_pending(session, conversation, entry_id, EXPIRED_STOPPED)
                self.storage.soon(_settle, future, PermissionDecision(False, STOPPED_BY_USER))


def _turn_begins(runner: Runner) -> None:
    """Reset what a runner keeps of one turn (a new one begins)."""
    runner.state = TurnState.RUNNING
    runner.last_agent_entry = None
    runner.lines_shown.clear()
    runner.retry_line = None


class Unhandled(Exception):
    """An error of bursts' inline handler (not of the agent), raised by bursts in its place."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def bursts(
    events: AsyncIterator[AgentEvent],
    limit: int = 0,
    inline: Callable[[AgentEvent], bool] | None = None,
) -> AsyncIterator[list[AgentEvent]]:
    """The agent's events in bursts: each time, every event that arrived since the last burst.

    A reader task drains the agent while the consumer stores the previous burst (up to limit
    events ahead of it, when given); an error of the agent is raised after the events that
    came before it.

    inline: offered each event that arrives while the consumer waits with nothing queued (so
    every earlier event is handled); it handles the event itself and returns True, or returns
    False to have it queued as usual. An event it handles costs no queue, no future and no
    step of the consumer's task. An error it raises is raised here as Unhandled, in order.
    """
    queue: asyncio.Queue[AgentEvent | BaseException | None] = asyncio.Queue()
    room = asyncio.Event()  # set: the consumer took what was queued
    room.set()
    waiting = False  # the consumer waits on an empty queue: nothing is being handled

    async def read() -> None:
        nonlocal waiting
        try:
            async for event in events:
                if waiting and inline is not None:
                    try:
                        if inline(event):
                            continue
                    except Exception as error:  # noqa: BLE001 - raised by the consumer, in order
                        queue.put_nowait(Unhandled(error))
                        return
                queue.put_nowait(event)
                waiting = False  # (the consumer is woken: this event is not handled yet)
                if limit and queue.qsize() >= limit:
                    room.clear()
                    await room.wait()
                if isinstance(event, TurnDone):
                    break
        except Exception as error:  # noqa: BLE001 - handed to the consumer, in order
            queue.put_nowait(error)
        finally:
            # The turn closed now, its own clean-up run: left to the garbage collector, it ran
            # a few loop steps later, in the next turn (a queued message's), and reset the
            # adapter's flags under it: a Stop then found no turn to stop.
            close = getattr(events, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
            queue.put_nowait(None)

    reader = asyncio.create_task(read(), name="agent-events")
    try:
        while True:
            waiting = True
            try:
                items = [await queue.get()]
            finally:
                waiting = False
            while not queue.empty():
                items.append(queue.get_nowait())
            room.set()
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
