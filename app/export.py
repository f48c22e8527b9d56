"""A conversation (optionally with the ones it was compacted from) as Markdown or JSON Lines."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal

from sqlmodel import Session, col, select

from app.models import Conversation, Entry
from app.views import conversation_view, utc_text

ExportFormat = Literal["md", "jsonl"]
MEDIA_TYPES = {"md": "text/markdown; charset=utf-8", "jsonl": "application/x-ndjson"}
SPEAKERS = {"user": "You", "agent": "Agent"}


def chain(session: Session, conversation: Conversation, ancestors: bool) -> list[Conversation]:
    """The conversation, after the ones it was compacted from when asked (oldest first)."""
    found = [conversation]
    seen = {conversation.id}
    while ancestors and found[0].compacted_from_id is not None:
        earlier = session.get(Conversation, found[0].compacted_from_id)
        if earlier is None or earlier.id in seen:  # a deleted ancestor, or a loop
            break
        seen.add(earlier.id)
        found.insert(0, earlier)
    return found


def entries_of(session: Session, conversation_id: int) -> Iterator[Entry]:
    """Every entry of a conversation, by seq."""
    query = select(Entry).where(Entry.conversation_id == conversation_id)
    return iter(session.exec(query.order_by(col(Entry.seq))).all())


def _fence(text: str) -> str:
    """A code fence longer than any backtick run in text."""
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")


def closed_fences(text: str) -> str:
    """The text with a code fence it leaves open closed (CommonMark's rules).

    A message cut in the middle of code (or a pasted half snippet) would otherwise turn every
    later heading of the export into code.
    """
    opened: str | None = None  # the open fence's marker
    for line in text.split("\n"):
        found = _FENCE.match(line)
        if found is None:
            continue
        marker, rest = found.groups()
        if opened is None:
            if not (marker[0] == "`" and "`" in rest):  # (a backtick fence's info has none)
                opened = marker
        elif marker[0] == opened[0] and len(marker) >= len(opened) and not rest.strip():
            opened = None
    return text if opened is None else f"{text}\n{opened}"


def markdown_part(conversation: Conversation, entries: Iterator[Entry]) -> str:
    """One conversation in Markdown: its messages, tool calls and notices in order."""
    lines = [
        f"# {' '.join(conversation.title.split())}",
        "",
        f"Conversation #{conversation.id} · {conversation.provider} · {conversation.status}"
        f" · created {conversation.created_at.isoformat()}",
        "",
    ]
    for entry in entries:
        if entry.kind in SPEAKERS:
            lines += [f"## {SPEAKERS[entry.kind]}", "", closed_fences(entry.text.rstrip()), ""]
            if images := entry.data.get("attachments"):  # (their bytes stay in the relay)
                kinds = ", ".join(str(image.get("media_type")) for image in images)
                lines += [
                    f"*With {len(images)} image{'s' if len(images) > 1 else ''}: {kinds}.*",
                    "",
                ]
        elif entry.kind == "activity":
            fence = _fence(entry.text)
            lines += [f"{fence}tool", entry.text.rstrip(), fence, ""]
        elif entry.text:
            lines += [f"> {' '.join(entry.text.split())}", ""]
    return "\n".join(lines)


def jsonl_lines(conversation: Conversation, entries: Iterator[Entry]) -> Iterator[str]:
    """One conversation in JSON Lines: a conversation line, then one line per entry."""
    yield _json({"type": "conversation", "conversation": conversation_view(conversation)})
    for entry in entries:
        yield _json(
            {
                "type": "entry",
                "conversation_id": entry.conversation_id,
                "id": entry.id,
                "seq": entry.seq,
                "kind": entry.kind,
                "state": entry.state,
                "text": entry.text,
                "data": entry.data,
                "created_at": utc_text(entry.created_at),
            }
        )


def _json(value: dict[str, Any]) -> str:
    line = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        line.encode()
    except UnicodeEncodeError:  # a lone surrogate in agent output: \u-escaped, still valid JSON
        line = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return line


def export(session: Session, conversation: Conversation, fmt: ExportFormat, ancestors: bool) -> str:
    """The whole export as text."""
    parts = chain(session, conversation, ancestors)
    if fmt == "md":
        return "\n---\n\n".join(
            markdown_part(part, entries_of(session, part.id or 0)) for part in parts
        )
    return "".join(
        line + "\n"
        for part in parts
        for line in jsonl_lines(part, entries_of(session, part.id or 0))
    )


def encode(body: str) -> bytes:
    """The export as UTF-8 (a lone surrogate left in Markdown becomes U+FFFD)."""
    return body.encode("utf-8", errors="replace")


def file_name(conversation: Conversation, fmt: ExportFormat, ancestors: bool = False) -> str:
    """The download's name (ASCII, from the id: a title could hold anything); one with the
    earlier conversations says so (the two downloads of one conversation no longer clash)."""
    with_earlier = "-with-earlier" if ancestors else ""
    return f"oarlock-conversation-{conversation.id}{with_earlier}.{fmt}"
