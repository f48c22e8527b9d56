"""The timeline writer: every entry is stored, then published; the turn and agent states."""

from __future__ import annotations

import logging
from collections.abc import Collection, Container
from typing import Any

from sqlmodel import Session

from app import attachment_store, store
from app.models import Conversation, Entry
from app.store import PENDING
from app.supervisor.base import SupervisorState
from app.supervisor.runner import Runner
from app.views import conversation_view, entry_view

log = logging.getLogger(__name__)


TIMELINE_PAGE = 200
QUEUED_SHOWN = 100  # queued messages a read of the conversation shows at most


class Timeline(SupervisorState):
    """The timeline writer and the states tabs are told (mixed into Supervisor)."""

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
        conversation_id: int,
        session: Session,
        *,
        limit: int = TIMELINE_PAGE,
        before_seq: int | None = None,
    ) -> dict[str, Any]:
        """A conversation with its latest timeline page and turn; live text included.

        Its seq is the last one published, read before the database (the conversation's row
        included): every event up to it is in what is read after, and a later one reaches a
        tab that follows from that seq. LookupError: no such conversation.
        """
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
        conversation = self._load(session, conversation_id)
        # Queued messages are shown at the end, whichever page is asked for: the next
        # QUEUED_SHOWN (the turn's `queued` counts them all), so that a queue of many large
        # messages cannot make every read of the conversation as large. Read before the page:
        # on PostgreSQL each statement sees the latest commits, and a message delivered
        # between the two reads is then in the page (read after), not in neither.
        queued = store.entries_in_state(
            session=session, conversation_id=conversation_id, state="queued", limit=QUEUED_SHOWN
        )
        entries = store.last_entries(
            session=session, conversation_id=conversation_id, limit=limit + 1, before_seq=before_seq
        )
        has_more = len(entries) > limit
        page = entries[-limit:]
        entries = [*page, *_queue_without(queued, page)]
        view = conversation_view(conversation)
        view["backup"] = self.backups.latest(conversation_id)
        # Live text only for what is stored as streaming: a stored message's own text is whole
        # (a node's live text can lag behind the database: its owner stored the end already).
        view["timeline"] = [
            entry_view(entry, live.get(entry.id) if entry.state == "streaming" else None)
            for entry in entries
        ]
        view["has_more"] = has_more
        # Where the page before this one ends.
        view["earlier"] = page[0].seq if has_more and page else None
        view["turn"] = self.turn_view(conversation_id, session)
        if state is not None:  # this node runs it
            view["turn"]["state"] = state
        view["agent"] = self.agent_state(conversation_id)
        view["seq"] = shown
        view["epoch"] = self.hub.epoch
        return view

    def publish_live_text(self, conversation_id: int) -> None:
        """In the writer: publish each streaming message whole so far (a node lost deltas)."""
        runner = self.runners.get(conversation_id)
        for streaming in list(runner.streaming.values()) if runner is not None else []:
            seq = self.hub.next_seq(conversation_id)  # above every delta in its text
            entry = entry_view(streaming.entry, streaming.text)
            self.hub.publish(conversation_id, {"type": "entry", "seq": seq, "entry": entry})

    async def view(
        self, conversation_id: int, *, limit: int = TIMELINE_PAGE, before_seq: int | None = None
    ) -> dict[str, Any]:
        """The snapshot of a conversation, read in a storage thread (LookupError: none)."""

        def read() -> dict[str, Any]:
            if not self.hub.knows(conversation_id):
                # Loading it numbers it (an existing conversation only); read again below.
                with self.session() as session:
                    self._load(session, conversation_id)
            with self.session() as session:
                return self.snapshot(conversation_id, session, limit=limit, before_seq=before_seq)

        return await self.storage.read(read)

    def _add(
        self,
        session: Session,
        conversation: Conversation,
        kind: str,
        text: str = "",
        *,
        state: str = "done",
        data: dict[str, Any] | None = None,
        claim: Collection[int] = (),
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
                claim=claim,
            )
        except Exception:
            session.rollback()
            self.hub.rewind(cid, seq)  # no gap in what tabs see
            raise
        self.hub.publish(cid, {"type": "entry", "seq": seq, "entry": entry_view(entry)})
        if state == PENDING:
            self._questions_changed(session, cid)
        return entry

    def _save(
        self,
        session: Session,
        conversation: Conversation,
        entry: Entry,
        *,
        move: bool = False,
        row: dict[str, Any] | None = None,
        **changes: Any,
    ) -> Entry:
        """Change an entry and publish it; row: the conversation's fields changed with it."""
        cid = conversation.id or 0  # read before a failed flush expires it
        seq = self.hub.next_seq(cid)
        if move:  # to the end of the timeline
            changes["seq"] = seq
        try:
            session.add(entry)  # (as save_entry does first: an expired entry reloads here)
            asked = entry.state == PENDING
            store.save_entry(
                session=session,
                entry=entry,
                conversation=conversation,
                event_seq=seq,
                row=row,
                **changes,
            )
        except Exception:
            session.rollback()
            self.hub.rewind(cid, seq)
            raise
        self.hub.publish(cid, {"type": "entry", "seq": seq, "entry": entry_view(entry)})
        if asked != (entry.state == PENDING):
            self._questions_changed(session, cid)
        return entry

    def _expire_pending(
        self, session: Session, conversation: Conversation, why: str, keep: Container[int] = ()
    ) -> None:
        """Expire the conversation's questions still pending, but those in keep: each locked
        and read again first, so that an answer another node stored meanwhile stands (and is
        not counted off twice)."""
        cid = conversation.id or 0
        for found in store.entries_in_state(session=session, conversation_id=cid, state=PENDING):
            if found.id not in keep:
                self._expire_if_pending(session, conversation, found.id or 0, why)

    def _expire_if_pending(
        self, session: Session, conversation: Conversation, entry_id: int, why: str
    ) -> Entry | None:
        """Lock a question's row and read it again; expire it if it is still pending (an
        answer stored meanwhile, on any node, stands), saying why (app/questions.py's
        EXPIRED_*). The entry as it is now (None: gone)."""
        entry = store.get_entry(session=session, entry_id=entry_id, lock=True)
        if entry is not None and entry.state == PENDING:
            data = {**entry.data, "expired": why}
            self._save(session, conversation, entry, state="expired", data=data)
        return entry

    def _questions_changed(self, session: Session, conversation_id: int) -> None:
        """Tell every tab how many questions a conversation now waits on (the sidebar's
        "needs you"), read again: the count changed in SQL, and the caller's copy of
        the conversation may be older than this job (an answer's)."""
        try:  # the write is committed: a failed read must not undo it for its caller
            fresh = session.get(Conversation, conversation_id, populate_existing=True)
        except Exception:  # the tabs learn the count on their next load
            log.exception("conversation %s: could not read its questions", conversation_id)
            rolled_back(session)
            return
        if fresh is not None:
            self.publish_conversation(fresh)

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

    def _remove(self, session: Session, conversation: Conversation, entry: Entry) -> None:
        entry_id = entry.id
        store.delete_entry(session=session, entry=entry)
        self.hub.emit(conversation.id or 0, {"type": "entry_removed", "entry_id": entry_id})

    def publish_turn(
        self, conversation_id: int, session: Session, queued: int | None = None
    ) -> None:
        """Tell every tab the turn state and queue length (queued: counted in this transaction
        already, on a node that runs the conversation)."""
        if queued is not None and (self.cluster is None or self.cluster.holds(conversation_id)):
            runner = self.runners.get(conversation_id)
            turn = {"state": runner.state if runner else "idle", "queued": queued}
        else:
            turn = self.turn_view(conversation_id, session)
        self.hub.emit(conversation_id, {"type": "turn", "turn": turn})

    def publish_attachments(self, session: Session, conversation_id: int) -> None:
        """Tell every tab the images waiting unsent in the conversation (its composers)."""
        waiting = attachment_store.unsent(session=session, conversation_id=conversation_id)
        self.hub.emit(conversation_id, {"type": "attachments", "attachments": waiting})

    def _publish_turn(self, conversation_id: int) -> None:
        with self.session() as session:
            self.publish_turn(conversation_id, session)

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

    async def _error_line_soon(
        self, runner: Runner, text: str, data: dict[str, Any] | None = None
    ) -> None:
        """Show an error line, written in the storage thread (see _error_line)."""
        await self._patiently(self._error_line, runner, text, data)

    def _error_line(self, runner: Runner, text: str, data: dict[str, Any] | None = None) -> None:
        """Show an error line; one the database refuses is logged, then written later."""
        try:
            self._write_line(runner, text, data=data)
        except Exception:  # kept in runner.failure, retried by _next_turn
            log.exception(
                "conversation %s: could not store the line %r", runner.conversation_id, text
            )
            runner.failure = (text, data)  # its data too: a trust line keeps its button

    def _write_line(
        self,
        runner: Runner,
        text: str,
        level: str = "error",
        data: dict[str, Any] | None = None,
    ) -> None:
        """A line in the runner's conversation (an error unless told), in one transaction."""
        with self.session() as session:
            conversation = store.get_conversation(
                session=session, conversation_id=runner.conversation_id
            )
            if conversation is not None:
                self._line(session, conversation, text, level=level, data=data)


def _queue_without(queued: list[Entry], page: list[Entry]) -> list[Entry]:
    """The queued messages read first, without those the page (read after) shows delivered:
    on PostgreSQL each statement sees the latest commits."""
    ids = {entry.id for entry in page}
    return [entry for entry in queued if entry.id not in ids]


def rolled_back(session: Session) -> None:
    """Make a session that a failed write left usable again (its next write retries)."""
    try:
        session.rollback()
    except Exception:  # the connection itself is gone: the next statement says so
        log.exception("could not roll back a failed transaction")
