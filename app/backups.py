"""Backups at thresholds (SPEC §6): when to write one, its file name, its Markdown. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from app.summary import BACKUP_HEADER, NEW_REQUEST, cut_line, one_line
from app.window import COMPACT_BUFFER

FIRST_TOKENS = 50_000
TOKENS_STEP = 10_000
FREE_THRESHOLDS = (30, 15, 5)  # free-until-compaction %, crossed below
PRECOMPACT_AUTO = "precompact_auto"
PRECOMPACT_MANUAL = "precompact_manual"
KEY_REPLIES = 10
NONE_ITEM = "- (none)"
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
NAME = re.compile(
    r"^(?P<n>[1-9]\d{0,8})-backup-\d{1,2}(?:st|nd|rd|th)-[A-Z][a-z]{2}-\d{4}-\d{1,2}-\d{2}[ap]m\.md$"
)
# A command the user typed alone (/context, /cost, /compact, /handoff): left out of User Requests.
# With words after it, it carries a request: "/compact keep the parser notes" is text (SPEC §2),
# "/tmp is full, please …" goes to the model as text (the CLI runs only the commands it knows),
# and a project's "/review the parser" says what was asked.
COMMAND = re.compile(r"^/[A-Za-z][\w:.-]*$")
# Tools that change files, and the input key naming the file (Claude Code, then the SDK engine).
FILE_TOOLS: dict[str, tuple[str, ...]] = {
    "Edit": ("file_path",),
    "Write": ("file_path",),
    "MultiEdit": ("file_path",),
    "NotebookEdit": ("notebook_path",),
    "create": ("path",),
    "edit": ("path",),
    "str_replace_editor": ("path",),
}
HEADER_FIELD = re.compile(r"^\*\*(?P<key>[A-Za-z ]+):\*\* (?P<value>.*)$")


@dataclass(frozen=True)
class Rails:
    """What the two rails remember since the last compaction."""

    last_used: int | None = None  # `used` of the last threshold backup
    tokens_started: bool = False  # tokens_50k was written
    crossed: frozenset[int] = field(default_factory=frozenset)  # free thresholds passed

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "last_used": self.last_used,
            "tokens_started": self.tokens_started,
            "crossed": sorted(self.crossed, reverse=True),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rails:
        """Read the JSON form back; anything unexpected gives fresh rails."""
        last = data.get("last_used")
        crossed = data.get("crossed") or []
        if (last is not None and type(last) is not int) or not isinstance(crossed, list):
            return cls()
        return cls(
            last_used=last,
            tokens_started=data.get("tokens_started") is True,
            crossed=frozenset(t for t in crossed if t in FREE_THRESHOLDS),
        )


def free_percent(used: int, window: int) -> float:
    """Free until compaction, in % of the window: the 33k buffer is not free."""
    return max(0.0, 100 * (window - used) / window - 100 * COMPACT_BUFFER / window)


def decide(used: int, window: int | None, rails: Rails) -> tuple[str | None, Rails]:
    """The trigger a new context figure fires (None: no backup) and the rails after it."""
    fired: list[str] = []
    if not rails.tokens_started:
        if used >= FIRST_TOKENS:
            fired.append("tokens_50k")
    elif rails.last_used is not None and used >= rails.last_used + TOKENS_STEP:
        fired.append(f"tokens_{used // TOKENS_STEP * TOKENS_STEP // 1000}k_update")
    below: set[int] = set()
    if window:
        free = free_percent(used, window)
        below = {t for t in FREE_THRESHOLDS if free < t}
        fired += [f"free_{t}pct" for t in FREE_THRESHOLDS if t in below - rails.crossed]
    if not fired:
        return None, rails
    after = replace(
        rails,
        last_used=used,
        tokens_started=rails.tokens_started or fired[0] == "tokens_50k",
        crossed=rails.crossed | below,
    )
    return fired[0], after


def ordinal(day: int) -> str:
    """1 → 1st, 2 → 2nd, 11 → 11th, 22 → 22nd."""
    if 10 <= day % 100 <= 20:
        return f"{day}th"
    return f"{day}{({1: 'st', 2: 'nd', 3: 'rd'}).get(day % 10, 'th')}"


def file_name(n: int, when: datetime) -> str:
    """The n-th backup's file name at a local time: 3-backup-18th-Feb-2026-2-15pm.md."""
    hour = when.hour % 12 or 12
    half = "am" if when.hour < 12 else "pm"
    month = MONTHS[when.month - 1]
    return f"{n}-backup-{ordinal(when.day)}-{month}-{when.year}-{hour}-{when.minute:02d}{half}.md"


def number_of(name: str) -> int | None:
    """The n of a backup file name, or None when the name is not a backup's."""
    match = NAME.match(name)
    return int(match["n"]) if match else None


def remaining_text(used: int | None, window: int | None) -> str:
    """Context remaining, one decimal: 100 × (window − used) / window, or — when unknown.

    Never below 0.0% (as the seed's remaining_percentage): a window set below what is used
    (the conversation compacts on its next message) read "-50.0%".
    """
    if used is None or not window:
        return "—"
    return f"{max(0.0, 100 * (window - used) / window):.1f}%"


