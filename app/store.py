"""Database access: plain functions over a Session, each one transaction."""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    Insert,
    Select,
    Update,
    bindparam,
    case,
    delete,
    func,
    insert,
    text,
    update,
)
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.orm import make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.exc import StaleDataError
from sqlalchemy.orm.util import identity_key
from sqlmodel import Session, col, select

from app import attachment_store
from app.models import NOT_QUEUED, Conversation, Entry, Handoff, Pin, utcnow
from app.summary import SUMMARY_WINDOW

MESSAGE_KINDS = ("user", "agent")
PENDING = "pending"  # a question's state until it is answered or expires
# Half an emoji (a lone surrogate), and the noncharacters U+FDD0-U+FDEF: Unicode keeps them for
# a program's own use, and the relay marks search matches with two of them (app/search.py).
_UNSTORABLE = re.compile("[\ud800-\udfff\ufdd0-\ufdef]")
_NONCHARACTERS = {code: "\ufffd" for code in range(0xFDD0, 0xFDF0)}
MAX_PINS = 50  # per conversation: 3,500 characters hold about 13 whole pins anyway


def is_message(kind: str, state: str) -> bool:
    """True for what conversation.message_count counts: a message that reached the agent."""
    return kind in MESSAGE_KINDS and state != "queued"


def _counts(kind: str, state: str) -> tuple[int, int]:
    """What an entry adds to its conversation's message_count and questions (0 or 1 each)."""
    return int(is_message(kind, state)), int(state == PENDING)


# Statements on every turn's path, built once: building one costs several times what
# running it does (SQLAlchemy's coercions and cache key), and a statement object built once
# keeps its cache key. Values go in as parameters; an UPDATE sets the columns its
# parameters name besides its own (compiled once per set of names, then cached). A
# parameter compared with a column takes the column's type (BIGINT: PostgreSQL casts it).


@cache
def _insert_entry() -> Insert:
    return insert(Entry).returning(col(Entry.id))


@cache
def _update_entry() -> Update:
    return update(Entry).where(col(Entry.id) == bindparam("_entry_id"))


@cache
def _update_conversation(raise_seq: bool, count: bool, asked: bool = False) -> Update:
    """UPDATE of one conversation (_conversation_id); raise_seq: last_seq raised to _seq, never
    lowered (a portable max: PostgreSQL has no 2-arg max); count: message_count + _count,
    asked: questions + _asked, in SQL (no stale copy can undo another)."""
    values: dict[str, Any] = {}
    if raise_seq:
        last = col(Conversation.last_seq)
        seq = bindparam("_seq", type_=last.type)  # (in THEN too: the column's own type)
        values["last_seq"] = case((last < seq, seq), else_=last)
    if count:
        values["message_count"] = col(Conversation.message_count) + bindparam("_count")
    if asked:
        values["questions"] = col(Conversation.questions) + bindparam("_asked")
    query = update(Conversation).where(col(Conversation.id) == bindparam("_conversation_id"))
    return query.values(values) if values else query


@cache
def _conversation() -> Select[Any]:
    return select(Conversation).where(col(Conversation.id) == bindparam("_conversation_id"))


@cache
def _lock_conversation() -> Select[Any]:
    return _conversation().with_for_update().execution_options(populate_existing=True)


@cache
def _entries_in_state() -> Select[Any]:
    return (
        select(Entry)
        .where(
            col(Entry.conversation_id) == bindparam("_conversation_id"),
            col(Entry.state) == bindparam("_state"),
        )
        .order_by(col(Entry.seq))
    )


def _add_counts(session: Session, conversation_id: int, messages: int, questions: int) -> None:
    """Add to a conversation's message and question counts, in SQL (no stale copy can undo
    another)."""
    if messages or questions:
        session.connection().execute(
            _update_conversation(False, bool(messages), bool(questions)),
            {"_conversation_id": conversation_id, **_deltas(messages, questions)},
        )


