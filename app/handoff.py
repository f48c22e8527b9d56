"""The context watch and the handoff (SPEC §7): the notes, the carry-over, the tool's arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.models import Handoff
from app.summary import NEW_REQUEST, compose_first_message
from app.tokens import format_tokens
from app.unicode_text import has_visible_character

HANDOFF_LIMIT = 9_000  # characters of done + next + files, all together
HANDOFF_HEADER = "[Handoff from the previous session]"
HANDOFF_COMMAND = "/handoff"
CLEAR_COMMAND = "/clear"
HANDOFF_REQUEST = (
    "Save a handoff now with the save_handoff tool: what is done, what is next, "
    "the file paths and function names involved."
)
NOTE_PREFIX = "[Context watch]"
TOO_LONG = (
    "The handoff is {length} characters long; the limit is 9,000 for done, next and files "
    "together. Write a shorter one (keep the file paths and function names)."
)


@dataclass(frozen=True)
class HandoffText:
    """What a handoff holds: what is done, what is next, the files and functions involved."""

    done: str
    next: str
    files: tuple[str, ...]


def context_note(used: int | None, soft: int, hard: int) -> str | None:
    """The [Context watch] paragraph for a context of `used` tokens, or None below soft."""
    if used is None or used < soft:
        return None
    if used >= hard:
        return (
            f"{NOTE_PREFIX} The context is at {format_tokens(used)} tokens, past "
            f"{format_tokens(hard)}. Finish the current task, then save a handoff with the "
            "save_handoff tool (what is done, what is next, the file paths and function names "
            "involved) and ask the user to start fresh with /clear."
        )
    return (
        f"{NOTE_PREFIX} The context is at {format_tokens(used)} tokens. At a good stopping "
        "point, save a handoff with the save_handoff tool (what is done, what is next, the file "
        "paths and function names involved) and suggest that the user start fresh with /clear."
    )


def with_note(prompt: str, note: str | None) -> str:
    """The prompt with the note after the user's text and a blank line."""
    return prompt if note is None else f"{prompt}\n\n{note}"


def is_handoff_command(text: str) -> bool:
    """True when the whole message is the /handoff command."""
    return text.strip() == HANDOFF_COMMAND


def is_clear_command(text: str) -> bool:
    """True when the whole message is the /clear command."""
    return text.strip() == CLEAR_COMMAND


def handoff_length(handoff: HandoffText) -> int:
    """The characters a handoff counts against the limit (done, next and every file)."""
    return len(handoff.done) + len(handoff.next) + sum(len(f) for f in handoff.files)


def parse_handoff(arguments: dict[str, Any]) -> HandoffText:
    """Check save_handoff's arguments; ValueError with a message the agent can act on."""
    done, following, files = (
        arguments.get("done"),
        arguments.get("next"),
        arguments.get("files", []),
    )
    if not isinstance(done, str) or not isinstance(following, str):
        raise ValueError("save_handoff needs `done` and `next` as text.")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ValueError("save_handoff needs `files` as a list of paths and function names.")
    handoff = HandoffText(done.strip(), following.strip(), tuple(f.strip() for f in files))
    handoff = HandoffText(handoff.done, handoff.next, tuple(f for f in handoff.files if f))
    # (zero-width and other invisible characters alone are empty too: /clear would carry them)
    if not has_visible_character(handoff.done + handoff.next):
        raise ValueError("The handoff is empty: say what is done and what is next.")
    if (length := handoff_length(handoff)) > HANDOFF_LIMIT:
        raise ValueError(TOO_LONG.format(length=f"{length:,}"))
    return handoff


def handoff_text(row: Handoff) -> HandoffText:
    """A stored handoff as the text the carry-over is built from."""
    return HandoffText(row.done, row.next, tuple(str(f) for f in row.files))


def carry_over(handoff: HandoffText) -> str:
    """The handoff as the new conversation's carry-over block (header included)."""
    return (
        f"{HANDOFF_HEADER}\nDone: {handoff.done}\nNext: {handoff.next}\n"
        f"Files: {', '.join(handoff.files)}"
    )


def first_message(pending: str, text: str) -> str:
    """The first message of a new conversation: its pending carry-over, then the typed text."""
    if pending.startswith(HANDOFF_HEADER + "\n"):  # /clear stores the whole block
        return f"{pending}\n\n{NEW_REQUEST}\n{text}"
    return compose_first_message(pending, text)  # /compact stores the summary only


def saved_text(handoff: HandoffText) -> str:
    """What the tool answers the agent once the handoff is stored."""
    return f"Handoff saved ({handoff_length(handoff):,} characters). The user can /clear now."
