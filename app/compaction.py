"""How an agent's own compaction reads in the timeline, per provider family.

Claude Code's compactions are full-width lines; the SDK engine's are activity
lines inside the turn (SPEC §3). The texts are fixed so tests can pin them.
"""

from __future__ import annotations

from typing import Literal

from app.tokens import format_tokens

SUMMARY_LIMIT = 100_000  # characters of an agent's compaction summary kept (a bound only)

Style = Literal["line", "activity"]  # which one a provider uses: providers.compaction_style


def started_text(style: Style) -> str:
    """The text while a compaction runs."""
    return "Compacting context…" if style == "line" else "Compacting the conversation context…"


def finished_text(
    style: Style,
    *,
    pre_tokens: int | None = None,
    post_tokens: int | None = None,
    messages_removed: int | None = None,
    tokens_removed: int | None = None,
) -> str:
    """The text of a compaction that succeeded, with the numbers the agent reported."""
    if style == "activity":
        if messages_removed is not None and tokens_removed is not None:
            return (
                f"Context compacted (removed {messages_removed} messages, "
                f"{format_tokens(tokens_removed)} tokens)"
            )
        return "Context compacted"
    if pre_tokens is not None and post_tokens is not None:
        return (
            f"Context compacted · {format_tokens(pre_tokens)} → {format_tokens(post_tokens)} tokens"
        )
    if pre_tokens is not None:
        return f"Context compacted · was {format_tokens(pre_tokens)} tokens"
    return "Context compacted"


def failed_text(style: Style, reason: str) -> str | None:
    """The text of a failed compaction; None when it leaves nothing (lines vanish)."""
    if style == "line":
        return None
    short = " ".join(reason.split())[:200] or "unknown reason"
    return f"Context compaction failed: {short}"


def clip_summary(text: str) -> str:
    """An agent's compaction summary as kept: at most SUMMARY_LIMIT characters, marked if cut."""
    if len(text) <= SUMMARY_LIMIT:
        return text
    return text[: SUMMARY_LIMIT - 1] + "…"
