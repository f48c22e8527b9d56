"""Claude Code sessions started in a terminal: finding them, reading one as a timeline, storing it.

The CLI keeps each session as JSON lines in <config>/projects/<cwd slug>/<session id>.jsonl
(app/agents/transcript.py). A session is offered when its recorded cwd is inside a workspace
root; importing it creates a conversation holding its session id, so the next message resumes
it with `claude --resume`. Its history is read the way the relay shows a live turn: the
transcript's assistant and tool-result records go through the same EventMapper.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import Any

from sqlmodel import Session, col, select

from app.agents.base import Activity, MessageDone, Notice, Usage
from app.agents.transcript import SummaryWatch, bounded_lines, message_text, project_slug
from app.backups import tool_facts
from app.compaction import clip_summary, finished_text
from app.edits import edit_change
from app.models import Conversation, Entry
from app.store import is_message, storable, storable_data
from app.unicode_text import has_visible_character

SESSION_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MAX_LISTED = 100  # sessions listed, most recently written first
MAX_EXAMINED = 1000  # transcripts opened for one listing
HEAD_BYTES = 1 << 20  # read from a transcript's start to find its cwd and first prompt
TITLE_TAIL_BYTES = 64 << 10  # read from its end for a title set later (/rename)
LIST_LINE_LIMIT = 256 << 10  # longer lines (system prompt snapshots) are skipped when listing
HISTORY_BYTES = 32 << 20  # an import reads at most the transcript's last 32 MiB
HISTORY_LINE_LIMIT = 4 << 20  # a longer line is skipped unread
MAX_ENTRIES = 2000  # timeline entries kept (the latest) from one transcript
# Lines read between two moments the reading thread hands the GIL to the event loop's
# thread: without them the loop waited up to 0.3-0.5 s for it (session 32, bench/README.md).
GIL_EVERY = 500
TITLE_CHARS = 80
LINE_CHARS = 2000  # a command's output shown as a line
NO_RESULT = "No result was recorded in the transcript."
INTERRUPTED = "Interrupted by the user."
SYNTHETIC_NO_REPLY = "No response requested."
REMINDER = "system-reminder"


@dataclass(frozen=True)
class TerminalSession:
    """A session the CLI wrote, as the import list shows it."""

    session_id: str
    cwd: str
    title: str
    updated_at: float  # the transcript's modification time (Unix)
    size: int  # bytes


@dataclass
class Draft:
    """A timeline entry to store."""

    kind: str
    text: str
    state: str = "done"
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class History:
    """What an import stores: the entries, and the context the session last reported."""

    entries: list[Draft]
    context_tokens: int | None = None
    model: str | None = None
    skipped_lines: int = 0  # malformed or too long
    bytes_left_out: int = 0  # the transcript's start, beyond HISTORY_BYTES
    entries_left_out: int = 0  # beyond MAX_ENTRIES


def inside(path: Path, roots: Iterable[Path]) -> bool:
    """Whether a resolved path is one of the roots or below one."""
    return any(path == root or root in path.parents for root in roots)


def _parse(line: bytes | None) -> dict[str, Any] | None:
    """A transcript line as a JSON object, or None (too long, malformed, not an object)."""
    if line is None:
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: "[[[[…" nested past Python's limit
        return None
    return record if isinstance(record, dict) else None


def _one_line(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _blocks_text(content: Any) -> str:
    """The text of a user message's content: a string, or its text blocks (images named)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif block.get("type") == "image":
            parts.append("[image]")
    return "\n\n".join(parts)


# The tags are found with str.find, in one pass: a lazy regex (<tag>(.*?)</tag>) scanned to
# the text's end from every opening tag, so 8,000 unclosed ones took 13 s, holding the GIL
# (the whole relay stood still; found by a hostile review).


def _tag(name: str, text: str) -> str | None:
    """What the first <name>…</name> in text holds, or None (as re.search would find it)."""
    opening, closing = f"<{name}>", f"</{name}>"
    start = text.find(opening)
    if start == -1:
        return None
    end = text.find(closing, start + len(opening))
    return None if end == -1 else text[start + len(opening) : end]


def _without_tag(name: str, text: str) -> str:
    """text without its <name>…</name> blocks (as re.sub would remove them)."""
    opening, closing = f"<{name}>", f"</{name}>"
    kept, at = [], 0
    while (start := text.find(opening, at)) != -1:
        end = text.find(closing, start + len(opening))
        if end == -1:
            break
        kept.append(text[at:start])
        at = end + len(closing)
    kept.append(text[at:])
    return "".join(kept)


