"""The context watch and the handoff (SPEC §7): notes, carry-over and arguments, as literal text."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config import Settings
from app.handoff import (
    HANDOFF_REQUEST,
    HandoffText,
    carry_over,
    context_note,
    first_message,
    is_clear_command,
    is_handoff_command,
    parse_handoff,
    with_note,
)
from app.summary import compose_first_message

SOFT_312K = (
    "[Context watch] The context is at 312k tokens. At a good stopping point, save a handoff "
    "with the save_handoff tool (what is done, what is next, the file paths and function names "
    "involved) and suggest that the user start fresh with /clear."
)
HARD_1_2M = (
    "[Context watch] The context is at 1.2M tokens, past 500k. Finish the current task, then "
    "save a handoff with the save_handoff tool (what is done, what is next, the file paths and "
    "function names involved) and ask the user to start fresh with /clear."
)


def test_no_note_below_soft_or_unknown() -> None:
    assert context_note(None, 300_000, 500_000) is None
    assert context_note(299_999, 300_000, 500_000) is None


def test_soft_note_from_soft_up_to_hard() -> None:
    assert context_note(312_000, 300_000, 500_000) == SOFT_312K
    assert context_note(300_000, 300_000, 500_000) == SOFT_312K.replace("312k", "300k")
    assert context_note(499_999, 300_000, 500_000) == SOFT_312K.replace("312k", "500k")


def test_hard_note_at_and_past_hard() -> None:
    assert context_note(1_200_000, 300_000, 500_000) == HARD_1_2M
    at_hard = context_note(500_000, 300_000, 500_000)
    assert at_hard == HARD_1_2M.replace("at 1.2M tokens", "at 500k tokens")
    small = context_note(2_500, 1_000, 2_000)
    assert small is not None and small.startswith(
        "[Context watch] The context is at 2.5k tokens, past 2k. Finish"
    )


def test_note_goes_after_the_text_and_a_blank_line() -> None:
    assert with_note("fix the bug", "NOTE") == "fix the bug\n\nNOTE"
    assert with_note("fix the bug", None) == "fix the bug"


def test_commands_are_whole_messages_only() -> None:
    assert is_handoff_command("  /handoff\n") and is_clear_command("\t/clear ")
    assert not is_handoff_command("/handoff now") and not is_clear_command("/clear please")
    assert not is_clear_command("/Clear") and not is_handoff_command("/compact")
    assert HANDOFF_REQUEST == (
        "Save a handoff now with the save_handoff tool: what is done, what is next, "
        "the file paths and function names involved."
    )


def test_carry_over_and_first_message_are_spec_format() -> None:
    handoff = HandoffText("Parser rewritten", "Wire it in", ("app/parse.py", "parse_line"))
    block = carry_over(handoff)
    assert block == (
        "[Handoff from the previous session]\n"
        "Done: Parser rewritten\n"
        "Next: Wire it in\n"
        "Files: app/parse.py, parse_line"
    )
    assert first_message(block, "go on") == (
        "[Handoff from the previous session]\n"
        "Done: Parser rewritten\n"
        "Next: Wire it in\n"
        "Files: app/parse.py, parse_line\n"
        "\n"
        "[New user request]\n"
        "go on"
    )
    # /compact's pending summary keeps its own header.
    summary = "Conversation: T\nUser: hi"
    assert first_message(summary, "go on") == compose_first_message(summary, "go on")


def test_parse_handoff_accepts_and_trims() -> None:
    handoff = parse_handoff({"done": " a ", "next": "b\n", "files": [" x.py ", "", "f"]})
    assert handoff == HandoffText("a", "b", ("x.py", "f"))


def test_parse_handoff_limit_counts_every_field() -> None:
    exactly = {"done": "d" * 4_000, "next": "n" * 4_000, "files": ["f" * 500, "g" * 500]}
    assert len(parse_handoff(exactly).done) == 4_000
    over = {**exactly, "files": ["f" * 500, "g" * 501]}
    with pytest.raises(ValueError) as error:
        parse_handoff(over)
    assert str(error.value) == (
        "The handoff is 9,001 characters long; the limit is 9,000 for done, next and files "
        "together. Write a shorter one (keep the file paths and function names)."
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"next": "b", "files": []}, "save_handoff needs `done` and `next` as text."),
        ({"done": 1, "next": "b", "files": []}, "save_handoff needs `done` and `next` as text."),
        (
            {"done": "a", "next": "b", "files": "x.py"},
            "save_handoff needs `files` as a list of paths and function names.",
        ),
        (
            {"done": "a", "next": "b", "files": [1]},
            "save_handoff needs `files` as a list of paths and function names.",
        ),
        (
            {"done": " ", "next": "", "files": []},
            "The handoff is empty: say what is done and what is next.",
        ),
        (  # invisible characters alone (found by a hostile review: stored, then carried)
            {"done": "\u200b", "next": "\ufeff\u200d", "files": []},
            "The handoff is empty: say what is done and what is next.",
        ),
    ],
)
def test_parse_handoff_refuses_bad_arguments(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_handoff(arguments)
    assert str(error.value) == message


def test_thresholds_default_and_hard_below_soft_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OARLOCK_CONTEXT_SOFT", raising=False)
    monkeypatch.delenv("OARLOCK_CONTEXT_HARD", raising=False)
    settings = Settings()
    assert (settings.context_soft, settings.context_hard) == (300_000, 500_000)
    monkeypatch.setenv("OARLOCK_CONTEXT_SOFT", "20000")
    monkeypatch.setenv("OARLOCK_CONTEXT_HARD", "40000")
    assert (Settings().context_soft, Settings().context_hard) == (20_000, 40_000)
    monkeypatch.setenv("OARLOCK_CONTEXT_HARD", "10000")
    with pytest.raises(ValidationError, match="OARLOCK_CONTEXT_HARD must not be below"):
        Settings()
