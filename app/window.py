"""The auto-compact window of claude/deepseek conversations: notches, parsing, source."""

import math
import re
from dataclasses import dataclass
from typing import Literal

from app.tokens import format_tokens

NOTCHES: tuple[int | None, ...] = (None, 100_000, 200_000, 300_000, 500_000, 700_000, 1_000_000)
MIN_WINDOW = 100_000
COMPACT_BUFFER = 33_000
ENGINE_COMPACT_FRACTION = 0.80  # the SDK engine compacts in the background at 80% of the window
ENV_VAR = "CLAUDE_CODE_AUTO_COMPACT_WINDOW"
COMPACT_WARNING = "The conversation will be compacted on the next message."
SEPARATOR = " · "
_SUFFIXES = {"k": 1_000, "m": 1_000_000}
_SUFFIXED = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([km])", re.IGNORECASE)
_BARE = re.compile(r"\d+")
_SOURCE_TEXTS = {
    "setting": "your setting",
    "model": "model default",
    "env": f"from {ENV_VAR}",
}


@dataclass(frozen=True)
class ResolvedWindow:
    """The window in force for a conversation and where it comes from."""

    window: int
    source: Literal["setting", "env", "model"]
    capped: bool
    threshold: int


def parse_env_window(value: str | None) -> int | None:
    """Read CLAUDE_CODE_AUTO_COMPACT_WINDOW as Claude Code does; None when it is unusable."""
    if value is None:
        return None
    text = value.strip()
    # A bare number is tokens (the "200 means 200k" shorthand is only for --autocompact).
    if _BARE.fullmatch(text):
        tokens = int(text)
    elif match := _SUFFIXED.fullmatch(text):
        # Math.round in Claude Code rounds halves up, unlike Python's round().
        tokens = math.floor(float(match.group(1)) * _SUFFIXES[match.group(2).lower()] + 0.5)
    else:
        return None
    if tokens < 1:
        return None
    # Claude Code treats values under the minimum as the minimum, without a warning.
    return max(tokens, MIN_WINDOW)


def window_label(window: int | None) -> str:
    """Name a window as the slider does: "Auto", "100k", "1M"."""
    return "Auto" if window is None else format_tokens(window)


def resolve_window(setting: int | None, env_value: str | None, model_window: int) -> ResolvedWindow:
    """Pick the window in force: the setting, else the environment, else the model's own."""
    env_window = parse_env_window(env_value)
    chosen: int
    source: Literal["setting", "env", "model"]
    if setting is not None:
        chosen, source = setting, "setting"
    elif env_window is not None:
        chosen, source = env_window, "env"
    else:
        chosen, source = model_window, "model"
    window = min(chosen, model_window)
    return ResolvedWindow(
        window=window,
        source=source,
        capped=chosen > model_window,
        threshold=window - COMPACT_BUFFER,
    )


def engine_window(model_window: int) -> ResolvedWindow:
    """The window of a provider without the setting (the SDK engine): the model's own, compacted
    at 80% of it; CLAUDE_CODE_AUTO_COMPACT_WINDOW is Claude Code's and does not apply."""
    return ResolvedWindow(
        window=model_window,
        source="model",
        capped=False,
        threshold=int(model_window * ENGINE_COMPACT_FRACTION),
    )


def source_text(resolved: ResolvedWindow) -> str:
    """Say where the window in force comes from."""
    return _SOURCE_TEXTS[resolved.source]


def window_line(resolved: ResolvedWindow | None) -> str:
    """Write the line under the slider; empty before the conversation's first turn."""
    if resolved is None:
        return ""
    parts = [format_tokens(resolved.window), source_text(resolved)]
    if resolved.capped:
        parts.append(f"capped to {format_tokens(resolved.window)} by the model")
    return SEPARATOR.join(parts)


def apply_note(*, turn_running: bool, background_work: bool, has_session: bool = True) -> str:
    """Say when a change of window applies."""
    if turn_running:
        return "Applies after the current turn."
    if background_work:
        return "Applies when background work has finished."
    if not has_session:  # the first message starts the session with it: nothing restarts
        return "Applies on the next message."
    return "Applies on the next message (the session restarts once)."


def will_compact(used: int | None, threshold: int) -> bool:
    """Tell whether the context already used reaches the compaction threshold."""
    return used is not None and used >= threshold


def free_until_compaction(used: int | None, threshold: int) -> int | None:
    """Count the tokens left before auto-compaction, never below zero."""
    return None if used is None else max(threshold - used, 0)


def restart_line(old: int | None, new: int | None) -> str:
    """Write the timeline line for a restart that applies a new window."""
    return (
        "Restarted the session to apply the compaction window "
        f"({window_label(old)} → {window_label(new)})"
    )


def validate_setting(value: int | None) -> int | None:
    """Return a conversation's window setting when it is one of the notches."""
    # type() rather than isinstance(): True and 100000.0 compare equal to notches but are not ints.
    if value is not None and (type(value) is not int or value not in NOTCHES):
        raise ValueError(
            "auto_compact_window must be one of: null, 100000, 200000, 300000, 500000, "
            "700000, 1000000"
        )
    return value