def user_drafts(text: str) -> list[Draft]:
    """What a user record's text shows as: a message, a command, a command's output, a line."""
    text = _without_tag(REMINDER, text).strip()
    if not text:
        return []
    if text.startswith("[Request interrupted by user"):
        return [Draft("line", INTERRUPTED, data={"level": "info", "type": "interrupted"})]
    if (command := _tag("command-name", text)) is not None:
        args = (_tag("command-args", text) or "").strip()
        return [Draft("user", f"{command.strip()} {args}".strip(), "sent", {"imported": True})]
    if (command := _tag("bash-input", text)) is not None:
        return [Draft("user", f"! {command.strip()}", "sent", {"imported": True})]
    outputs = [_tag(name, text) for name in ("local-command-stdout", "bash-stdout", "bash-stderr")]
    if any(output is not None for output in outputs):
        said = "\n".join(o.strip() for o in outputs if o and o.strip())
        if not said:
            return []
        if len(said) > LINE_CHARS:
            said = said[:LINE_CHARS] + "…"
        return [Draft("line", said, data={"level": "info", "type": "command_output"})]
    return [Draft("user", text, "sent", {"imported": True})]


def first_prompt(record: dict[str, Any]) -> str | None:
    """A user record's prompt as a one-line title, if it is one the user typed."""
    if record.get("type") != "user" or _hidden(record):
        return None
    message = record.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    for draft in user_drafts(_blocks_text(content)):
        if draft.kind == "user":
            return _one_line(draft.text, TITLE_CHARS)
    return None


def _hidden(record: dict[str, Any]) -> bool:
    """Records the CLI never shows as the user's: meta, a compaction summary, a subagent's."""
    return bool(record.get("isMeta") or record.get("isCompactSummary") or record.get("isSidechain"))


def _placeholder(record: dict[str, Any]) -> bool:
    """The reply the CLI makes up for a prompt a killed CLI never answered (not an error)."""
    message = record.get("message") or {}
    content = message.get("content")
    return (
        message.get("model") == "<synthetic>"
        and isinstance(content, list)
        and [b.get("text") for b in content if isinstance(b, dict)] == [SYNTHETIC_NO_REPLY]
    )


# -- listing -----------------------------------------------------------------------------------


def session_summary(path: Path) -> tuple[str | None, str | None]:
    """A transcript's cwd and title (a /rename, the CLI's own title, else the first prompt).

    Reads its start until both the cwd and the first prompt are found (HEAD_BYTES at most),
    and its last TITLE_TAIL_BYTES for a title record.
    """
    cwd: str | None = None
    prompt: str | None = None
    for line in bounded_lines(path, stop=HEAD_BYTES, limit=LIST_LINE_LIMIT):
        record = _parse(line)
        if record is None:
            continue
        if cwd is None and isinstance(record.get("cwd"), str):
            cwd = record["cwd"]
        if prompt is None:
            prompt = first_prompt(record)
        if cwd is not None and prompt is not None:
            break
    titles: dict[str, str] = {}
    start = max(0, path.stat().st_size - TITLE_TAIL_BYTES)
    for line in bounded_lines(path, start=start, limit=LIST_LINE_LIMIT):
        if line is None or b'-title"' not in line:
            continue  # most lines: no JSON parsing
        record = _parse(line) or {}
        for kind, key in (("custom-title", "customTitle"), ("ai-title", "aiTitle")):
            if record.get("type") == kind and isinstance(record.get(key), str):
                titles[kind] = record[key]
    title = titles.get("custom-title") or titles.get("ai-title") or prompt
    # A title as the API would take it: one line, storable, with a visible character.
    title = storable(_one_line(title, TITLE_CHARS)) if title else None
    return cwd, title if title and has_visible_character(title) else None


def _candidates(config: Path, roots: list[Path]) -> list[tuple[float, int, Path]]:
    """Transcripts in project directories that may belong to a root, newest first."""
    projects = config / "projects"
    prefixes = tuple(project_slug(str(root)) for root in roots)
    found = []
    try:
        directories = [d for d in projects.iterdir() if d.name.startswith(prefixes)]
    except OSError:
        return []
    for directory in directories:
        try:
            files = list(directory.glob("*.jsonl"))
        except OSError:
            continue
        for path in files:
            if not SESSION_ID.match(path.stem):
                continue
            try:
                stat = path.stat()
            except OSError:
                continue
            if S_ISREG(stat.st_mode):  # a FIFO of that name would hang the list's read
                found.append((stat.st_mtime, stat.st_size, path))
    found.sort(key=lambda item: item[0], reverse=True)
    return found


