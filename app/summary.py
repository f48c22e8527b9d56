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
PINNED_LINE = "Pinned:"  # SPEC §8: right after the title line, each pin as "- <one line>"
_LABELS = {"user": "User", "agent": "Agent"}


@dataclass(frozen=True)
class SummaryMessage:
    """One message of the old conversation: its role, its text blocks only, whether pinned.

    A pinned message among the chosen 16 keeps its place but adds no line there: it is
    shown once, under `Pinned:`.
    """

    role: Literal["user", "agent"]
    text: str
    pinned: bool = False


def one_line(text: str) -> str:
    """Collapse every whitespace run, newlines included, into one space and trim."""
    return " ".join(text.split())


def cut_line(text: str) -> str:
    """Cut a one-line text to 260 code points, the last one being "…" when cut."""
    if len(text) <= LINE_LIMIT:
        return text
    return text[: LINE_LIMIT - 1] + "…"


def pin_lines(pins: Sequence[str]) -> list[str]:
    """The `Pinned:` block: one `- <one line>` per pin with text (cut as §2 cuts a message)."""
    texts = [cut_line(one_line(pin)) for pin in pins]
    items = [f"- {text}" for text in texts if text]
    return [PINNED_LINE, *items] if items else []


def build_summary(title: str, messages: Sequence[SummaryMessage], pins: Sequence[str] = ()) -> str:
    """Build the deterministic carry-over summary of a conversation (pins first, SPEC §8)."""
    # Titles are single-line in the app; collapsing here too keeps the first line a single line.
    lines = [f"Conversation: {one_line(title)}", *pin_lines(pins)]
    chosen = list(messages)[-SUMMARY_WINDOW:][:SUMMARY_MESSAGES]
    for message in chosen:
        text = one_line(message.text)
        if text and not message.pinned:
            lines.append(f"{_LABELS[message.role]}: {cut_line(text)}")
    if len(lines) == 1:
        lines.append(NO_TEXT_LINE)
    return "\n".join(lines)[:SUMMARY_LIMIT]


def with_pins(carry: str, pins: Sequence[str]) -> str:
    """Put the `Pinned:` block after a carry-over's first line (/clear, a backup's fresh start).

    The block is cut to 3,500 characters; the rest of the carry-over is kept whole.
    """
    block = "\n".join(pin_lines(pins))[:SUMMARY_LIMIT]
    if not block:
        return carry
    first, newline, rest = carry.partition("\n")
    return f"{first}\n{block}{newline}{rest}"


def left_out(total: int) -> tuple[int, int]:
    """How many of `total` messages §2 leaves out: (the newest ones, the older ones)."""
    window = min(total, SUMMARY_WINDOW)
    return max(0, window - SUMMARY_MESSAGES), total - window


def left_out_text(newest: int, older: int, *, whole: bool = False) -> str:
    """Say what a carry-over leaves out ("Left out: the 8 newest messages and 37 older ones.")."""
    if whole:  # /clear and a backup's fresh start carry none of the messages themselves
        if not older:
            return "Nothing is left out."
        return "Left out: 1 message." if older == 1 else f"Left out: all {older:,} messages."
    if not newest and not older:
        return "Nothing is left out."
    parts = []
    if newest:
        parts.append("the newest message" if newest == 1 else f"the {newest:,} newest messages")
    if older:
        noun = ("older one" if older == 1 else "older ones") if newest else "older messages"
        if not newest and older == 1:
            noun = "older message"
        parts.append(f"{older:,} {noun}")
    return f"Left out: {' and '.join(parts)}."


def cut_carry(text: str) -> str:
    """An edited carry-over as stored: cut to 3,500 characters, like a built one."""
    return text[:SUMMARY_LIMIT]


def compose_first_message(summary: str, text: str) -> str:
    """Put the summary in front of the first message sent in the new conversation."""
    if summary.startswith(BACKUP_HEADER):  # a backup's carry-over holds its own header line
        return f"{summary}\n\n{NEW_REQUEST}\n{text}"
    return f"{HEADER}\n{summary}\n\n{NEW_REQUEST}\n{text}"
