"""The 422 answer's list of problems, made small and always sendable as JSON; and why valid
JSON could not be read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

MAX_PROBLEMS = 20  # problems listed; one request with 120,000 stray keys made a 12 MB answer


def listed_problems(errors: Sequence[Any], limit: int = MAX_PROBLEMS) -> list[Any]:
    """The first `limit` problems, then a last one saying how many were left out.

    Numbers JSON cannot hold (NaN, Infinity: Python's parser takes them, and a problem
    quotes its input) become their names as strings.
    """
    listed = [_finite(_worded(error)) for error in errors[:limit]]
    if len(errors) > limit:
        left = len(errors) - limit
        listed.append({"type": "more", "loc": [], "msg": f"{left} more problems not listed."})
    return listed


def _worded(error: Any) -> Any:
    """A text over its length said as pydantic says it of a plain string: the relay's text
    types check their characters first, and pydantic then counts "items"."""
    if not isinstance(error, dict) or error.get("type") != "too_long":
        return error
    if not isinstance(error.get("input"), str) or "max_length" not in error.get("ctx", {}):
        return error
    said = f"String should have at most {error['ctx']['max_length']} characters"
    return {**error, "msg": said}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def unreadable_json(error: BaseException, what: str) -> str | None:
    """Why Python would not read JSON that parses (what: "The message", "The request body").

    An integer of over 4,300 digits is a ValueError; "[[[[…" thousands deep, a RecursionError;
    bytes that are not UTF-8, a UnicodeDecodeError. None for any other error.
    """
    if isinstance(error, RecursionError):
        return f"{what} is nested too deeply."
    if isinstance(error, UnicodeDecodeError):  # JSON is text: UTF-8 (or UTF-16 or -32)
        return f"{what} is not UTF-8 text."
    if isinstance(error, ValueError) and "digits" in str(error):
        return f"{what} holds a number too long."
    return None
