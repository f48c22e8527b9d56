"""Checks on text from clients: valid Unicode, and at least one character a person can see."""

from __future__ import annotations

import re
import unicodedata

# Categories that draw nothing on their own: controls, format characters (zero-width
# spaces and joiners, bidi controls, soft hyphen), surrogates, private use, unassigned,
# separators (spaces, line and paragraph separators) and combining marks without a base.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp", "Mn", "Me"})
# Letters and symbols that fonts draw as blank space (Hangul fillers, the blank Braille cell).
_BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


# Right-to-left letters and the bidi controls (embeddings, overrides, isolates, marks).
_BIDI = re.compile(
    "[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc\u061c\u200f\u202a-\u202e\u2066-\u2069"
    "\U00010800-\U00010fff\U0001e800-\U0001efff]"
)


def isolate(text: str) -> str:
    """Text to quote inside other text: wrapped in FSI…PDI when it holds bidi text.

    A U+202E in it then reverses nothing after the quote (static/util.js does the same).
    """
    return f"\u2068{text}\u2069" if _BIDI.search(text) else text


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


_ASCII_INVISIBLE = "".join(map(chr, range(0x21))) + "\x7f"  # controls and the space


def has_visible_character(text: str) -> bool:
    """True when at least one character of text shows something."""
    if text.isascii():  # (in C: a message of 256 KB of controls took 30 ms char by char)
        return bool(text.strip(_ASCII_INVISIBLE))
    return any(is_visible(char) for char in text)
