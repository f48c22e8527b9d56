"""The carry-over summary that `/compact` puts in front of the next first message."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

NEW_REQUEST = "[New user request]"
HEADER = "[Carry-over context from previous compacted conversation]"
BACKUP_HEADER = "[Carry-over context from backup"  # + " <file name>]": a fresh start (SPEC §6)
SUMMARY_WINDOW = 24
SUMMARY_MESSAGES = 16
LINE_LIMIT = 260
SUMMARY_LIMIT = 3_500
NO_TEXT_LINE = "(The previous conversation had no text messages.)"
_LABELS = {"user": "User", "agent": "Agent"}


@dataclass(frozen=True)
class SummaryMessage:
    """One message of the old conversation: its role and its text blocks only."""

    role: Literal["user", "agent"]
    text: str


def one_line(text: str) -> str:
    """Collapse every whitespace run, newlines included, into one space and trim."""
    return " ".join(text.split())


def cut_line(text: str) -> str:
    """Cut a one-line text to 260 code points, the last one being "…" when cut."""
    if len(text) <= LINE_LIMIT:
        return text
    return text[: LINE_LIMIT - 1] + "…"


def build_summary(title: str, messages: Sequence[SummaryMessage]) -> str:
    """Build the deterministic carry-over summary of a conversation."""
    # Titles are single-line in the app; collapsing here too keeps the first line a single line.
    lines = [f"Conversation: {one_line(title)}"]
    chosen = list(messages)[-SUMMARY_WINDOW:][:SUMMARY_MESSAGES]
    for message in chosen:
        text = one_line(message.text)
        if text:
            lines.append(f"{_LABELS[message.role]}: {cut_line(text)}")
    if len(lines) == 1:
        lines.append(NO_TEXT_LINE)
    return "\n".join(lines)[:SUMMARY_LIMIT]


def compose_first_message(summary: str, text: str) -> str:
    """Put the summary in front of the first message sent in the new conversation."""
    if summary.startswith(BACKUP_HEADER):  # a backup's carry-over holds its own header line
        return f"{summary}\n\n{NEW_REQUEST}\n{text}"
    return f"{HEADER}\n{summary}\n\n{NEW_REQUEST}\n{text}"