def candidate_ids(config: Path, roots: list[Path]) -> list[str]:
    """The session ids a listing looks at, newest first (for the conversations holding them)."""
    return [path.stem for _mtime, _size, path in _candidates(config, roots)[:MAX_EXAMINED]]


def list_sessions(
    config: Path, roots: list[Path], held: Container[str] = ()
) -> tuple[list[TerminalSession], bool]:
    """Sessions whose cwd is an existing directory inside a root, newest first; and whether
    more were left out. Sessions in `held` (conversations hold them) are listed beside the
    MAX_LISTED others: they would fill the list with what cannot be imported."""
    sessions: list[TerminalSession] = []
    listed = 0
    candidates = _candidates(config, roots)
    for mtime, size, path in candidates[:MAX_EXAMINED]:
        if listed == MAX_LISTED:
            return sessions, True
        try:
            cwd, title = session_summary(path)
            if cwd is None or not os.path.isabs(cwd):
                continue
            resolved = Path(cwd).resolve()
            if not inside(resolved, roots) or not resolved.is_dir():
                continue
        except (OSError, RuntimeError, ValueError):  # ValueError: a NUL in the cwd, say
            continue
        sessions.append(TerminalSession(path.stem, cwd, title or "(no prompt)", mtime, size))
        listed += path.stem not in held
    return sessions, len(candidates) > MAX_EXAMINED


def find_transcript(config: Path, session_id: str) -> Path | None:
    """The transcript of a session (its id already checked against SESSION_ID)."""
    try:
        found = next((config / "projects").glob(f"*/{session_id}.jsonl"), None)
        return found if found is not None and found.is_file() else None  # never a FIFO
    except OSError:
        return None


# -- reading a history -------------------------------------------------------------------------


