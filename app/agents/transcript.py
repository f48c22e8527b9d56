"""What Claude Code's own files say about a session: did it receive a prompt, is it still running.

The CLI writes each session as JSON lines under <config>/projects/<cwd slug>/<session id>.jsonl
(config is $CLAUDE_CONFIG_DIR, else $HOME/.claude); a prompt sent with a uuid is recorded as a
"user" line with that uuid. It buffers these writes briefly, and a CLI left running by a crashed
relay goes on with its turn, so a prompt missing from the transcript is only known to be missed
once no CLI of the session runs any more (<config>/sessions/<pid>.json names each live one).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

SLACK_SECONDS = 60.0  # clock and file-time tolerance when a new session's file is looked for


def config_dir(env: Mapping[str, str]) -> Path:
    """Where the CLI keeps its files for this environment."""
    configured = env.get("CLAUDE_CONFIG_DIR")
    return Path(configured or Path(env.get("HOME", "~")) / ".claude").expanduser()


def holds_prompt(path: Path, prompt_id: str) -> bool:
    """Whether a transcript records a user message with this uuid."""
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if prompt_id not in line:
                continue  # most lines: no JSON parsing
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("type") == "user" and record.get("uuid") == prompt_id:
                    return True
    return False


@dataclass(frozen=True)
class LiveSession:
    """A CLI process that says it runs a session."""

    pid: int
    session_id: str | None
    cwd: str | None


def _left_running(pid: int, started: object = None) -> bool:
    """Whether a process runs (a zombie does not) and is not one this process started.

    started: the CLI's `procStart`, its process's start time (/proc/<pid>/stat, field 22): a
    process of that pid started at another time is another one (a killed CLI leaves its
    record, and after a while, or a reboot, its pid is some other program's).
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if isinstance(started, str) and started.isdigit() and started != fields[19]:
        return False
    # This relay's own agents (other conversations in the same cwd) take no cut prompt.
    return fields[0] not in ("Z", "X") and int(fields[1]) != os.getpid()


def live_sessions(config: Path) -> Iterator[LiveSession]:
    """The CLI processes of this config that still run, other than this process's children."""
    for path in config.glob("sessions/*.json"):
        try:
            record = json.loads(path.read_text())
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid > 0 and _left_running(pid, record.get("procStart")):
            yield LiveSession(pid, record.get("sessionId"), record.get("cwd"))


def prompt_received(
    env: Mapping[str, str], cwd: Path, session_id: str | None, prompt_id: str, since: float
) -> bool | None:
    """True when the session recorded the prompt, False when no CLI did or will, else None.

    session_id is None before the CLI named its session: every transcript written since
    `since` (a Unix time before the prompt was sent) is searched then.
    """
    try:
        config = config_dir(env)
        projects = config / "projects"
        if session_id:
            candidates = list(projects.glob(f"*/{session_id}.jsonl"))
        else:
            candidates = [
                path
                for path in projects.glob("*/*.jsonl")
                if path.stat().st_mtime >= since - SLACK_SECONDS
            ]
        if any(holds_prompt(path, prompt_id) for path in candidates):
            return True
        for live in live_sessions(config):
            # It may still read the prompt, or not have written it yet.
            if (session_id and live.session_id == session_id) or (
                not session_id and live.cwd == str(cwd)
            ):
                return None
    except OSError:
        return None
    return False


SLUG_LIMIT = 200  # the CLI cuts a longer directory name there and appends a hash


def project_slug(cwd: str) -> str:
    """The start of the directory name the CLI files a cwd's sessions under (up to the hash).

    The CLI replaces every character but ASCII letters and digits with "-" (one per UTF-16
    code unit: a character beyond the BMP becomes two) and cuts the name at 200 characters.
    """
    slug = "".join(
        ch if ch.isascii() and ch.isalnum() else "-" * (2 if ord(ch) > 0xFFFF else 1) for ch in cwd
    )
    return slug[:SLUG_LIMIT]


def bounded_lines(
    path: Path, *, start: int = 0, stop: int | None = None, limit: int
) -> Iterator[bytes | None]:
    """Each line of a file from byte `start` (a partial first line dropped) until `stop` bytes.

    A line longer than `limit` bytes yields None and is never held in memory whole. With
    `stop`, at most the line it falls in is read past it, even of a file that grows meanwhile
    (a longer one is skipped only up to `stop`).
    """
    with path.open("rb") as file:
        read = 0
        if start > 0:
            file.seek(start - 1)
            if file.read(1) != b"\n":
                read = _skip_line(file, stop)
        while stop is None or read < stop:
            line = file.readline(limit + 1)
            if not line:
                return
            read += len(line)
            if len(line) > limit and not line.endswith(b"\n"):
                read += _skip_line(file, None if stop is None else stop - read)
                yield None
                continue
            yield line


def _skip_line(file: BinaryIO, most: int | None = None) -> int:
    """Read to the end of the current line, or `most` bytes; the bytes read."""
    skipped = 0
    while most is None or skipped < most:
        chunk = file.readline(1 << 20 if most is None else min(1 << 20, most - skipped))
        if not chunk:
            break
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _message_text(message: object) -> str | None:
    """The text of a transcript message: a string, or its text blocks joined."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        return "\n\n".join(t for t in texts if isinstance(t, str)) or None
    return None


def _anchor(record: dict[str, object]) -> str | None:
    """The uuid a compact_boundary record names for the summary message (absent when none kept)."""
    meta = record.get("compactMetadata")
    if not isinstance(meta, dict):
        return None
    for key in ("preservedSegment", "preservedMessages"):
        part = meta.get(key)
        if isinstance(part, dict) and isinstance(part.get("anchorUuid"), str):
            return str(part["anchorUuid"])
    return None


def summary_after(lines: Iterator[str], boundary_id: str) -> str | None:
    """The summary message the CLI wrote after the compact_boundary record boundary_id.

    That is the "user" record marked isCompactSummary whose uuid the boundary names as its
    anchor or, when it names none, whose parentUuid chain leads back to the boundary. None
    when the transcript holds no such record (yet): nothing is guessed from the text.
    """
    watch: SummaryWatch | None = None  # once the boundary is found
    for line in lines:
        if watch is None and boundary_id not in line:
            continue  # most lines before it: no JSON parsing
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if watch is None:
            if record.get("subtype") == "compact_boundary" and record.get("uuid") == boundary_id:
                watch = SummaryWatch(record)
            continue
        if record.get("subtype") == "compact_boundary":
            return None  # the next compaction: this one's summary was not written
        if watch.is_summary(record):
            return _message_text(record.get("message")) or None
    return None


class SummaryWatch:
    """Told the records after a compact_boundary one by one, knows its summary message: the
    isCompactSummary "user" record the boundary names as its anchor or, when it names none,
    whose parentUuid chain leads back to the boundary."""

    def __init__(self, boundary: dict[str, Any]) -> None:
        uuid = boundary.get("uuid")
        self.chain: set[str] = {uuid} if isinstance(uuid, str) else set()
        self.anchor = _anchor(boundary)

    def is_summary(self, record: dict[str, Any]) -> bool:
        """Whether this record is the summary (else it joins the chain if it descends)."""
        uuid, parent = record.get("uuid"), record.get("parentUuid")
        child = isinstance(parent, str) and parent in self.chain
        summary = record.get("type") == "user" and record.get("isCompactSummary") is True
        if summary and ((uuid == self.anchor) if self.anchor else child):
            return True
        if isinstance(uuid, str) and child:
            self.chain.add(uuid)
        return False


def message_text(record: dict[str, Any]) -> str | None:
    """The text of a record's message (its text blocks joined), if it has any."""
    return _message_text(record.get("message"))


COST_STATE = b'"cost-state"'  # the type of the CLI's record of its cost counters, written at exit
COST_LINE_LIMIT = 1 << 16  # a cost-state record is a few hundred bytes


def restored_cost(env: Mapping[str, str], session_id: str) -> float:
    """The cost (USD) a CLI resuming this session starts its counter from.

    A CLI reports each turn's total_cost_usd as its session's cost so far: on exit it writes
    a "cost-state" record, and a CLI resuming the session starts from the last one (measured:
    three turns of $0.0042, exit, then one more: $0.0168; after a kill -9, no record is written
    and the next CLI starts from the one before). 0.0 without one.
    """
    found = 0.0
    for path in (config_dir(env) / "projects").glob(f"*/{session_id}.jsonl"):
        for line in bounded_lines(path, limit=COST_LINE_LIMIT):
            if line is None or COST_STATE not in line:
                continue
            with contextlib.suppress(ValueError, TypeError):
                record = json.loads(line)
                if record.get("type") == "cost-state":
                    found = float(record["totalCostUSD"])
    return found


def compaction_summary(env: Mapping[str, str], session_id: str, boundary_id: str) -> str | None:
    """The agent's summary of the compaction boundary_id, read from the session's transcript."""
    for path in (config_dir(env) / "projects").glob(f"*/{session_id}.jsonl"):
        with path.open(encoding="utf-8", errors="replace") as lines:
            found = summary_after(lines, boundary_id)
        if found is not None:
            return found
    return None
