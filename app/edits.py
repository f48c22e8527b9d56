"""What an edit or write tool call will change, as a unified diff to show in the timeline."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

MAX_LINES = 400  # lines of diff kept per call: a huge write shows its start and a count
# tool name → (path key, old text key, new text key); an empty old key means a whole-file write
EDIT_TOOLS: dict[str, tuple[str, str, str]] = {
    "Edit": ("file_path", "old_string", "new_string"),
    "MultiEdit": ("file_path", "", ""),  # its "edits" list of old_string/new_string pairs
    "Write": ("file_path", "", "content"),
    "edit": ("path", "old_str", "new_str"),
    "str_replace_editor": ("path", "old_str", "new_str"),
    "create": ("path", "", "file_text"),
}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _diff(old: str, new: str) -> list[str]:
    """The changed lines with 3 lines of context, without the ---/+++ header."""
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=3)
    # The hunks' line numbers count from the snippet, not the file: only the break is kept.
    return [
        "@@" if line.startswith("@@") else line for line in lines if line[:3] not in ("---", "+++")
    ]


def written_path(name: str, tool_input: Any) -> str | None:
    """The path a whole-file write (Write, create) would replace, or None for other calls."""
    if name not in EDIT_TOOLS or not isinstance(tool_input, Mapping):
        return None
    path_key, old_key, _new_key = EDIT_TOOLS[name]
    if name == "str_replace_editor":
        whole = tool_input.get("command") == "create"
    else:
        whole = not old_key and name != "MultiEdit"
    return (_text(tool_input.get(path_key)) or None) if whole else None


def edit_change(
    name: str, tool_input: Any, existing: tuple[bool, str | None] = (False, None)
) -> dict[str, Any] | None:
    """The file and diff an edit/write call makes; None for other tools or unusable input.

    existing: for a whole-file write, whether the file is there and its text now (None when
    it cannot be shown: too big, binary): then the kind is "overwrite", diffed when it can be.
    """
    if name not in EDIT_TOOLS or not isinstance(tool_input, Mapping):
        return None
    path_key, old_key, new_key = EDIT_TOOLS[name]
    path = _text(tool_input.get(path_key))
    if name == "str_replace_editor" and tool_input.get("command") == "create":
        old_key, new_key = "", "file_text"
    elif name == "str_replace_editor" and tool_input.get("command") != "str_replace":
        return None  # view, insert, undo: nothing to show as a diff
    lines: list[str] = []
    if name == "MultiEdit":
        edits = tool_input.get("edits")
        for edit in edits if isinstance(edits, list) else []:
            if isinstance(edit, Mapping):
                lines += _diff(_text(edit.get("old_string")), _text(edit.get("new_string")))
    elif old_key:
        lines = _diff(_text(tool_input.get(old_key)), _text(tool_input.get(new_key)))
    elif existing[1] is not None:  # the file's lines now against the new ones
        lines = _diff(existing[1], _text(tool_input.get(new_key)))
    else:
        lines = ["+" + line for line in _text(tool_input.get(new_key)).splitlines()]
    if not path and not lines:
        return None
    more = max(0, len(lines) - MAX_LINES)
    whole = "overwrite" if existing[0] else "write"
    return {
        "file": path,
        "kind": "edit" if old_key or name == "MultiEdit" else whole,
        "diff": lines[:MAX_LINES],
        "more": more,
    }