def _deltas(messages: int, questions: int) -> dict[str, int]:
    """The parameters of _update_conversation's counts (only those it sets: an UPDATE refuses
    a parameter it does not use)."""
    return {name: delta for name, delta in (("_count", messages), ("_asked", questions)) if delta}


class AlreadyArchived(Exception):
    """The conversation was archived (compacted) by another writer first."""


def storable(text: str) -> str:
    """Text as it can be stored and sent: NUL (PostgreSQL's text takes none), a lone
    surrogate (half an emoji: a CLI cutting a long output in UTF-16 leaves one, and no UTF-8
    encoder takes it) and the noncharacters the relay marks with become U+FFFD; the two halves
    of one pair become its character."""
    return _encodable(text.replace("\x00", "\ufffd"))


def _encodable(text: str) -> str:
    """text with U+FFFD for each lone surrogate and noncharacter (a pair's halves joined)."""
    if text.isascii() or _UNSTORABLE.search(text) is None:
        return text
    text = text.translate(_NONCHARACTERS)
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def storable_data(value: Any) -> Any:
    """A JSON value as it can be stored and sent: its strings (keys too) encodable (a NUL
    stays: JSON holds it as \\u0000), and a number that is not finite (NaN, Infinity: not
    JSON) null."""
    if isinstance(value, str):
        return _encodable(value)
    if isinstance(value, dict):
        return {
            _encodable(key) if isinstance(key, str) else key: storable_data(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [storable_data(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def create_conversation(
    *,
    session: Session,
    title: str,
    provider: str,
    cwd: str,
    permission_mode: str,
    trusted_settings: list[str] | None = None,
) -> Conversation:
    """Create an active conversation."""
    conversation = Conversation(
        title=title,
        provider=provider,
        cwd=cwd,
        permission_mode=permission_mode,
        trusted_settings=trusted_settings,
    )
    session.add(conversation)
    session.commit()
    session.refresh(conversation)
    return conversation


def get_conversation(*, session: Session, conversation_id: int) -> Conversation | None:
    """The conversation with this id, or None (the session's own copy, if it has one)."""
    if session.identity_map.get(identity_key(Conversation, conversation_id)) is not None:
        return session.get(Conversation, conversation_id)  # (an expired copy reloads there)
    return session.exec(_conversation(), params={"_conversation_id": conversation_id}).first()


def list_conversations(
    *,
    session: Session,
    status: str,
    limit: int = 100,
    before: tuple[datetime, int] | None = None,
    title: str | None = None,
) -> list[Conversation]:
    """Conversations with this status, most recently updated first, after a (time, id) cursor.

    title: only those whose title holds it, ignoring case (ASCII letters' case on SQLite).
    """
    query = select(Conversation).where(Conversation.status == status)
    if title:
        query = query.where(col(Conversation.title).icontains(title, autoescape=True))
    if before is not None:
        updated_at, conversation_id = before
        query = query.where(
            (col(Conversation.updated_at) < updated_at)
            | (
                (col(Conversation.updated_at) == updated_at)
                & (col(Conversation.id) < conversation_id)
            )
        )
    query = query.order_by(col(Conversation.updated_at).desc(), col(Conversation.id).desc())
    return list(session.exec(query.limit(limit)))


def _committed(obj: Any, values: dict[str, Any]) -> None:
    """Give a loaded object the values just written in SQL (nothing left for a flush)."""
    for name, value in values.items():
        set_committed_value(obj, name, value)


def update_conversation(
    *, session: Session, conversation: Conversation, **changes: Any
) -> Conversation:
    """Change fields of a conversation and save it (one UPDATE, no flush of the object)."""
    values = {**changes, "updated_at": utcnow()}
    if unknown := values.keys() - Conversation.__table__.c.keys():  # (SQL would ignore them)
        raise ValueError(f"not columns of a conversation: {sorted(unknown)}")
    session.flush()  # what the caller changed first, then these (they win, as setattr did)
    counts = (
        session.connection()
        .execute(_update_returning_counts(), {**values, "_conversation_id": conversation.id})
        .one_or_none()
    )
    session.commit()  # (and whatever else the caller changed in the session)
    # The counts kept in SQL as they are now: the caller's copy may be older than them (its
    # tabs would be told no question waits while one does).
    _committed(conversation, {**values, **(counts._asdict() if counts else {})})
    return conversation


@cache
def _update_returning_counts() -> Update:
    return _update_conversation(False, False).returning(
        col(Conversation.message_count), col(Conversation.questions)
    )


class ConversationGone(LookupError):
    """A conversation read a moment before was deleted since (a 404 for a request)."""

    def __init__(self, conversation_id: int) -> None:
        super().__init__(f"No conversation {conversation_id}.")


def refresh_locked(*, session: Session, conversation: Conversation) -> None:
    """Read a conversation again as committed now, its row locked (see lock_conversation);
    ConversationGone when it was deleted since it was read."""
    conversation_id = conversation.id or 0  # (read before: once the refresh failed, it cannot be)
    try:
        session.refresh(conversation, with_for_update=True)
    except InvalidRequestError:  # "Could not refresh instance": the row is gone
        raise ConversationGone(conversation_id) from None


def lock_conversation(*, session: Session, conversation_id: int) -> Conversation | None:
    """Read a conversation as committed now and lock its row until the transaction ends.

    SELECT … FOR UPDATE on PostgreSQL (several nodes write one conversation); SQLite has no
    row locks and needs none: its one writer thread runs these transactions one at a time.
    """
    return session.exec(_lock_conversation(), params={"_conversation_id": conversation_id}).first()


def seq_floor(*, session: Session, conversation_id: int) -> int:
    """The number a conversation's counter may start from: above every stored entry.

    last_seq alone may lag: two nodes that store entries at once each write the conversation's
    last_seq from their own copy, and the later commit may lower it.
    """
    stored = select(func.max(Entry.seq)).where(Entry.conversation_id == conversation_id)
    last = select(Conversation.last_seq).where(Conversation.id == conversation_id)
    return max(session.exec(stored).first() or 0, session.exec(last).first() or 0)


def raise_last_seqs(*, session: Session, seqs: dict[int, int]) -> None:
    """Make each conversation's last_seq at least the given one (numbers given out live)."""
    if not seqs:
        return
    query = (
        update(Conversation)
        .where(col(Conversation.id) == bindparam("cid"))
        .where(col(Conversation.last_seq) < bindparam("seq"))
        .values(last_seq=bindparam("seq"))
    )
    rows = [{"cid": cid, "seq": seq} for cid, seq in seqs.items()]
    session.connection().execute(query, rows)
    session.commit()


def add_entry(
    *,
    session: Session,
    conversation: Conversation,
    seq: int,
    kind: str,
    text: str = "",
    state: str = "done",
    data: dict[str, Any] | None = None,
    touch: bool = True,
    claim: Collection[int] = (),
) -> Entry:
    """Append an entry at position seq; the conversation remembers its last seq.

    Core statements, not the ORM's flush and refresh: this is on every turn's path.
    claim: attachments sent with this message, marked in the same transaction.
    """
    cid = conversation.id or 0
    values: dict[str, Any] = {
        "conversation_id": cid,
        "seq": seq,
        "kind": kind,
        "text": storable(text),
        "state": state,
        "data": storable_data(data) if data else {},
        "created_at": utcnow(),
    }
    connection = session.connection()
    entry_id = connection.execute(_insert_entry(), values).scalar_one()
    if claim:
        attachment_store.claim(connection, cid, claim, entry_id)
    counted, asked = _counts(kind, state)
    changes: dict[str, Any] = {"_conversation_id": cid, "_seq": seq}
    changes.update(_deltas(counted, asked))
    if touch:
        changes["updated_at"] = values["created_at"]
    connection.execute(_update_conversation(True, bool(counted), bool(asked)), changes)
    session.commit()
    entry = Entry(id=entry_id, **values)
    make_transient_to_detached(entry)  # a stored row, as if loaded: later changes update it
    session.add(entry)  # in the identity map, as a loaded row would be
    seen = {"last_seq": max(conversation.last_seq, seq)}
    if touch:
        seen["updated_at"] = values["created_at"]
    _committed(conversation, seen)
    return entry


def save_entry(
    *,
    session: Session,
    entry: Entry,
    conversation: Conversation,
    event_seq: int,
    row: dict[str, Any] | None = None,
    **changes: Any,
) -> Entry:
    """Change an entry; event_seq (the change's number) becomes the conversation's last.

    row: fields of the conversation changed with it, in the same UPDATE of its row.
    """
    # In the session first: an entry a failed write expired reloads its stored values here.
    session.add(entry)
    values: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "data":
            value = storable_data(dict(value))
        elif name == "text":
            value = storable(value)
        values[name] = value
    before = (entry.conversation_id, _counts(entry.kind, entry.state))
    kind, state = entry.kind, values.get("state", entry.state)
    after = (values.get("conversation_id", entry.conversation_id), _counts(kind, state))
    # Core statements (on every turn's path): the ORM's flush costs more than the writes.
    connection = session.connection()
    if values:
        entry_id = entry.id
        found = connection.execute(_update_entry(), {**values, "_entry_id": entry_id}).rowcount
        if found != 1:  # as the ORM's flush says it
            session.rollback()
            raise StaleDataError(f"entry {entry_id} is not stored any more")
    # count changes by conversation, messages and questions (in SQL, not a copy)
    counts: dict[int, tuple[int, int]] = {}
    if before != after:
        (old, (m0, q0)), (new, (m1, q1)) = before, after
        counts[old] = (-m0, -q0)
        m, q = counts.get(new, (0, 0))
        counts[new] = (m + m1, q + q1)
    for conversation_id, (messages, questions) in counts.items():
        if conversation_id != conversation.id:
            _add_counts(session, conversation_id, messages, questions)
    own: dict[str, Any] = {**(row or {}), "_conversation_id": conversation.id, "_seq": event_seq}
    count, asked = counts.get(conversation.id or 0, (0, 0))  # one UPDATE of its row, not three
    own.update(_deltas(count, asked))
    connection.execute(_update_conversation(True, bool(count), bool(asked)), own)
    session.commit()
    _committed(entry, values)
    _committed(conversation, {**(row or {}), "last_seq": max(conversation.last_seq, event_seq)})
    return entry


def write_checkpoint(*, session: Session, entry_id: int, text: str) -> None:
    """Store a streaming entry's text so far (its crash-safe checkpoint) and commit.

    One UPDATE by id: the entry's object is not in the session, so a write that fails leaves
    nothing expired (a snapshot reads the streaming entry's object from another thread).
    """
    values = {"text": storable(text), "_entry_id": entry_id}
    session.connection().execute(_update_entry(), values)
    session.commit()


def trust_settings(*, session: Session, conversation_id: int, files: list[str]) -> None:
    """Record the project files trusted for a conversation's folder, uncommitted (not a
    change the list shows: updated_at stays)."""
    table = Conversation.__table__
    session.connection().execute(
        update(table).where(table.c.id == conversation_id).values(trusted_settings=files)
    )


def delete_entry(*, session: Session, entry: Entry) -> None:
    """Remove an entry from the timeline."""
    session.add(entry)  # as in save_entry: an expired entry reloads in the session
    messages, questions = _counts(entry.kind, entry.state)
    _add_counts(session, entry.conversation_id, -messages, -questions)
    session.delete(entry)
    session.commit()


def get_entry(*, session: Session, entry_id: int, lock: bool = False) -> Entry | None:
    """The entry with this id, or None; lock: its row locked until the transaction ends."""
    if lock:
        return session.get(Entry, entry_id, with_for_update=True, populate_existing=True)
    return session.get(Entry, entry_id)


def answered_questions(*, session: Session, entry_ids: Collection[int]) -> list[Entry]:
    """Those of these permission questions that have their answer."""
    if not entry_ids:
        return []
    query = select(Entry).where(col(Entry.id).in_(list(entry_ids)), Entry.state != "pending")
    return list(session.exec(query).all())


def last_entries(
    *, session: Session, conversation_id: int, limit: int, before_seq: int | None = None
) -> list[Entry]:
    """The last `limit` entries that are not queued (before before_seq), oldest first; one
    range scan of the index that holds only those (queued ones are read on their own)."""
    query = select(Entry).where(Entry.conversation_id == conversation_id, text(NOT_QUEUED))
    if before_seq is not None:
        query = query.where(Entry.seq < before_seq)
    query = query.order_by(col(Entry.seq).desc()).limit(limit)
    return list(reversed(session.exec(query).all()))


def entries_in_state(
    *, session: Session, conversation_id: int, state: str, limit: int | None = None
) -> list[Entry]:
    """Entries of a conversation in one state (queued messages, streaming text...), by seq;
    the first `limit` of them when given."""
    params = {"_conversation_id": conversation_id, "_state": state}
    query = _entries_in_state() if limit is None else _entries_in_state().limit(limit)
    return list(session.exec(query, params=params))


def last_sent_message(
    *, session: Session, conversation_id: int, before: int | None = None
) -> Entry | None:
    """The user message delivered last (the one a cut turn was answering); given before, the
    last one before that seq."""
    query = (
        select(Entry)
        .where(
            Entry.conversation_id == conversation_id,
            Entry.state == "sent",
            Entry.kind == "user",
        )
        .order_by(col(Entry.seq).desc())
        .limit(1)
    )
    if before is not None:
        query = query.where(Entry.seq < before)
    return session.exec(query).first()


def answered_after(*, session: Session, conversation_id: int, seq: int) -> bool:
    """Whether the agent's text, a tool call, a question or a compaction (the agent compacts
    once it has a message) was stored after seq (a turn's message): then the agent had
    received that message."""
    query = (
        select(Entry.kind, Entry.data)
        .where(
            Entry.conversation_id == conversation_id,
            col(Entry.kind).in_(["agent", "activity", "line"]),
            Entry.seq > seq,
        )
        .order_by(col(Entry.seq))
        .limit(100)  # (the relay's own lines before the agent's first entry: a few at most)
    )
    for kind, data in session.exec(query):
        if kind != "line" or data.get("type") == "compaction":
            return True
    return False


def recent_messages(
    *, session: Session, conversation_id: int, limit: int = SUMMARY_WINDOW
) -> list[Entry]:
    """The last `limit` user/agent messages that reached the agent, oldest first."""
    found: list[Entry] = []
    for kind in MESSAGE_KINDS:
        query = (
            select(Entry)
            .where(
                Entry.conversation_id == conversation_id,
                Entry.kind == kind,
                Entry.state != "queued",
            )
            .order_by(col(Entry.seq).desc())
            .limit(limit)
        )
        found.extend(session.exec(query))
    found.sort(key=lambda entry: entry.seq)
    return found[-limit:]


def count_queued(*, session: Session, conversation_id: int) -> int:
    """How many user messages wait for the agent."""
    query = select(func.count()).where(
        Entry.conversation_id == conversation_id, Entry.state == "queued"
    )
    return int(session.exec(query).one())


def conversations_with_work(*, session: Session) -> list[Conversation]:
    """Conversations (archived ones too) with a turn cut short, messages still queued, or an
    entry left open (streaming text, a question, a tool call or a compaction)."""
    unfinished = select(Entry.conversation_id).where(
        col(Entry.state).in_(["queued", "streaming", "pending", "running"])
    )
    query = select(Conversation).where(
        col(Conversation.turn_active) | col(Conversation.id).in_(unfinished)
    )
    return list(session.exec(query))


def save_handoff(
    *,
    session: Session,
    cwd: str,
    done: str,
    next: str,
    files: list[str],
    source: str,
    conversation_id: int | None,
) -> Handoff:
    """Store a handoff for a project (it becomes the project's latest)."""
    handoff = Handoff(  # an agent's handoff may hold a NUL: stored as U+FFFD, as its replies
        cwd=cwd,
        done=storable(done),
        next=storable(next),
        files=[storable(name) for name in files],
        source=source,
        conversation_id=conversation_id,
    )
    session.add(handoff)
    session.commit()
    session.refresh(handoff)
    return handoff


def latest_handoff(*, session: Session, cwd: str) -> Handoff | None:
    """The project's newest handoff (highest id: deterministic even within one clock tick)."""
    query = select(Handoff).where(Handoff.cwd == cwd).order_by(col(Handoff.id).desc()).limit(1)
    return session.exec(query).first()


def compact_conversation(
    *,
    session: Session,
    old: Conversation,
    summary: str | None,
    title: str,
    carry: dict[str, Any] | None = None,
) -> Conversation:
    """Archive old and create its successor with the pending summary, in one transaction.

    The old conversation's undelivered (queued) messages move into the successor, in order:
    an archived conversation never runs a turn, and the first of them carries the summary.
    Its pins are copied to the successor; carry is the record of what was carried.
    """
    # The row lock first: a turn beginning on another node (lock_conversation) either ends
    # before this reads the queue, or waits and then sees the conversation archived. Without
    # it, a message that node was just delivering moved here after later ones.
    lock_conversation(session=session, conversation_id=old.id or 0)
    new = Conversation(
        title=title,
        provider=old.provider,
        cwd=old.cwd,
        permission_mode=old.permission_mode,
        auto_compact_window=old.auto_compact_window,
        model=old.model,
        model_window=old.model_window,
        chosen_model=old.chosen_model,
        trusted_settings=old.trusted_settings,
        pending_summary=summary,
        compacted_from_id=old.id,
        carry=carry,
    )
    session.add(new)
    session.flush()  # gives new its id, still inside the transaction
    now = utcnow()
    # Archived only if still active when the row is written: another writer (a second
    # session, or PostgreSQL's READ COMMITTED letting this UPDATE run after a concurrent
    # commit) that compacted it first leaves this attempt, successor included, undone.
    archived = session.connection().execute(
        update(Conversation)
        .where(col(Conversation.id) == old.id, col(Conversation.status) == "active")
        .values(status="archived", compacted_into_id=new.id, updated_at=now)
    )
    if archived.rowcount != 1:
        session.rollback()
        raise AlreadyArchived(f"conversation {old.id} is no longer active")
    for name, value in (("status", "archived"), ("compacted_into_id", new.id), ("updated_at", now)):
        set_committed_value(old, name, value)  # as stored; nothing more to write
    queued = entries_in_state(session=session, conversation_id=old.id or 0, state="queued")
    attachment_store.move(
        session.connection(), old.id or 0, new.id or 0, [entry.id or 0 for entry in queued]
    )
    for seq, entry in enumerate(queued, start=1):
        entry.conversation_id, entry.seq = new.id or 0, seq
        session.add(entry)
    new.last_seq = len(queued)
    session.add(new)
    for pin in list_pins(session=session, conversation_id=old.id or 0):
        session.add(
            Pin(**pin.model_dump(exclude={"id", "conversation_id"}), conversation_id=new.id)
        )
    session.commit()
    session.refresh(new)
    return new


def backup_entries(
    *, session: Session, conversation_id: int, upto_seq: int | None, replies: int = 40
) -> list[Entry]:
    """What a backup reads: user messages, tool calls, the last agent messages with text."""
    query = select(Entry).where(
        Entry.conversation_id == conversation_id, col(Entry.kind).in_(["user", "activity"])
    )
    agents = select(Entry).where(
        Entry.conversation_id == conversation_id, Entry.kind == "agent", Entry.text != ""
    )
    if upto_seq is not None:
        query = query.where(Entry.seq <= upto_seq)
        agents = agents.where(Entry.seq <= upto_seq)
    found = list(session.exec(query))
    found += session.exec(agents.order_by(col(Entry.seq).desc()).limit(replies))
    found.sort(key=lambda entry: entry.seq)
    return found


def delete_conversation(*, session: Session, conversation: Conversation) -> None:
    """Delete a conversation and its entries; links to it from others are cleared, in one go."""
    conversation_id = conversation.id
    for link in (Conversation.compacted_from_id, Conversation.compacted_into_id):
        session.connection().execute(
            update(Conversation).where(col(link) == conversation_id).values({link.key: None})
        )
    session.connection().execute(delete(Pin).where(col(Pin.conversation_id) == conversation_id))
    # A handoff is the project's (its cwd), not the conversation's: it stays, unlinked.
    session.connection().execute(
        update(Handoff)
        .where(col(Handoff.conversation_id) == conversation_id)
        .values(conversation_id=None)
    )
    session.connection().execute(delete(Entry).where(col(Entry.conversation_id) == conversation_id))
    attachment_store.delete_for_conversation(session.connection(), conversation_id or 0)
    session.connection().execute(
        delete(Conversation).where(col(Conversation.id) == conversation_id)
    )
    session.commit()


def count_messages(*, session: Session, conversation_id: int) -> int:
    """The conversation's message count as stored now (one row read, never a count)."""
    query = select(Conversation.message_count).where(Conversation.id == conversation_id)
    count = session.exec(query).one_or_none()
    if count is None:
        raise ConversationGone(conversation_id)
    return int(count)


def list_pins(*, session: Session, conversation_id: int) -> list[Pin]:
    """A conversation's pins, oldest message first (ancestors' before its own)."""
    query = (
        select(Pin)
        .where(Pin.conversation_id == conversation_id)
        .order_by(col(Pin.source_id), col(Pin.source_seq), col(Pin.id))
        .limit(MAX_PINS)
    )
    return list(session.exec(query))


def count_pins(*, session: Session, conversation_id: int) -> int:
    """How many pins a conversation holds."""
    query = select(func.count()).where(Pin.conversation_id == conversation_id)
    return int(session.exec(query).one())


def find_pin(*, session: Session, conversation_id: int, entry_id: int) -> Pin | None:
    """The conversation's pin of this message, if it is pinned."""
    query = select(Pin).where(Pin.conversation_id == conversation_id, Pin.entry_id == entry_id)
    return session.exec(query).first()


def add_pin(*, session: Session, conversation: Conversation, entry: Entry, role: str) -> Pin:
    """Pin a message of the conversation (its text copied); pinning twice keeps one pin."""
    found = find_pin(session=session, conversation_id=conversation.id or 0, entry_id=entry.id or 0)
    if found is not None:
        return found
    pin = Pin(
        conversation_id=conversation.id or 0,
        entry_id=entry.id or 0,
        source_id=entry.conversation_id,
        source_seq=entry.seq,
        role=role,
        text=entry.text,
    )
    session.add(pin)
    session.commit()
    session.refresh(pin)
    return pin


def remove_pin(*, session: Session, conversation_id: int, entry_id: int) -> bool:
    """Unpin a message in a conversation; False when it was not pinned there."""
    result = session.connection().execute(
        delete(Pin).where(
            col(Pin.conversation_id) == conversation_id, col(Pin.entry_id) == entry_id
        )
    )
    session.commit()
    return bool(result.rowcount)


def message_lines(
    *, session: Session, conversation_id: int, before_seq: int | None, limit: int
) -> list[Entry]:
    """The newest `limit` messages that reached the agent before a seq, oldest first."""
    found: list[Entry] = []
    for kind in MESSAGE_KINDS:
        query = select(Entry).where(
            Entry.conversation_id == conversation_id, Entry.kind == kind, Entry.state != "queued"
        )
        if before_seq is not None:
            query = query.where(Entry.seq < before_seq)
        found.extend(session.exec(query.order_by(col(Entry.seq).desc()).limit(limit)))
    found.sort(key=lambda entry: entry.seq)
    return found[-limit:]