class HistoryBuilder:
    """Turn transcript records, in order, into timeline entries as a live turn stores them."""

    def __init__(self) -> None:
        from app.providers import load_provider  # (app.providers imports much of the app)

        load_provider("claude")  # the SDK, imported only here (in a reading thread) and frozen
        from app.agents.claude_code import EventMapper

        self.mapper = EventMapper()
        self.entries: list[Draft] = []
        self.tools: dict[str, Draft] = {}
        self.dropped_calls: set[str] = set()  # calls drop_oldest forgot, their results unshown
        # Where each assistant message not yet placed began in entries (a placed one leaves:
        # every message's placing walked every message before, quadratic in the transcript).
        self.starts: dict[str, int] = {}
        self.placed: set[str] = set()
        self.context_tokens: int | None = None
        self.model: str | None = None
        self.compaction: tuple[Draft, SummaryWatch] | None = None  # its summary not yet seen

    def feed(self, record: dict[str, Any]) -> None:
        """Take one record (malformed ones raise; the caller skips them)."""
        if record.get("isSidechain"):
            return  # a subagent's inner turn: its Task call and result are shown
        if self.compaction is not None:
            self._summary(record)
        kind = record.get("type")
        if kind == "assistant":
            if _placeholder(record):
                return
            message_id = (record.get("message") or {}).get("id") or record.get("uuid")
            # Its text goes before its tool calls, as the live timeline shows it streamed.
            # (A record of one placed: the mapper skips it.)
            new = message_id not in self.placed and message_id not in self.starts
            if new:
                self.starts[message_id] = len(self.entries)
            try:
                self._events(self.mapper.feed_json(record))
            finally:  # one the mapper did not open (malformed, a subagent's) is never placed
                if new and message_id in self.starts and not self.mapper.is_open(message_id):
                    del self.starts[message_id]
        elif kind == "user":
            self._user(record)
        elif kind == "system" and record.get("subtype") == "compact_boundary":
            self._events(self.mapper.finish())
            meta = record.get("compactMetadata") or {}
            numbers = {"pre_tokens": meta.get("preTokens"), "post_tokens": meta.get("postTokens")}
            numbers = {k: v for k, v in numbers.items() if isinstance(v, int)}
            data = {"type": "compaction", "trigger": meta.get("trigger"), "level": "info"}
            if isinstance(meta.get("durationMs"), int):  # as a live line's details show it
                data["duration_ms"] = meta["durationMs"]
            line = Draft("line", finished_text("line", **numbers), data=data | numbers)
            self.entries.append(line)
            self.compaction = (line, SummaryWatch(record))  # its summary follows (_summary)

    def _summary(self, record: dict[str, Any]) -> None:
        """The last compaction's summary, when this record is it (every record is looked at:
        the summary may name the boundary through the records between them)."""
        assert self.compaction is not None
        line, watch = self.compaction
        if watch.is_summary(record):
            summary = message_text(record)
            if summary:  # the line's details, word for word (clipped as a live one's)
                line.data["summary"] = storable(clip_summary(summary))
            self.compaction = None

    def _user(self, record: dict[str, Any]) -> None:
        content = record["message"]["content"]
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        ):
            self._events(self.mapper.feed_json(record))
        if _hidden(record):
            return
        drafts = user_drafts(_blocks_text(content))
        if drafts:
            self._events(self.mapper.finish())  # the agent's message before it is complete
            for draft in drafts:
                self._add_user(draft)

    def _add_user(self, draft: Draft) -> None:
        """Add what a user record shows, in the order the terminal showed it.

        A terminal /compact writes its compaction's records before its own: the command goes
        before its line, and the CLI's "Compacted (ctrl+o to see full summary)" after it is
        left out (the line says it, and its details hold the summary).
        """
        entries = self.entries
        last = entries[-1] if entries else None
        if last is None or self.starts or last.data.get("trigger") != "manual":
            entries.append(draft)
        elif draft.kind == "user" and draft.text.split(" ", 1)[0] == "/compact":
            entries.insert(len(entries) - 1, draft)
        elif not (
            draft.data.get("type") == "command_output"
            and draft.text.startswith("Compacted")
            and len(entries) > 1
            and entries[-2].text.split(" ", 1)[0] == "/compact"
        ):
            entries.append(draft)

    def _events(self, events: list[Any]) -> None:
        for event in events:
            match event:
                case MessageDone(message_id=message_id, text=text):
                    if text.strip():
                        at = self.starts.get(message_id, len(self.entries))
                        self.entries.insert(at, Draft("agent", text))
                        self._shift_after(message_id, at)
                    self.starts.pop(message_id, None)
                    self.placed.add(message_id)
                case Activity(phase="call"):
                    data: dict[str, Any] = {"type": "tool", "tool": event.name}
                    data["tool_id"] = event.tool_id
                    if facts := tool_facts(event.name, event.input):
                        data["backup"] = facts
                    if change := edit_change(event.name, event.input):
                        data["edit"] = change
                    draft = Draft("activity", event.summary, "running", data)
                    self.tools[event.tool_id] = draft
                    self.entries.append(draft)
                case Activity(phase="result"):
                    result = {"output": event.output, "is_error": event.is_error}
                    state = "error" if event.is_error else "done"
                    if (draft := self.tools.pop(event.tool_id, None)) is not None:
                        draft.state, draft.data = state, {**draft.data, **result}
                    elif event.tool_id in self.dropped_calls:
                        self.dropped_calls.discard(event.tool_id)
                    else:
                        data = {"type": "tool", "tool": event.name, "tool_id": event.tool_id}
                        self.entries.append(Draft("activity", "", state, data | result))
                case Notice(text=text, level=level, data=data):
                    self.entries.append(Draft("line", text, data={"level": level, **data}))
                case Usage(context_tokens=tokens, model=model):
                    # As a live turn's figures: an int a database column takes, a str.
                    if isinstance(tokens, int) and 0 <= tokens < 1 << 62:
                        self.context_tokens = tokens
                    if isinstance(model, str) and model:
                        self.model = storable(model)

    def drop_oldest(self, keep: int) -> int:
        """Forget all but the latest `keep` entries, or fewer: never one at or after the place
        where a message still open goes (its text is put in there later). How many went."""
        gone = min(len(self.entries) - keep, min(self.starts.values(), default=len(self.entries)))
        if gone <= 0:
            return 0
        kept = {id(draft) for draft in self.entries[gone:]}
        del self.entries[:gone]
        for message_id, start in self.starts.items():
            self.starts[message_id] = start - gone
        for tool_id, draft in list(self.tools.items()):  # a call dropped: its result too
            if id(draft) not in kept:
                del self.tools[tool_id]
                self.dropped_calls.add(tool_id)
        return gone

    def _shift_after(self, message_id: str, at: int) -> None:
        """The messages that began after this one begin one entry later: their start was
        taken before its text went in at `at` (their order came out wrong)."""
        after = False
        for other, start in self.starts.items():
            if after and start >= at:
                self.starts[other] = start + 1
            after = after or other == message_id

    def finish(self) -> list[Draft]:
        """The entries; a call whose result the transcript lacks is shown as ended."""
        self._events(self.mapper.finish())
        for draft in self.tools.values():
            draft.state = "done"
            draft.data = {**draft.data, "output": NO_RESULT}
        self.tools.clear()
        return self.entries


