"""Checks on text from clients: valid Unicode, and at least one character a person can see."""

from __future__ import annotations

import unicodedata

# Categories that draw nothing on their own: controls, format characters (zero-width
# spaces and joiners, bidi controls, soft hyphen), surrogates, private use, unassigned,
# separators (spaces, line and paragraph separators) and combining marks without a base.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp", "Mn", "Me"})
# Letters and symbols that fonts draw as blank space (Hangul fillers, the blank Braille cell).
_BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def is_valid_unicode(text: str) -> bool:
    """True when text can be stored and sent as UTF-8 (no lone surrogate such as \\ud800)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_visible(char: str) -> bool:
    """True for a character that shows something on the screen."""
    return char not in _BLANK_CHARACTERS and (
        unicodedata.category(char) not in _INVISIBLE_CATEGORIES
    )


def has_visible_character(text: str) -> bool:
    """True when at least one character of text shows something."""
    return any(is_visible(char) for char in text)
