"""What the routes (and the relay's tools) ask: create, send, compact, resend, archive..."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlmodel import Session

from app import steer, store
from app.agents.base import PermissionDecision, WarmsUp
from app.attachment_store import AttachmentError, describe, release
from app.backups import PRECOMPACT_MANUAL
from app.handoff import HandoffText, parse_handoff, saved_text
from app.models import Conversation, Entry, Handoff
from app.providers import images_refused
from app.questions import EXPIRED_STOPPED, checked_answers, checked_mode, decision_of
from app.supervisor.base import SupervisorState
from app.supervisor.pool import ARCHIVED_WORK_LINE, NoRoom
from app.supervisor.runner import (
    ANNOUNCE_WAIT,
    DELETING,
    READ_ONLY,
    STILL_STOPPING,
    ConversationError,
    Runner,
    TurnState,
    _settle,
)
from app.titles import compacted_from, compacted_title
from app.tools import ToolResult
from app.views import conversation_view

log = logging.getLogger(__name__)

DEFAULT_TITLE = "New conversation"  # a conversation's title until its first message names it
STOPPED_QUESTION = "This question is no longer asked: the turn was stopped or has ended."
WITHDRAWN_TOO_LATE = "This message has already gone to the agent; it can no longer be taken back."
RETIRE_WAIT = 15.0  # seconds a delete waits for an agent being stopped (close is given 10 s)


class Commands(SupervisorState):
    """The commands routes call (mixed into Supervisor)."""

    def create_conversation(
        self,
        *,
        title: str,
        provider: str,
        cwd: Path,
        permission_mode: str,
        trusted_settings: list[str] | None = None,
    ) -> Conversation:
        """Create a conversation and announce it."""
        with self.session() as session:
            conversation = store.create_conversation(
                session=session,
                title=title,
                provider=provider,
                cwd=str(cwd),
                permission_mode=permission_mode,
                trusted_settings=trusted_settings,
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

    def submit(
        self, conversation: Conversation, text: str, attachments: Sequence[int] = ()
    ) -> Entry:
        """Store a user message (queued), then hand it to the conversation's runner."""
        if conversation.status != "active":
            raise ConversationError(READ_ONLY)
        if self.cluster is not None:  # this node runs it if nobody does
            self.cluster.claim_here(conversation.id or 0, conversation.cwd)
        with self.session() as session:
            session.add(conversation)
            self._still_active(session, conversation)
            return self._queue_message(session, conversation, text, attachments)

    def send(
        self,
        conversation_id: int,
        text: str,
        title: str | None = None,
        attachments: Sequence[int] = (),
    ) -> Entry:
        """Store a user message by the conversation's id: the route's read, the title and the
        message in one writer job (LookupError: no such conversation).

        title: the conversation's title if this is its first message (it has no other yet).
        attachments: images uploaded to the conversation, sent with the text (AttachmentError).
        """
        if self.cluster is not None:  # its lease is claimed before the message is stored
            with self.session() as session:
                conversation = store.get_conversation(
                    session=session, conversation_id=conversation_id
                )
                if conversation is not None:  # checked before the title changes
                    self._images_of(session, conversation, attachments)
            if conversation is None:
                raise LookupError(f"No conversation {conversation_id}.")
            if title is not None and conversation.status == "active" and _untitled(conversation):
                self.update_conversation(conversation, title=title)
            return self.submit(conversation, text, attachments)
        with self.session() as session:
            # Read in the writer's turn, after every earlier job (a /compact among them).
            found = store.lock_conversation(session=session, conversation_id=conversation_id)
            if found is None:
                raise LookupError(f"No conversation {conversation_id}.")
            if found.status != "active":
                raise ConversationError(READ_ONLY)
            data = self._images_of(session, found, attachments)  # before the title changes
            if title is not None and _untitled(found):
                store.update_conversation(session=session, conversation=found, title=title)
                self.publish_conversation(found)
            return self._queue_message(session, found, text, attachments, data)

    def _queue_message(
        self,
        session: Session,
        conversation: Conversation,
        text: str,
        attachments: Sequence[int] = (),
        data: dict[str, Any] | None = None,
    ) -> Entry:
        """Store a user message (queued) in the job's session; its turn begins here if idle.

        data: what _images_of said of its attachments already in this job (else asked here).
        """
        cid = conversation.id or 0
        if cid in self.deleting:  # (its delete's later jobs come after this one's in the writer)
            raise ConversationError(DELETING)
        if data is None:
            data = self._images_of(session, conversation, attachments)
        entry = self._add(
            session, conversation, "user", text, state="queued", data=data, claim=attachments
        )
        if attachments:  # no longer waiting in the composers
            self.publish_attachments(session, cid)
        self._wake(cid)
        runner = self.runners.get(cid)
        idle = runner is not None and (runner.task is None or runner.task.done())
        if not (self.cluster is None and idle and runner is not None and not runner.looked):
            self._announce_queued(session, conversation)
            return entry
        # Its turn begins in this job and session (a job less on the turn's path); the runner
        # task that _wake starts takes the prompt. Stored already: a failure here is retried.
        session.expunge(entry)  # the answer shows it as stored (queued), not as then sent
        try:
            runner.upcoming = (
                None if self._closing else self._next_turn(runner, session, conversation)
            )
            runner.looked = True
        except Exception:
            log.exception("conversation %s: could not begin the turn", cid)
            runner.upcoming = None
            try:  # the message is stored: answered all the same, the tabs told if they can be
                session.rollback()
                self._announce_queued(session, conversation)
            except Exception:
                log.exception("conversation %s: could not publish the turn", cid)
            return entry
        if runner.upcoming is None:  # else _begin_turn told the tabs (queued 0), once
            self._announce_queued(session, conversation)
        return entry

    def _images_of(
        self, session: Session, conversation: Conversation, attachments: Sequence[int]
    ) -> dict[str, Any] | None:
        """A message's data for its images (None without any); AttachmentError when they
        cannot go with it (its agent takes none; one is gone, another's, or named twice)."""
        if not attachments:
            return None
        if (refused := images_refused(conversation.provider)) is not None:
            raise AttachmentError(refused)
        cid = conversation.id or 0
        return {"attachments": describe(session=session, conversation_id=cid, ids=attachments)}

    def _announce_queued(self, session: Session, conversation: Conversation) -> None:
        """Tell the tabs the turn state (with the queue's length) and the sidebar's row."""
        self.publish_turn(conversation.id or 0, session)
        self.hub.broadcast(
            {"type": "conversation", "conversation": conversation_view(conversation)}
        )

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
                raise ConversationError(steer.STALE)
            upto = conversation.last_seq  # the backup's timeline: as the compaction found it
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
            if carry is None:  # once compacted (committed): a refused /compact writes none
                self._backup_before(conversation, PRECOMPACT_MANUAL, upto_seq=upto)
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
        store.refresh_locked(session=session, conversation=conversation)
        if conversation.status != "active":
            raise ConversationError(READ_ONLY)

    @contextlib.contextmanager
    def _changing(self, conversation: Conversation) -> Iterator[Session]:
        """A session for a change to an active conversation that is not being deleted (else
        ConversationError), checked again in the writer's turn (_still_active)."""
        if conversation.status != "active":
            raise ConversationError(READ_ONLY)
        if conversation.id in self.deleting:
            raise ConversationError(DELETING)
        with self.session() as session:
            session.add(conversation)
            self._still_active(session, conversation)
            yield session

    def resend(self, conversation: Conversation, entry_id: int) -> Entry:
        """Queue a cut turn's message again as a new message; the cut one remembers it."""
        with self._changing(conversation) as session:
            entry = _user_message(session, conversation, entry_id)
            if "cut" not in entry.data:
                raise ConversationError(
                    "Only a message whose turn a relay restart cut can be resent."
                )
            line_id = entry.data.get("cut_line")
            line = store.get_entry(session=session, entry_id=line_id) if line_id else None
            new = self._send_again(session, conversation, entry, line)
        self.hub.broadcast(
            {"type": "conversation", "conversation": conversation_view(conversation)}
        )
        return new

    def trust_and_resend(self, conversation: Conversation, line_id: int) -> Entry | None:
        """Trust the project files a refused agent start's line names, and send the message
        whose start it refused again (the agent never had it); the new message, if any."""
        with self._changing(conversation) as session:
            line = store.get_entry(session=session, entry_id=line_id)
            if line is None or line.conversation_id != conversation.id or "trust" not in line.data:
                raise LookupError("No such line in this conversation.")
            if line.data.get("resent"):
                raise ConversationError("These settings were trusted already.")
            trusted = list(conversation.trusted_settings or [])
            trusted += [name for name in line.data["trust"] if name not in trusted]
            store.trust_settings(
                session=session, conversation_id=line.conversation_id, files=trusted
            )
            again = line.data.get("again", True)  # False: a live agent stopped, its turn over
            entry = store.last_sent_message(
                session=session, conversation_id=line.conversation_id, before=line.seq
            )
            if not again or entry is None or entry.data.get("resent"):  # trusted, nothing sent
                line.data = {**line.data, "resent": True}
                self._save(session, conversation, line)
                return None
            new = self._send_again(session, conversation, entry, line)
        self.hub.broadcast(
            {"type": "conversation", "conversation": conversation_view(conversation)}
        )
        return new

    def _send_again(
        self, session: Session, conversation: Conversation, entry: Entry, line: Entry | None
    ) -> Entry:
        """Queue a message again as a new one; it and the line that offered it remember it."""
        if entry.data.get("resent"):
            raise ConversationError("This message was already resent.")
        # Marked in the transaction that stores the new message: resent once, never lost.
        # A carry-over it went out with goes again, with it (unknown whether it arrived).
        entry.data = {**self._summary_back(session, conversation, entry.data), "resent": True}
        session.add(entry)
        if line is not None:
            line.data = {**line.data, "resent": True}
            session.add(line)
        data: dict[str, Any] = {"resent_from": entry.id}
        if "attachments" in entry.data:  # sent again with it (the rows stay the first's)
            data["attachments"] = entry.data["attachments"]
        claim = [image["id"] for image in data.get("attachments", ())]
        if claim:  # the new message claims them, in its transaction (Edit gives them back)
            release(session.connection(), entry.id or 0)
        new = self._add(
            session, conversation, "user", entry.text, state="queued", data=data, claim=claim
        )
        self._save(session, conversation, entry)
        if line is not None:
            self._save(session, conversation, line)
        self._wake(conversation.id or 0)
        self.publish_turn(conversation.id or 0, session)
        return new

    def withdraw(self, conversation: Conversation, entry_id: int) -> Entry:
        """Take a queued message out of the queue (Edit): removed, its text given back.

        The conversation's row is locked first, as delivery locks it before it reads the queue:
        a message is either withdrawn or delivered, never both (on another node too).
        """
        if conversation.id in self.deleting:
            raise ConversationError(DELETING)
        with self.session() as session:
            session.add(conversation)
            self._still_active(session, conversation)
            entry = _user_message(session, conversation, entry_id)
            if entry.state != "queued":
                raise ConversationError(WITHDRAWN_TOO_LATE)
            released = bool(entry.data.get("attachments"))
            if released:  # back in the composer with its text
                release(session.connection(), entry_id)
            self._remove(session, conversation, entry)
            if released:
                self.publish_attachments(session, conversation.id or 0)
            self._announce_queued(session, conversation)
        return entry

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
            self._stop_with_work(runner, ARCHIVED_WORK_LINE), name=f"retire-{conversation_id}"
        )

    def _refuse_while_busy(
        self, conversation: Conversation, action: str, session: Session | None = None
    ) -> None:
        """409 while a turn runs or messages wait (they would be lost or half-done)."""
        if session is None:
            with self.session() as own:
                return self._refuse_while_busy(conversation, action, own)
        cid = conversation.id or 0
        runner = self.runners.get(cid)
        queued = store.count_queued(session=session, conversation_id=cid)
        running = runner is not None and (
            runner.state != TurnState.IDLE or (runner.task is not None and not runner.task.done())
        )
        if running and not (queued or conversation.turn_active) and _retiring(runner):
            raise ConversationError(STILL_STOPPING)  # no turn: nothing the user could stop
        if running or queued or conversation.turn_active:
            raise ConversationError(
                f"A turn is running in this conversation; stop it before you {action} it."
            )

    def archive(self, conversation: Conversation) -> Conversation:
        """Archive a conversation without compacting it (read-only from now on)."""
        with self.session() as session:
            session.add(conversation)
            # Locked and read again: a turn that another node begins meanwhile waits for this,
            # or this sees it (the route's copy may be older than that turn).
            store.refresh_locked(session=session, conversation=conversation)
            if conversation.status != "active":
                raise ConversationError("This conversation is already archived.")
            self._refuse_while_busy(conversation, "archive", session)
            store.update_conversation(session=session, conversation=conversation, status="archived")
        self.publish_conversation(conversation)
        cid = conversation.id or 0
        runner = self.runners.get(cid)
        if runner is not None:
            runner.archived = True  # released by the reaper
            # Its agent stops now, with any background work: nothing may act for an archived
            # conversation (a task's end would have the agent run a turn of its own, unshown).
            self.storage.soon(self._retire_now, cid)
        if self.cluster is not None and not self.cluster.holds(cid):
            self.cluster.send("retire", cid)  # its owner's agent stops as well
        return conversation

    async def delete(self, conversation: Conversation) -> None:
        """Delete a conversation: entries (search index too), backups, runner; tell every tab.

        Conversations it was compacted from or into stay, without the link to it.
        """
        cid = conversation.id or 0
        await self._retired(cid)
        # Checked and marked in one writer job: from there no message is stored for it (a
        # send job checks in the writer too, in order), no agent warms up, no queue wakes;
        # before it, and for a delete refused as busy, messages are stored as usual.
        marking = self.storage.submit(self._begin_delete, conversation)
        try:
            await asyncio.shield(marking)
        except asyncio.CancelledError:  # the job runs all the same: its mark is undone after it
            marking.add_done_callback(lambda done: self._unmark(done, cid))
            raise
        runner: Runner | None = None
        try:
            runner = self.runners.pop(cid, None)
            if runner is not None:
                await self._warmed(runner)  # a tab's warm-up's agent: closed below once started
                await self._close_agent(runner, publish=False)  # hub.forget drops its stream
            changed = await self.storage.write(self._delete_rows, conversation)
        except BaseException:
            self.deleting.discard(cid)
            if runner is not None:  # a message another node stored meanwhile: delivered
                self._wake(cid)
            raise
        if self.cluster is not None and not self.cluster.holds(cid):
            self.cluster.send("deleted", cid)  # its owner may still have its agent
        await self.backups.forget(cid)
        self.hub.release(cid)
        self.hub.forget(cid)
        self.hub.broadcast({"type": "conversation_removed", "conversation_id": cid})
        for other in changed:
            if other is None:
                continue
            if not self.hub.knows(other.id or 0):  # released since the rows' job primed it
                await self.storage.read(self.hub.prime, other.id or 0)  # (not on the loop)
            # One deleted meanwhile, here, is not told of again: tabs would list it anew.
            if other.id not in self.deleting:
                self.publish_conversation(other)

    async def _retired(self, cid: int) -> None:
        """Wait for an archived conversation's agent being stopped after its last turn (a
        CLI takes a moment to exit): a delete right after a /compact then goes through."""
        runner = self.runners.get(cid)
        task = runner.task if runner is not None else None
        if task is not None and not task.done() and _retiring(runner):
            await asyncio.wait({task}, timeout=RETIRE_WAIT)

    def _begin_delete(self, conversation: Conversation) -> None:
        """Refuse to delete a busy conversation (or one already being deleted), else mark it."""
        cid = conversation.id or 0
        if cid in self.deleting:
            raise ConversationError(DELETING)
        self._refuse_while_busy(conversation, "delete")
        self.deleting.add(cid)

    def _unmark(self, marking: asyncio.Future[None], cid: int) -> None:
        """A cancelled delete's mark, taken off once its job is over (if it marked)."""
        if not marking.cancelled() and marking.exception() is None:
            self.deleting.discard(cid)

    def _delete_rows(self, conversation: Conversation) -> list[Conversation | None]:
        """Delete the rows; the conversations that were linked to it, as they are now."""
        with self.session() as session:
            session.add(conversation)
            # Locked and read again: a message another node stored since the first check
            # (this node stores none now) is not deleted with the rows.
            try:
                store.refresh_locked(session=session, conversation=conversation)
            except store.ConversationGone:  # another node deleted it first
                raise ConversationError(DELETING) from None
            self._refuse_while_busy(conversation, "delete", session)
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
        if conversation_id in self.deleting:  # read before its delete: no agent for it now
            raise ConversationError(DELETING)
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
            agent = await self._ensure_agent(runner, warm_up=True)
            if not self._dropped(runner) and isinstance(agent, WarmsUp):
                await agent.warm_up()  # (a turn waits for this task, so for this too)
        except NoRoom:  # it starts with the message, as it would have without warming
            log.info(
                "conversation %s not warmed: the agent memory budget is full",
                runner.conversation_id,
            )
        except Exception as error:  # noqa: BLE001 - the message's own turn will say why
            log.info("warming conversation %s failed: %s", runner.conversation_id, error)
            if not self._dropped(runner):  # refused before its start (its folder, its trust):
                self.publish_agent(runner.conversation_id)  # the tabs were told "starting"
        if self._dropped(runner) and runner.agent is not None and not self._closing:
            # Deleted (on another node) or handed on while its agent started: nothing else
            # would stop it. (Not waited for there: that would hold the heartbeat.)
            kept = self.runners.get(runner.conversation_id) is runner
            await self._close_agent(runner, publish=kept)

    def _dropped(self, runner: Runner) -> bool:
        """Whether a runner is no longer this node's to run (deleted, or its lease gone)."""
        cid = runner.conversation_id
        if self.runners.get(cid) is not runner:
            return True
        return self.cluster is not None and not self.cluster.holds(cid)

    async def interrupt(self, conversation_id: int) -> bool:
        """Stop the running turn, if any (queued messages stay queued)."""
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            busy, turn = await self.storage.read(self._turn_elsewhere, conversation_id)
            if busy:  # (redis.RedisError: 503, the Stop did not get through)
                await self.cluster.request_stop(conversation_id, turn)
            return busy
        return await self.stop_turn(conversation_id)

    async def stop_turn(self, conversation_id: int, prompt_id: str | None = None) -> bool:
        """Stop the turn a runner here runs; with prompt_id, only the turn of that prompt."""
        runner = self.runners.get(conversation_id)
        if runner is None or runner.state == TurnState.IDLE:
            return False
        if prompt_id is not None and prompt_id != runner.prompt_id:
            return False  # a Stop for a turn that has ended: not for the one running now
        runner.stop_requested = True  # seen by _run_turn when the agent is still starting
        if runner.questions:
            # Expired before they are denied (not at the turn's end): an answer taken on any
            # node from now on is refused; one taken before stands, and is what the agent gets.
            try:
                answered = await self.storage.write(
                    self._expire_questions, conversation_id, [*runner.questions], EXPIRED_STOPPED
                )
            except Exception as error:  # noqa: BLE001 - the turn's end expires them too
                log.warning("conversation %s: questions not expired: %s", conversation_id, error)
            else:
                for entry_id, decision in answered.items():
                    self.settle_question(conversation_id, entry_id, decision)
        await self._interrupt_agent(runner)
        return True

    def _expire_questions(
        self, conversation_id: int, entry_ids: list[int], why: str
    ) -> dict[int, PermissionDecision]:
        """Mark the questions Stop is about to deny expired, those still pending; the stored
        answers of the others (taken on another node, their notice still on its way). In the
        writer, in order with answers: one taken before stands, one after is refused."""
        answered: dict[int, PermissionDecision] = {}
        with self.session() as session:
            conversation = store.get_conversation(session=session, conversation_id=conversation_id)
            if conversation is None:
                return answered
            for entry_id in entry_ids:
                entry = self._expire_if_pending(session, conversation, entry_id, why)
                if entry is not None and entry.state in ("allowed", "denied"):
                    answered[entry_id] = decision_of(entry.state, entry.data)
        return answered

    def _turn_elsewhere(self, conversation_id: int) -> tuple[bool, str | None]:
        """Another node's conversation: whether it is busy, and its turn's prompt id.

        The id is the stored one of the message the running turn answers (None when no turn
        has begun yet: only messages are queued). In a storage thread.
        """
        with self.session() as session:
            busy = self.turn_view(conversation_id, session)["state"] != "idle"
            conversation = store.get_conversation(session=session, conversation_id=conversation_id)
            if not busy or conversation is None or not conversation.turn_active:
                return busy, None
            prompt = store.last_sent_message(session=session, conversation_id=conversation_id)
            turn = prompt.data.get("prompt_uuid") if prompt is not None else None
            return busy, turn if isinstance(turn, str) else None

    def answer(
        self, conversation: Conversation, entry_id: int, decision: PermissionDecision
    ) -> Entry:
        """Answer a permission question; the first answer wins (on any node).

        The waiting agent's future is taken while the answer is stored; a write that fails
        (another program holding SQLite's lock: 503, "send again") puts it back, so that the
        question is still asked, answered again or stopped.
        """
        runner = self.runners.get(conversation.id or 0)  # (none on another node)
        with self.session() as session:
            entry, answers, mode, future = self._store_answer(
                session, conversation, entry_id, decision, runner
            )
        if future is not None:  # the agent gets the answers as stored and shown (trimmed)
            self.storage.soon(_settle, future, replace(decision, answers=answers))
        elif self.cluster is not None and not self.cluster.holds(conversation.id or 0):
            fields = {"entry_id": entry_id, "allow": decision.allow, "message": decision.message}
            if answers is not None:
                fields["answers"] = answers
            if mode is not None:
                fields["mode"] = mode
            self.cluster.send("answer", conversation.id or 0, **fields)
        return entry

    def _store_answer(
        self,
        session: Session,
        conversation: Conversation,
        entry_id: int,
        decision: PermissionDecision,
        runner: Runner | None,
    ) -> tuple[Entry, Any, str | None, asyncio.Future[PermissionDecision] | None]:
        """answer's write: the entry, its answers and approved mode, the future it took."""
        session.add(conversation)
        # Locked: answers taken on two nodes at once come one after the other. The entry
        # first, then (in _save) the conversation: the order the owner's writes take.
        entry = store.get_entry(session=session, entry_id=entry_id, lock=True)
        if entry is None or entry.conversation_id != conversation.id:
            raise LookupError("No such question in this conversation.")
        if entry.data.get("type") != "permission":
            raise LookupError("That entry is not a permission question.")
        if entry.state == "expired":
            raise ConversationError(STOPPED_QUESTION)
        if entry.state != "pending":
            raise ConversationError(f"This question was already answered ({entry.state}).")
        answers = checked_answers(entry.data, decision.allow, decision.answers)  # ValueError
        mode = checked_mode(entry.data, decision.allow, decision.mode)  # ValueError
        future = runner.questions.pop(entry_id, None) if runner is not None else None
        here = self.cluster is None or self.cluster.holds(conversation.id or 0)
        if future is None and here:  # nothing waits for it: Stop denied it, or the turn ended
            raise ConversationError(STOPPED_QUESTION)
        state = "allowed" if decision.allow else "denied"
        data = entry.data
        if decision.message:  # the owner settles with it if the notice below is lost
            data = {**data, "answer_message": decision.message}
        if answers is not None:  # (and shown with the question)
            data = {**data, "answers": answers}
        if mode is not None:
            data = {**data, "approved_mode": mode}
        try:
            self._save(session, conversation, entry, state=state, data=data)
        except BaseException:
            if future is not None and runner is not None:
                runner.questions.setdefault(entry_id, future)  # not answered: still asked
            raise
        return entry, answers, mode, future

    def save_handoff(
        self, conversation: Conversation, handoff: HandoffText, *, source: str
    ) -> Handoff:
        """Store a handoff for the conversation's project; the agent's also shows as a card."""
        with self.session() as session:
            session.add(conversation)
            # Read again, locked: one deleted since it was read is ConversationGone (a 404),
            # not a handoff pointing at no conversation (a foreign key error).
            store.refresh_locked(session=session, conversation=conversation)
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
        runner = self.runners.get(conversation_id)
        if runner is not None:  # the card after its call's row (the CLI calls at once)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ANNOUNCE_WAIT):
                    await runner.until_handoff_call()
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


def _user_message(session: Session, conversation: Conversation, entry_id: int) -> Entry:
    """A message the user sent in this conversation (LookupError: no such message)."""
    entry = store.get_entry(session=session, entry_id=entry_id)
    if entry is None or entry.conversation_id != conversation.id or entry.kind != "user":
        raise LookupError("No such message in this conversation.")
    return entry


def _untitled(conversation: Conversation) -> bool:
    """True for a conversation that has had neither a title nor a message yet: a new one, or
    the successor of one (`/clear` as a new conversation's first act, to start from the
    project's handoff: "New conversation (compacted)" until its first message names it)."""
    return conversation.last_seq == 0 and compacted_from(conversation.title, DEFAULT_TITLE)


def _retiring(runner: Runner | None) -> bool:
    """Whether an archived conversation's runner is past its last turn, its agent stopping."""
    if runner is None or not runner.archived:
        return False
    return runner.retiring or runner.state == TurnState.IDLE