def iso_utc(moment: datetime) -> str:
    """UTC ISO 8601 with milliseconds and Z: 2026-01-26T17:45:00.000Z."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def tool_facts(name: str, tool_input: Any) -> dict[str, Any]:
    """What a backup needs to remember of a tool call (a file, tasks, a skill); {} if nothing."""
    if not isinstance(tool_input, Mapping):
        return {}
    if name in FILE_TOOLS:
        if name == "str_replace_editor" and tool_input.get("command") == "view":
            return {}
        for key in FILE_TOOLS[name]:
            if path := _text(tool_input.get(key)):
                return {"file": path}
        return {}
    if name == "TodoWrite" and isinstance(todos := tool_input.get("todos"), list):
        pairs = [
            [content, str(todo.get("status") or "")]
            for todo in todos
            if isinstance(todo, Mapping) and (content := _text(todo.get("content")))
        ]
        return {"todos": pairs}
    if name == "TaskCreate" and (subject := _text(tool_input.get("subject"))):
        return {"task": subject}
    if name == "TaskUpdate" and (task_id := _text(str(tool_input.get("taskId") or ""))):
        status = _text(tool_input.get("status"))
        return {"task_id": task_id, "task_status": status} if status else {}
    if name in ("Skill", "skill"):
        for key in ("skill", "command", "name"):
            if skill := _text(tool_input.get(key)):
                return {"skill": skill}
    return {}


@dataclass(frozen=True)
class Item:
    """One timeline entry as a backup sees it."""

    kind: str  # user | agent | activity | line
    text: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Source:
    """Everything a backup is written from."""

    title: str
    conversation_id: int
    session_id: str | None
    trigger: str
    used: int | None
    window: int | None
    generated: datetime
    items: Sequence[Item]


def is_request(text: str) -> bool:
    """A user message worth keeping: not one character, not a command."""
    line = one_line(text)
    return len(line) > 1 and not COMMAND.match(line)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return one_line(line)
    return ""


def _bullets(lines: Iterable[str]) -> list[str]:
    found = [f"- {line}" for line in lines]
    return found or [NONE_ITEM]


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _succeeded(item: Item) -> bool:
    """A tool call whose result came back without an error: a denied or failed Write changed
    no file, a failed TodoWrite created no task (a call still running is not counted yet)."""
    return item.data.get("is_error") is False


def render(source: Source) -> str:
    """The backup's Markdown (SPEC §6), from a conversation's timeline."""
    requests: list[str] = []
    files: list[str] = []
    created: list[str] = []
    todos_done = 0
    tasks_done: set[str] = set()
    skills: list[str] = []
    replies: list[str] = []
    for item in source.items:
        if item.kind == "user" and is_request(item.text):
            requests.append(cut_line(one_line(item.text)))
        elif item.kind == "agent" and len(line := _first_line(item.text)) > 1:
            replies.append(cut_line(line))
        elif (
            item.kind == "activity"
            and _succeeded(item)
            and isinstance(facts := item.data.get("backup"), Mapping)
        ):
            if file := _text(facts.get("file")):
                files.append(cut_line(one_line(file)))
            if task := _text(facts.get("task")):
                created.append(task)
            if isinstance(todos := facts.get("todos"), list):
                created += [str(pair[0]) for pair in todos if pair]
                todos_done = sum(1 for pair in todos if len(pair) > 1 and pair[1] == "completed")
            if facts.get("task_status") == "completed":
                tasks_done.add(str(facts.get("task_id")))
            if skill := _text(facts.get("skill")):
                skills.append(cut_line(one_line(skill)))
    done = todos_done + len(tasks_done)
    lines = [
        "# Session Backup",
        "",
        f"**Conversation:** {one_line(source.title)} (#{source.conversation_id})",
        f"**Session ID:** {source.session_id or '—'}",
        f"**Trigger:** {source.trigger}",
        f"**Context Remaining:** {remaining_text(source.used, source.window)}",
        f"**Generated:** {iso_utc(source.generated)}",
        "",
        "## User Requests",
        "",
        *_bullets(requests),
        "",
        "## Files Modified",
        "",
        *_bullets(_unique(files)),
        "",
        "## Tasks",
        "",
        "### Created",
        "",
        *([f"- **{cut_line(one_line(t))}**" for t in _unique(created)] or [NONE_ITEM]),
        "",
        "### Completed",
        "",
        f"- {done} tasks completed" if done else NONE_ITEM,
        "",
        "## Skills Loaded",
        "",
        *_bullets(_unique(skills)),
        "",
        "## Key Replies",
        "",
        *_bullets(replies[-KEY_REPLIES:]),
    ]
    return "\n".join(lines) + "\n"


def header(markdown: str) -> dict[str, str]:
    """The **Key:** value fields at the top of a backup."""
    fields: dict[str, str] = {}
    for line in markdown.splitlines()[:12]:
        if match := HEADER_FIELD.match(line):
            fields[match["key"]] = match["value"]
    return fields


def carry_over(name: str, markdown: str) -> str:
    """The pending carry-over of a conversation started fresh from a backup."""
    return f"{BACKUP_HEADER} {name}]\n{markdown.rstrip(chr(10))}"


def first_message(name: str, markdown: str, text: str) -> str:
    """What the agent receives first in a conversation started fresh from a backup."""
    return f"{carry_over(name, markdown)}\n\n{NEW_REQUEST}\n{text}"
