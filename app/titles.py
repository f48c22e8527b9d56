"""The title a conversation gets when `/compact` moves it into a new one: pure, no I/O."""

from __future__ import annotations

import re

TITLE_LIMIT = 200  # the API's own limit on a title (models.ConversationCreate)
_COMPACTED = re.compile(r"^(?P<base>.*) \(compacted(?: ×(?P<count>\d+))?\)$", re.DOTALL)


def compacted_title(title: str, limit: int = TITLE_LIMIT) -> str:
    """The successor's title: `T (compacted)`, then `T (compacted ×2)`, `×3`…, within limit."""
    found = _COMPACTED.match(title)
    base, count = title, 1
    if found is not None:
        base = found["base"]
        count = int(found["count"] or 1) + 1
    suffix = " (compacted)" if count == 1 else f" (compacted ×{count})"
    room = limit - len(suffix)
    if len(base) > room:  # cut the old title, never the count
        base = base[: room - 1].rstrip() + "…"
    return base + suffix
