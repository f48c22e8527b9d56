"""What the 🧠 modal shows: context used, the window in force, and what a change would do."""

from __future__ import annotations

from typing import Any

from app.models import Conversation
from app.providers import WINDOW_PROVIDERS
from app.views import effective_window
from app.window import (
    COMPACT_WARNING,
    NOTCHES,
    apply_note,
    free_until_compaction,
    resolve_window,
    source_text,
    will_compact,
    window_label,
    window_line,
)


def _auto_window(conversation: Conversation, env_value: str | None) -> int | None:
    """The window Auto would give: the environment's, else the model's (a provider without the
    setting has only the model's)."""
    if conversation.model_window is None or conversation.provider not in WINDOW_PROVIDERS:
        return conversation.model_window
    return resolve_window(None, env_value, conversation.model_window).window


def context_view(
    conversation: Conversation,
    *,
    env_value: str | None,
    turn_running: bool,
    background_work: bool,
    agent_report: dict[str, Any] | None,
) -> dict[str, Any]:
    """The modal's data for one conversation."""
    used = conversation.context_tokens
    resolved = effective_window(conversation, env_value)
    threshold = resolved.threshold if resolved else None
    compacts = resolved is not None and will_compact(used, resolved.threshold)
    report = agent_report or {}
    return {
        "used": used,
        "model": conversation.model,
        "model_window": conversation.model_window,
        "setting": conversation.auto_compact_window,
        "setting_label": window_label(conversation.auto_compact_window),
        "window": resolved.window if resolved else None,
        # What Auto would give (the environment's window, else the model's): the slider's Auto
        # notch shows it while the conversation has a setting of its own.
        "auto_window": _auto_window(conversation, env_value),
        "threshold": threshold,
        "free": free_until_compaction(used, threshold) if threshold is not None else None,
        "source": resolved.source if resolved else None,
        "source_text": source_text(resolved) if resolved else "",
        "capped": resolved.capped if resolved else False,
        "line": window_line(resolved),
        "note": apply_note(
            turn_running=turn_running,
            background_work=background_work,
            has_session=conversation.session_id is not None,
        ),
        "will_compact": compacts,
        "warning": COMPACT_WARNING if compacts else None,
        "pending_restart": pending_restart(conversation),
        "supports_window": conversation.provider in WINDOW_PROVIDERS,
        "notches": list(NOTCHES),
        "categories": [
            {"name": c.get("name"), "tokens": c.get("tokens"), "kind": c.get("kind")}
            for c in report.get("categories") or []
        ]
        or None,
        "agent": {
            key: report[key]
            for key in ("maxTokens", "autocompactSource", "autoCompactThreshold")
            if key in report
        }
        or None,
    }


def pending_restart(conversation: Conversation) -> bool:
    """True when a changed window still has to reach a session that already exists."""
    return (
        conversation.session_id is not None
        and conversation.applied_window != conversation.auto_compact_window
    )
