"""How stored rows look to clients (HTTP responses and WebSocket events)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from app.models import Conversation, ConversationPublic, Entry, EntryPublic
from app.providers import WINDOW_PROVIDERS
from app.render import render_markdown, render_partial
from app.window import ENV_VAR, ResolvedWindow, engine_window, resolve_window


def utc_text(moment: datetime) -> str:
    """A time as every answer gives one: ISO 8601 in UTC ending in Z (pydantic's own form)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def entry_view(entry: Entry, text: str | None = None) -> dict[str, Any]:
    """An entry as JSON; text overrides the stored text (live streaming text)."""
    body = entry.text if text is None else text
    html = None
    if entry.kind == "agent":  # a streaming message is rendered as written so far
        html = render_partial(body) if entry.state == "streaming" else render_markdown(body)
    public = EntryPublic.model_validate(entry, update={"text": body, "html": html})
    return public.model_dump(mode="json")


def effective_window(conversation: Conversation, env_value: str | None) -> ResolvedWindow | None:
    """The auto-compact window in force for a conversation, once its model is known."""
    if conversation.model_window is None:
        return None
    if conversation.provider not in WINDOW_PROVIDERS:
        return engine_window(conversation.model_window)
    return resolve_window(conversation.auto_compact_window, env_value, conversation.model_window)


def conversation_view(conversation: Conversation) -> dict[str, Any]:
    """A conversation's fields as JSON (no timeline), with its effective window."""
    view = ConversationPublic.model_validate(conversation).model_dump(mode="json")
    resolved = effective_window(conversation, os.environ.get(ENV_VAR))
    view["window"] = resolved.window if resolved else None
    view["threshold"] = resolved.threshold if resolved else None
    view["running"] = conversation.turn_active  # the sidebar's running indicator
    return view
