"""The compacted title rule: readable, counted, within the API's 200 characters."""

from __future__ import annotations

from app.titles import TITLE_LIMIT, compacted_from, compacted_title


def test_first_compaction_is_spec_title() -> None:
    assert compacted_title("T") == "T (compacted)"
    assert compacted_title("Fix the parser") == "Fix the parser (compacted)"


def test_later_compactions_count() -> None:
    assert compacted_title("T (compacted)") == "T (compacted ×2)"
    assert compacted_title("T (compacted ×2)") == "T (compacted ×3)"
    assert compacted_title("T (compacted ×9)") == "T (compacted ×10)"


def test_twenty_eight_compactions_stay_short() -> None:
    title = "Fix the parser"
    for _ in range(28):
        title = compacted_title(title)
    assert title == "Fix the parser (compacted ×28)"


def test_long_title_is_cut_and_keeps_its_suffix() -> None:
    long = "x" * 200
    first = compacted_title(long)
    assert first == "x" * 187 + "… (compacted)"
    assert len(first) == TITLE_LIMIT
    second = compacted_title(first)
    assert second == "x" * 184 + "… (compacted ×2)"
    assert len(second) == TITLE_LIMIT


def test_cut_never_ends_in_a_space() -> None:
    assert compacted_title("x" * 186 + " " + "y" * 13) == "x" * 186 + "… (compacted)"


def test_only_a_trailing_suffix_counts() -> None:
    assert compacted_title("(compacted) notes") == "(compacted) notes (compacted)"
    assert compacted_title("T (compacted ×x)") == "T (compacted ×x) (compacted)"
    assert compacted_title("(compacted)") == "(compacted) (compacted)"


def test_multiline_title_keeps_its_count() -> None:
    assert compacted_title("a\nb (compacted ×4)") == "a\nb (compacted ×5)"


def test_a_right_to_left_title_is_isolated_from_its_suffix() -> None:
    # Found by a hostile review: an override (U+202E) in a title reversed " (compacted)".
    spoof = "report\u202etxt.exe"
    once = compacted_title(spoof)
    assert once == f"\u2068{spoof}\u2069 (compacted)"
    assert compacted_title(once) == f"\u2068{spoof}\u2069 (compacted ×2)"  # wrapped once
    assert compacted_title("שלום") == "\u2068שלום\u2069 (compacted)"
    long = compacted_title("\u202e" + "x" * 300)
    assert len(long) == TITLE_LIMIT
    assert long.startswith("\u2068\u202e") and long.endswith("…\u2069 (compacted)")


def test_compacted_from_knows_a_title_and_its_successors() -> None:
    base = "New conversation"
    assert [
        compacted_from(title, base)
        for title in (base, f"{base} (compacted)", f"{base} (compacted ×3)", compacted_title(base))
    ] == [True] * 4
    assert [
        compacted_from(title, base)
        for title in ("Other (compacted)", f"{base}s (compacted)", f"{base} (compacted) x", "")
    ] == [False] * 4
