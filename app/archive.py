"""The archive, for the agent (SPEC §8): search and read the conversations this one was
compacted from (its ancestors), never another conversation."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlmodel import Session, col, select

from app.models import Conversation, Entry
from app.search import search

SEARCH_LIMIT = 20  # matches one search_archive call lists, best first
LINE_CHARS = 200  # characters of one match's line
QUERY_CHARS = 500  # the longest query, as the search box's
READ_LIMIT = 50  # messages one read_archive call returns, at most
READ_CHARS = 40_000  # characters of message text one read_archive answer holds, at most
MAX_ANCESTORS = 1_000  # how far back the chain is followed
MAX_SEQ = 2**63 - 1  # the largest seq a 64-bit column holds
SPEAKERS = {"user": "User", "agent": "Agent"}
NO_ANCESTORS = (
    "This conversation was not compacted from another one: it has no archived conversation "
    "to search or read."
)


# One query for the whole chain, however long (a loop ends it too, at MAX_ANCESTORS).
_CHAIN = (
    "WITH RECURSIVE up(id, depth) AS ("
    " SELECT compacted_from_id, 1 FROM conversation WHERE id = :id"
    " UNION ALL SELECT c.compacted_from_id, up.depth + 1 FROM conversation c"
    " JOIN up ON c.id = up.id WHERE up.depth < :most)"
    " SELECT id FROM up WHERE id IS NOT NULL ORDER BY depth"
)


def ancestor_ids(session: Session, conversation_id: int) -> list[int]:
    """The ids of the conversations this one was compacted from, nearest first."""
    found: dict[int, None] = {}
    params = {"id": conversation_id, "most": MAX_ANCESTORS}
    for (ancestor,) in session.connection().execute(text(_CHAIN), params):
        if ancestor == conversation_id or ancestor in found:  # a loop: the chain ends
            break
        found[ancestor] = None
    return list(found)


def one_line(text: str, limit: int = LINE_CHARS) -> str:
    """Text as one line (whitespace runs become one space), cut to limit characters with …."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _integer(arguments: dict[str, Any], name: str, default: int | None) -> int:
    """An integer argument (a bool is not one); ValueError names the argument."""
    value = arguments.get(name, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"read_archive needs `{name}` as an integer.")
    return value


def search_archive(session: Session, conversation_id: int, arguments: dict[str, Any]) -> str:
    """The search_archive tool's answer: matching messages of the ancestors, best first."""
    query = arguments.get("query")
    if not isinstance(query, str) or not query.split():
        raise ValueError("search_archive needs `query`: the words to look for.")
    if len(query) > QUERY_CHARS:
        raise ValueError(f"The query is {len(query):,} characters; the limit is {QUERY_CHARS}.")
    ids = ancestor_ids(session, conversation_id)
    if not ids:
        return NO_ANCESTORS
    hits = search(session, query, SEARCH_LIMIT, conversation_ids=ids)
    if not hits:
        return (
            f"No message of the archived conversations this one was compacted from "
            f"({_listed(ids)}) matches {query!r}."
        )
    lines = [
        f"{len(hits)} matching messages in the archived conversations this one was compacted "
        f"from, best first (at most {SEARCH_LIMIT}; read_archive gives the full texts):"
    ]
    for hit in hits:
        excerpt = one_line("".join(span["text"] for span in hit["snippet"]))
        lines.append(
            f"conversation {hit['conversation_id']}, seq {hit['seq']}, {hit['kind']}: {excerpt}"
        )
    return "\n".join(lines)


def _listed(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids)


def read_archive(session: Session, conversation_id: int, arguments: dict[str, Any]) -> str:
    """The read_archive tool's answer: an ancestor's messages from a seq, full texts."""
    wanted = _integer(arguments, "conversation_id", None)
    from_seq = _integer(arguments, "from_seq", 1)
    limit = _integer(arguments, "limit", READ_LIMIT)
    if not 1 <= limit <= READ_LIMIT:
        raise ValueError(f"read_archive reads 1 to {READ_LIMIT} messages at a time (`limit`).")
    if not 1 <= from_seq <= MAX_SEQ:
        raise ValueError("read_archive needs `from_seq` as a seq: 1 or more.")
    ids = ancestor_ids(session, conversation_id)
    if not ids:
        raise ValueError(NO_ANCESTORS)
    archived = session.get(Conversation, wanted) if wanted in ids else None
    if archived is None:  # the same answer whether or not that conversation exists
        raise ValueError(
            f"Conversation {wanted} is not one this conversation was compacted from; "
            f"read_archive reads only these: {_listed(ids)}."
        )
    query = (
        select(Entry)
        .where(
            col(Entry.conversation_id) == wanted,
            col(Entry.kind).in_(tuple(SPEAKERS)),
            col(Entry.seq) >= from_seq,
            col(Entry.text) != "",
        )
        .order_by(col(Entry.seq))
        .limit(limit + 1)
    )
    messages = list(session.exec(query).all())
    title = one_line(archived.title)
    parts = [f'Conversation {wanted} "{title}" (archived), messages from seq {from_seq}:']
    used = 0
    next_seq: int | None = messages[limit].seq if len(messages) > limit else None
    for index, message in enumerate(messages[:limit]):
        body = message.text
        if used + len(body) > READ_CHARS:
            if index:  # the rest in the next call
                next_seq = message.seq
                break
            left_out = len(body) - READ_CHARS  # one message longer than the whole answer
            body = body[:READ_CHARS] + f"\n[cut: {left_out:,} more characters not shown]"
            next_seq = messages[1].seq if len(messages) > 1 else None
            parts.append(f"\n[seq {message.seq}] {SPEAKERS[message.kind]}:\n{body}")
            break
        used += len(body)
        parts.append(f"\n[seq {message.seq}] {SPEAKERS[message.kind]}:\n{body}")
    if len(parts) == 1:
        parts.append(f"\nNo message from seq {from_seq}.")
    elif next_seq is not None:
        parts.append(f"\nMore follows: call read_archive with from_seq {next_seq}.")
    else:
        parts.append(f"\nEnd of conversation {wanted}.")
    return "\n".join(parts)
