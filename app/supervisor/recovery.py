"""Restart recovery: close what a crash left open, resolve the turn it cut, resume the queue."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from sqlalchemy import event
from sqlmodel import Session

from app import store
from app.agents.base import Agent, Receipts, received
from app.models import Conversation, Entry
from app.questions import EXPIRED_RESTART, EXPIRED_TAKEOVER
from app.supervisor.base import SupervisorState
from app.supervisor.events import SHUTDOWN_LINE
from app.supervisor.runner import Runner, TurnState

log = logging.getLogger(__name__)


RESTART_LINE = "The relay restarted while this turn was running; its reply may be incomplete."
UNKNOWN_LINE = (
    "The relay restarted while this turn was running; the agent may not have received your message."
)
REDELIVERED_LINE = (
    "The relay restarted before the agent received your message; it is delivered again."
)
MISSED_AGAIN_LINE = "The relay restarted again before the agent received your message."
# The same on a cluster node taking a conversation over: the node that ran the turn died, or
# stalled past its lease (or restarted: a node starts under a new name each time).
TAKEOVER_LINE = "The node running this turn stopped or stalled; its reply may be incomplete."
TAKEOVER_UNKNOWN_LINE = (
    "The node running this turn stopped or stalled; the agent may not have received your message."
)
TAKEOVER_REDELIVERED_LINE = (
    "The node running this turn stopped or stalled before the agent received your message; "
    "it is delivered again."
)
TAKEOVER_MISSED_AGAIN_LINE = (
    "The node running this turn stopped or stalled again before the agent received your message."
)
RECEIPT_WAIT = 15.0  # seconds a restart waits for agent processes left running to say
RECEIPT_POLL = 0.25


@dataclass(frozen=True, slots=True)
class Cause:
    """What recovery's lines say cut a turn: a restart, or a cluster node's takeover."""

    cut: str  # the agent had the message
    unknown: str  # it may not have
    redelivered: str  # it had not: delivered again
    missed_again: str  # it had not, a second time
    expired: str  # why an open question expired


RESTARTED = Cause(RESTART_LINE, UNKNOWN_LINE, REDELIVERED_LINE, MISSED_AGAIN_LINE, EXPIRED_RESTART)
TAKEN_OVER = Cause(
    TAKEOVER_LINE,
    TAKEOVER_UNKNOWN_LINE,
    TAKEOVER_REDELIVERED_LINE,
    TAKEOVER_MISSED_AGAIN_LINE,
    EXPIRED_TAKEOVER,
)


class Recovery(SupervisorState):
    """Recovery after a restart (mixed into Supervisor)."""

    def _recover_all(self) -> None:
        with self.session() as session:
            for conversation in store.conversations_with_work(session=session):
                self._recover(session, conversation)

    def _recover(
        self, session: Session, conversation: Conversation, cause: Cause = RESTARTED
    ) -> None:
        """Close what a crash left open in one conversation, and resume its queue."""
        conversation_id = conversation.id or 0
        for entry in store.entries_in_state(
            session=session, conversation_id=conversation_id, state="streaming"
        ):
            self._save(session, conversation, entry, state="interrupted")
        self._expire_pending(session, conversation, cause.expired)
        running = store.entries_in_state(
            session=session, conversation_id=conversation_id, state="running"
        )
        compactions = [entry for entry in running if entry.data.get("type") == "compaction"]
        for entry in running:
            if entry not in compactions:  # a tool call whose result never came
                self._save(session, conversation, entry, state="interrupted", data=entry.data)
        # The turn judged first: a compaction begun after its message says the agent had it.
        decided = not conversation.turn_active or self._recover_turn(session, conversation, cause)
        for entry in compactions:  # ended without a result: no line (§3)
            self._remove(session, conversation, entry)
        if not decided:
            return  # decided a little later, and the queue resumed then (_recover_later)
        queued = store.count_queued(session=session, conversation_id=conversation_id)
        if conversation.turn_active:
            store.update_conversation(session=session, conversation=conversation, turn_active=False)
            # Tabs that saw the turn run (other nodes' tabs, after a takeover) see it end.
            self.publish_conversation(conversation)
            if not queued:
                self.publish_turn(conversation_id, session, queued=0)
        if queued:
            self._wake(conversation_id)

    def _recover_turn(self, session: Session, conversation: Conversation, cause: Cause) -> bool:
        """Resolve a cut turn now; False when it waits for an agent process left running."""
        cut = store.last_sent_message(session=session, conversation_id=conversation.id or 0)
        if cut is None:
            self._line(session, conversation, cause.cut, level="warning")
            return True
        agent = self._receipt_agent(conversation)
        # What the relay stored of the turn says it arrived: the agent's record may not (the
        # CLI writes its transcript in batches, and dies with a relay killed before a batch).
        answered = store.answered_after(
            session=session, conversation_id=conversation.id or 0, seq=cut.seq
        )
        got = True if answered else self._received(agent, conversation, cut)
        if got is None and agent is not None and "prompt_uuid" in cut.data:
            # An agent process of the crashed relay may still be taking the message.
            runner = self.runner(conversation.id or 0)
            runner.state = TurnState.RUNNING
            # The cut turn's: a Stop for it (from another node) stops what recovery delivers.
            runner.prompt_id = str(cut.data["prompt_uuid"])
            self.storage.soon(self._start_recover_later, runner, cut.id or 0, agent, cause)
            return False
        self._resolve_cut(session, conversation, cut, got, cause)
        return True

    async def _settle_shutdown_cuts(self) -> None:
        """The turns the shutdown cut before an answer, their agents stopped: a message the
        agent recorded gets the shutdown line; the others stay active, and the next start
        delivers them again (_recover_turn), as after a crash."""
        for runner in self.live_runners():
            if not runner.cut_by_shutdown:
                continue
            try:
                await self.storage.write(self._settle_shutdown_cut, runner.conversation_id)
            except Exception:  # the next start decides
                log.exception(
                    "conversation %s: could not settle its cut turn", runner.conversation_id
                )
            runner.cut_by_shutdown = False  # (until now this node kept its lease: holds_nothing)

    def _settle_shutdown_cut(self, conversation_id: int) -> None:
        with self.session() as session:
            conversation = self._load(session, conversation_id)
            cut = store.last_sent_message(session=session, conversation_id=conversation_id)
            if cut is None or not conversation.turn_active:
                return
            if self._received(self._receipt_agent(conversation), conversation, cut):
                self._line(session, conversation, SHUTDOWN_LINE, data={"type": "interrupted"})
                store.update_conversation(
                    session=session, conversation=conversation, turn_active=False
                )
                self.publish_conversation(conversation)  # other nodes' tabs: not running

    def _start_recover_later(
        self, runner: Runner, entry_id: int, agent: Agent, cause: Cause
    ) -> None:
        runner.task = asyncio.create_task(
            self._recover_later(runner, entry_id, agent, cause),
            name=f"recover-{runner.conversation_id}",
        )

    async def _recover_later(
        self, runner: Runner, entry_id: int, agent: Agent, cause: Cause
    ) -> None:
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
                    self._resolve_cut(session, conversation, cut, got, cause)
                store.update_conversation(
                    session=session, conversation=conversation, turn_active=False
                )
                self.publish_conversation(conversation)  # (the turn: once the queue is done)

        try:
            while got is None and time.monotonic() < deadline:
                await asyncio.sleep(RECEIPT_POLL)
                if self._closing:
                    return  # still marked active: the next start decides
                got = await self.storage.read(ask)
            await self.storage.write(resolve)
        except Exception:  # the queue must not stall behind a failed check
            log.exception("recovering conversation %s failed", runner.conversation_id)
        runner.prompt_id = None  # (a Stop that came meanwhile stops the next turn, as on one node)
        await self._deliver(runner)

    def _resolve_cut(
        self,
        session: Session,
        conversation: Conversation,
        cut: Entry,
        got: bool | None,
        cause: Cause,
    ) -> None:
        """Received: a cut line. Not received: delivered again (once). Unknown: Resend."""
        if got is False and not cut.data.get("redelivered"):
            self._redeliver(session, conversation, cut, cause)
            return
        if got:
            text, data = cause.cut, {"type": "cut", "entry_id": cut.id, "received": True}
        else:  # unknown, or missed a second time: the user decides (Resend)
            text = cause.missed_again if got is False else cause.unknown
            data = {"type": "cut", "entry_id": cut.id, "received": got, "resend": True}
        line = self._line(session, conversation, text, level="warning", data=data)
        cut_as = "received" if got else "unknown" if got is None else "missed"
        kept = dict(cut.data)
        if got is False:  # never received: the next message carries it (a Resend, or any)
            kept = self._summary_back(session, conversation, kept)
        self._save(session, conversation, cut, data={**kept, "cut": cut_as, "cut_line": line.id})

    def _summary_back(
        self, session: Session, conversation: Conversation, data: dict[str, Any]
    ) -> dict[str, Any]:
        """A message's data without the carry-over it went out with, which the conversation's
        next message carries again (the agent never got it, or the user sends it again)."""
        data = dict(data)
        summary = data.pop("summary", None)
        if isinstance(summary, str) and conversation.pending_summary is None:
            conversation.pending_summary = summary
            session.add(conversation)
            # The "will be sent" bar shows again once it is stored: a write that fails (503)
            # tells the tabs nothing.
            event.listen(
                session,
                "after_commit",
                lambda _: self.publish_conversation(conversation),
                once=True,
            )
        return data

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

    def _redeliver(
        self, session: Session, conversation: Conversation, entry: Entry, cause: Cause = RESTARTED
    ) -> None:
        """Queue a message the agent never received again, ahead of every other queued one."""
        queued = store.entries_in_state(
            session=session, conversation_id=conversation.id or 0, state="queued"
        )
        data = {key: value for key, value in entry.data.items() if key != "prompt_uuid"}
        data = self._summary_back(session, conversation, data)
        data["redelivered"] = True
        line_data = {"type": "redelivered", "entry_id": entry.id}
        self._line(session, conversation, cause.redelivered, level="warning", data=line_data)
        self._save(session, conversation, entry, move=True, state="queued", data=data)
        for later in queued:  # the queue is delivered by seq: these go after it, in their order
            self._save(session, conversation, later, move=True)
