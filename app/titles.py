"""The title a conversation gets when `/compact` moves it into a new one: pure, no I/O."""

from __future__ import annotations

import re

from app.unicode_text import isolate

TITLE_LIMIT = 200  # the API's own limit on a title (models.ConversationCreate)
_COMPACTED = re.compile(r"^(?P<base>.*) \(compacted(?: ×(?P<count>\d+))?\)$", re.DOTALL)


def compacted_from(title: str, base: str) -> bool:
    """True when title is base, or base compacted (`base (compacted)`, `base (compacted ×2)`…)."""
    found = _COMPACTED.match(title)
    return title == base or (found is not None and found["base"] == base)


def compacted_title(title: str, limit: int = TITLE_LIMIT) -> str:
    """The successor's title: `T (compacted)`, then `T (compacted ×2)`, `×3`…, within limit."""
    found = _COMPACTED.match(title)
    base, count = title, 1
    if found is not None:
        base = found["base"]
        count = int(found["count"] or 1) + 1
    suffix = " (compacted)" if count == 1 else f" (compacted ×{count})"
    # A title with right-to-left text is isolated (FSI…PDI), so that an override in it does not
    # reverse the suffix; once isolated, it stays so (unwrapped here, wrapped again below).
    if base.startswith("\u2068") and base.endswith("\u2069"):
        base = base[1:-1]
    room = limit - len(suffix) - (len(isolate(base)) - len(base))
    if len(base) > room:  # cut the old title, never the count
        base = base[: room - 1].rstrip() + "…"
    return isolate(base) + suffix