def read_history(
    path: Path,
    *,
    max_bytes: int = HISTORY_BYTES,
    line_limit: int = HISTORY_LINE_LIMIT,
    max_entries: int = MAX_ENTRIES,
) -> History:
    """A transcript's timeline, from at most its last max_bytes and as its last max_entries."""
    size = path.stat().st_size  # what a file still being written adds meanwhile is not read
    start = max(0, size - max_bytes)
    builder = HistoryBuilder()
    skipped = dropped = 0
    lines = bounded_lines(path, start=start, stop=size - start, limit=line_limit)
    for number, line in enumerate(lines, start=1):
        if number % GIL_EVERY == 0:
            time.sleep(0)  # the GIL to the loop's thread (a switch interval does not do it)
        record = _parse(line)
        if record is None:
            skipped += line is None or bool(line.strip())
            continue
        try:
            builder.feed(record)
        except Exception:  # noqa: BLE001 - one malformed record never stops an import
            skipped += 1
        if len(builder.entries) > 2 * max_entries:  # memory: only the latest are kept
            dropped += builder.drop_oldest(keep=max_entries)
    entries = builder.finish()
    left_out = max(0, len(entries) - max_entries)
    return History(
        entries=entries[left_out:],
        context_tokens=builder.context_tokens,
        model=builder.model,
        skipped_lines=skipped,
        bytes_left_out=start,
        entries_left_out=dropped + left_out,
    )


def notes(session_id: str, cwd: str, history: History) -> list[Draft]:
    """The lines an imported timeline starts with: where it came from, what was left out."""
    lines = [
        Draft(
            "line",
            f"Imported from the Claude Code session {session_id} (started in a terminal in {cwd}).",
            data={"level": "info", "type": "imported", "session_id": session_id},
        )
    ]
    if history.bytes_left_out or history.entries_left_out:
        lines.append(
            Draft(
                "line",
                "Only the latest part of this session is shown here; "
                "the agent still remembers all of it.",
                data={"level": "info", "type": "imported_partly"},
            )
        )
    return lines


# -- storing -----------------------------------------------------------------------------------


def holder(session: Session, session_id: str) -> int | None:
    """The conversation that already holds this session id, if any."""
    query = select(Conversation.id).where(col(Conversation.session_id) == session_id)
    return session.exec(query.limit(1)).first()


def holders(session: Session, session_ids: list[str]) -> dict[str, int]:
    """Which of these session ids conversations already hold, and which conversation."""
    if not session_ids:
        return {}
    query = select(Conversation.session_id, Conversation.id).where(
        col(Conversation.session_id).in_(session_ids)
    )
    return {sid: cid for sid, cid in session.exec(query) if sid and cid}


def save_import(
    session: Session,
    *,
    title: str,
    cwd: str,
    session_id: str,
    permission_mode: str,
    trusted_settings: list[str] | None,
    history: History,
    entries: list[Draft],
) -> Conversation:
    """Create the conversation with its whole imported timeline, in one transaction."""
    conversation = Conversation(
        title=title,
        provider="claude",
        cwd=cwd,
        permission_mode=permission_mode,
        trusted_settings=trusted_settings,
        session_id=session_id,
        context_tokens=history.context_tokens,
        model=history.model,
    )
    session.add(conversation)
    session.flush()  # its id, still inside the transaction
    for seq, draft in enumerate(entries, start=1):
        session.add(
            Entry(
                conversation_id=conversation.id or 0,
                seq=seq,
                kind=draft.kind,
                text=storable(draft.text),
                state=draft.state,
                data=storable_data(draft.data),
            )
        )
    conversation.last_seq = len(entries)
    # The stored count the /compact preview reads (it stayed 0: "Left out" said nothing older).
    conversation.message_count = sum(is_message(draft.kind, draft.state) for draft in entries)
    session.add(conversation)
    session.commit()
    session.refresh(conversation)
    return conversation
