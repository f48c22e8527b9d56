"""The carry-over with pins (SPEC §8) and what §2 leaves out: plain functions, literal outputs."""

from __future__ import annotations

import pytest

from app.summary import (
    SummaryMessage,
    build_summary,
    cut_carry,
    left_out,
    left_out_text,
    with_pins,
)


def numbered(count: int) -> list[SummaryMessage]:
    """Messages "message 1".."message <count>", user first, then alternating."""
    return [
        SummaryMessage(role="user" if i % 2 else "agent", text=f"message {i}")
        for i in range(1, count + 1)
    ]


def test_no_pins_is_byte_for_byte_the_summary_of_section_2() -> None:
    messages = numbered(30)
    assert build_summary("T", messages, []) == build_summary("T", messages)
    assert build_summary("T", messages) == "\n".join(
        ["Conversation: T"] + [f"{'User' if i % 2 else 'Agent'}: message {i}" for i in range(7, 23)]
    )


def test_pins_come_right_after_the_title_then_the_chosen_messages() -> None:
    assert build_summary(
        "Fix login", numbered(3), ["Use  bcrypt,\nnot md5", "Tests in tests/x"]
    ) == (
        "Conversation: Fix login\n"
        "Pinned:\n"
        "- Use bcrypt, not md5\n"
        "- Tests in tests/x\n"
        "User: message 1\n"
        "Agent: message 2\n"
        "User: message 3"
    )


def test_a_pinned_message_among_the_chosen_is_shown_once_under_pinned() -> None:
    messages = numbered(3)
    messages[1] = SummaryMessage(role="agent", text="message 2", pinned=True)
    assert build_summary("T", messages, ["message 2"]) == (
        "Conversation: T\nPinned:\n- message 2\nUser: message 1\nUser: message 3"
    )


def test_a_pinned_message_keeps_its_place_among_the_16() -> None:
    # 20 messages: the chosen 16 are 1..16; pinning 5 does not let 17 in.
    messages = numbered(20)
    messages[4] = SummaryMessage(role="user", text="message 5", pinned=True)
    lines = build_summary("T", messages, ["message 5"]).split("\n")
    assert lines[:3] == ["Conversation: T", "Pinned:", "- message 5"]
    assert lines[-1] == "Agent: message 16"
    assert len(lines) == 3 + 15


def test_pins_only() -> None:
    assert (
        build_summary("Only pins", [], ["keep this"])
        == "Conversation: Only pins\nPinned:\n- keep this"
    )
    # Chosen messages without text add nothing; the pins alone do not say "no text messages".
    silent = [SummaryMessage(role="agent", text="")]
    assert build_summary("Only pins", silent, ["a", "b"]) == (
        "Conversation: Only pins\nPinned:\n- a\n- b"
    )


def test_a_pin_without_text_adds_nothing() -> None:
    assert build_summary("T", [], [" \n "]) == (
        "Conversation: T\n(The previous conversation had no text messages.)"
    )


def test_a_long_pin_is_one_line_cut_to_260_characters() -> None:
    pin = "word " * 100  # 500 characters, spaces collapsed and trimmed: 499
    summary = build_summary("T", [], [pin])
    assert summary == "Conversation: T\nPinned:\n- " + ("word " * 52)[:259] + "…"
    assert len(summary.split("\n")[2]) == 2 + 260


def test_many_long_pins_fill_3500_and_push_the_messages_out() -> None:
    pins = [chr(ord("a") + i) * 300 for i in range(14)]
    summary = build_summary("T", numbered(5), pins)
    head = "Conversation: T\nPinned:"  # 23 characters
    line = lambda i: "- " + chr(ord("a") + i) * 259 + "…"  # noqa: E731 - 262 characters
    whole = "\n".join([head] + [line(i) for i in range(13)])  # 23 + 13 * 263 = 3,442
    assert len(whole) == 3_442
    assert summary == whole + "\n" + line(13)[: 3_500 - 3_443]
    assert len(summary) == 3_500
    assert "message" not in summary


def test_pins_and_messages_at_the_3500_edge() -> None:
    # 13 pins of 260 fill 3,442 characters; the first message line gets the 57 left, cut.
    pins = ["p" * 260] * 13
    messages = [SummaryMessage(role="user", text="u" * 100)]
    summary = build_summary("T", messages, pins)
    assert len(summary) == 3_500
    assert summary.endswith("\nUser: " + "u" * 51)
    # One character less in the title: one more character of the message.
    assert build_summary("", messages, pins).endswith("\nUser: " + "u" * 52)


def test_with_pins_puts_the_block_after_the_first_line() -> None:
    carry = "[Handoff from the previous session]\nDone: a\nNext: b\nFiles: "
    assert with_pins(carry, []) == carry
    assert with_pins(carry, ["keep  me"]) == (
        "[Handoff from the previous session]\nPinned:\n- keep me\nDone: a\nNext: b\nFiles: "
    )
    assert with_pins("[Carry-over context from backup x.md]", ["p"]) == (
        "[Carry-over context from backup x.md]\nPinned:\n- p"
    )


def test_with_pins_cuts_the_block_to_3500_and_keeps_the_rest_whole() -> None:
    rest = "Done: " + "d" * 5_000
    carry = with_pins("HEAD\n" + rest, ["x" * 300] * 20)
    head, block_and_rest = carry.split("\n", 1)
    assert head == "HEAD"
    assert block_and_rest.endswith("\n" + rest)
    assert len(block_and_rest) == 3_500 + 1 + len(rest)


def test_an_edited_carry_over_is_cut_to_3500() -> None:
    assert cut_carry("é" * 3_600) == "é" * 3_500
    assert cut_carry("short") == "short"


@pytest.mark.parametrize(
    ("total", "counts", "text"),
    [
        (0, (0, 0), "Nothing is left out."),
        (16, (0, 0), "Nothing is left out."),
        (17, (1, 0), "Left out: the newest message."),
        (24, (8, 0), "Left out: the 8 newest messages."),
        (25, (8, 1), "Left out: the 8 newest messages and 1 older one."),
        (45, (8, 21), "Left out: the 8 newest messages and 21 older ones."),
        (300, (8, 276), "Left out: the 8 newest messages and 276 older ones."),
    ],
)
def test_left_out_counts(total: int, counts: tuple[int, int], text: str) -> None:
    assert left_out(total) == counts
    assert left_out_text(*counts) == text


def test_left_out_text_spec_example_and_edges() -> None:
    assert left_out_text(8, 37) == "Left out: the 8 newest messages and 37 older ones."
    assert left_out_text(0, 1) == "Left out: 1 older message."
    assert left_out_text(0, 3) == "Left out: 3 older messages."
    assert left_out_text(8, 1_234) == "Left out: the 8 newest messages and 1,234 older ones."
    assert left_out_text(0, 0, whole=True) == "Nothing is left out."
    assert left_out_text(0, 1, whole=True) == "Left out: 1 message."
    assert left_out_text(0, 45, whole=True) == "Left out: all 45 messages."
