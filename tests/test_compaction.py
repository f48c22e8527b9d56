"""The texts of an agent's own compactions, per provider family."""

from __future__ import annotations

from app.compaction import failed_text, finished_text, started_text


def test_started_text_per_style() -> None:
    assert started_text("line") == "Compacting context…"
    assert started_text("activity") == "Compacting the conversation context…"


def test_finished_text_line_with_both_numbers() -> None:
    text = finished_text("line", pre_tokens=150_046, post_tokens=3_012)
    assert text == "Context compacted · 150k → 3k tokens"


def test_finished_text_line_with_size_before_only() -> None:
    assert finished_text("line", pre_tokens=120_000) == "Context compacted · was 120k tokens"


def test_finished_text_line_without_numbers() -> None:
    assert finished_text("line") == "Context compacted"


def test_finished_text_activity_with_removed_counts() -> None:
    text = finished_text("activity", messages_removed=12, tokens_removed=30_000)
    assert text == "Context compacted (removed 12 messages, 30k tokens)"


def test_failed_text_line_leaves_nothing() -> None:
    assert failed_text("line", "too_few_groups") is None


def test_failed_text_activity_is_one_short_line() -> None:
    reason = "provider_rejected\n  nested: {\n   error: ...}"
    assert failed_text("activity", reason) == (
        "Context compaction failed: provider_rejected nested: { error: ...}"
    )
    assert (
        len(failed_text("activity", "x" * 1000) or "") == len("Context compaction failed: ") + 200
    )
