from app.summary import (
    HEADER,
    SUMMARY_MESSAGES,
    SUMMARY_WINDOW,
    SummaryMessage,
    build_summary,
    compose_first_message,
)

NO_TEXT = "(The previous conversation had no text messages.)"


def numbered(count: int) -> list[SummaryMessage]:
    """Make messages "message 1".."message <count>", user first, then alternating."""
    return [
        SummaryMessage(role="user" if i % 2 else "agent", text=f"message {i}")
        for i in range(1, count + 1)
    ]


def numbered_lines(first: int, last: int) -> list[str]:
    """Write the summary lines of numbered messages first..last."""
    return [f"{'User' if i % 2 else 'Agent'}: message {i}" for i in range(first, last + 1)]


def test_constants_values() -> None:
    assert (HEADER, SUMMARY_WINDOW, SUMMARY_MESSAGES) == (
        "[Carry-over context from previous compacted conversation]",
        24,
        16,
    )


def test_build_summary_no_messages() -> None:
    assert build_summary("Fix the login bug", []) == (
        "Conversation: Fix the login bug\n(The previous conversation had no text messages.)"
    )


def test_build_summary_messages_without_text_only() -> None:
    messages = [
        SummaryMessage(role="user", text=""),
        SummaryMessage(role="agent", text=" \n\t "),
        SummaryMessage(role="agent", text=""),
    ]
    assert build_summary("Tools only", messages) == (
        "Conversation: Tools only\n(The previous conversation had no text messages.)"
    )


def test_build_summary_five_messages() -> None:
    messages = [
        SummaryMessage(role="user", text="Why does login fail?"),
        SummaryMessage(role="agent", text="Let me look at auth.py."),
        SummaryMessage(role="agent", text=""),
        SummaryMessage(role="agent", text="The token check compares bytes to str."),
        SummaryMessage(role="user", text="Fix it please"),
    ]
    assert build_summary("Fix the login bug", messages) == (
        "Conversation: Fix the login bug\n"
        "User: Why does login fail?\n"
        "Agent: Let me look at auth.py.\n"
        "Agent: The token check compares bytes to str.\n"
        "User: Fix it please"
    )


def test_build_summary_exactly_sixteen_messages() -> None:
    assert build_summary("Sixteen", numbered(16)) == (
        "Conversation: Sixteen\n"
        "User: message 1\n"
        "Agent: message 2\n"
        "User: message 3\n"
        "Agent: message 4\n"
        "User: message 5\n"
        "Agent: message 6\n"
        "User: message 7\n"
        "Agent: message 8\n"
        "User: message 9\n"
        "Agent: message 10\n"
        "User: message 11\n"
        "Agent: message 12\n"
        "User: message 13\n"
        "Agent: message 14\n"
        "User: message 15\n"
        "Agent: message 16"
    )


def test_build_summary_seventeen_messages_keeps_oldest_sixteen() -> None:
    assert build_summary("T", numbered(17)) == "\n".join(
        ["Conversation: T", *numbered_lines(1, 16)]
    )


def test_build_summary_exactly_twenty_four_messages() -> None:
    assert build_summary("T", numbered(24)) == "\n".join(
        ["Conversation: T", *numbered_lines(1, 16)]
    )


def test_build_summary_twenty_five_messages() -> None:
    assert build_summary("T", numbered(25)) == "\n".join(
        ["Conversation: T", *numbered_lines(2, 17)]
    )


def test_build_summary_hundred_messages_leaves_out_eight_most_recent() -> None:
    summary = build_summary("T", numbered(100))
    assert summary == "\n".join(["Conversation: T", *numbered_lines(77, 92)])


def test_build_summary_accepts_tuple() -> None:
    assert build_summary("T", tuple(numbered(2))) == (
        "Conversation: T\nUser: message 1\nAgent: message 2"
    )


def test_build_summary_collapses_newlines_and_tabs() -> None:
    messages = [
        SummaryMessage(role="user", text="  first line\n\nsecond\tline\r\n\t third   line  \n"),
        SummaryMessage(role="agent", text="a\u00a0b\u2028c"),
    ]
    assert build_summary("Whitespace", messages) == (
        "Conversation: Whitespace\nUser: first line second line third line\nAgent: a b c"
    )


def test_build_summary_collapses_title_whitespace() -> None:
    assert build_summary("  Two\nline\ttitle ", [SummaryMessage(role="user", text="hi")]) == (
        "Conversation: Two line title\nUser: hi"
    )


def test_build_summary_cuts_long_message() -> None:
    summary = build_summary("Long", [SummaryMessage(role="user", text="a" * 1_000)])
    assert summary == "Conversation: Long\nUser: " + "a" * 259 + "…"


def test_build_summary_cut_line_has_260_characters() -> None:
    summary = build_summary("Long", [SummaryMessage(role="agent", text="a" * 1_000)])
    assert len(summary.split("\n")[1].removeprefix("Agent: ")) == 260


def test_build_summary_keeps_260_characters_uncut() -> None:
    summary = build_summary("Edge", [SummaryMessage(role="user", text="x" * 260)])
    assert summary == "Conversation: Edge\nUser: " + "x" * 260


def test_build_summary_cuts_261_characters() -> None:
    summary = build_summary("Edge", [SummaryMessage(role="user", text="x" * 261)])
    assert summary == "Conversation: Edge\nUser: " + "x" * 259 + "…"


def test_build_summary_cuts_after_collapsing() -> None:
    text = "\n".join(["word"] * 60)  # 299 characters before collapsing, 299 after
    summary = build_summary("Words", [SummaryMessage(role="user", text=text)])
    assert summary == "Conversation: Words\nUser: " + " ".join(["word"] * 60)[:259] + "…"


def test_build_summary_collapsing_can_avoid_cut() -> None:
    text = "a" + " \n\t " * 100 + "b"
    summary = build_summary("Short", [SummaryMessage(role="user", text=text)])
    assert summary == "Conversation: Short\nUser: a b"


def test_build_summary_total_cut_to_3500() -> None:
    messages = [
        SummaryMessage(role="user" if i % 2 == 0 else "agent", text="b" * 300) for i in range(16)
    ]
    line = "b" * 259 + "…"
    full = "\n".join(
        ["Conversation: Long", *[f"{'User' if i % 2 == 0 else 'Agent'}: {line}" for i in range(16)]]
    )
    summary = build_summary("Long", messages)
    assert (len(full), len(summary), summary) == (4_298, 3_500, full[:3_500])


def test_build_summary_total_cut_loses_end() -> None:
    messages = [SummaryMessage(role="user", text=f"{i:02d}" + "c" * 298) for i in range(16)]
    summary = build_summary("Long", messages)
    # 18 + 13 × (1 + 266) = 3,489; after its newline the 14th line keeps its first 10 characters.
    assert summary.split("\n")[-1] == "User: 13cc"


def test_build_summary_short_total_not_cut() -> None:
    messages = [SummaryMessage(role="user", text="d" * 200) for _ in range(16)]
    summary = build_summary("Fits", messages)
    assert len(summary) == len("Conversation: Fits") + 16 * (1 + len("User: ") + 200)


def test_build_summary_cuts_emoji_by_code_point() -> None:
    summary = build_summary("Emoji", [SummaryMessage(role="user", text="😀" * 300)])
    assert summary == "Conversation: Emoji\nUser: " + "😀" * 259 + "…"


def test_build_summary_cuts_cjk_by_code_point() -> None:
    summary = build_summary("漢字", [SummaryMessage(role="agent", text="漢字" * 200)])
    assert summary == "Conversation: 漢字\nAgent: " + "漢字" * 129 + "漢…"


def test_build_summary_cuts_accents_by_code_point() -> None:
    summary = build_summary("Café", [SummaryMessage(role="user", text="é" * 261)])
    assert summary == "Conversation: Café\nUser: " + "é" * 259 + "…"


def test_build_summary_counts_combining_marks_as_code_points() -> None:
    decomposed = "e\u0301" * 150  # 300 code points, 150 visible letters
    summary = build_summary("Accents", [SummaryMessage(role="user", text=decomposed)])
    assert summary == "Conversation: Accents\nUser: " + "e\u0301" * 129 + "e…"


def test_build_summary_keeps_short_unicode() -> None:
    messages = [SummaryMessage(role="user", text="Ça marche 🎉 日本語でも")]
    assert build_summary("Ünïcode 🚀", messages) == (
        "Conversation: Ünïcode 🚀\nUser: Ça marche 🎉 日本語でも"
    )


def test_build_summary_total_cut_counts_code_points() -> None:
    messages = [SummaryMessage(role="user", text="😀" * 300) for _ in range(16)]
    summary = build_summary("E", messages)
    assert (len(summary), summary[-3:]) == (3_500, "😀😀😀")


def test_build_summary_empty_text_takes_a_place() -> None:
    # Activity (tool output, thinking) never reaches SummaryMessage; a tool-only message has "".
    messages = [SummaryMessage(role="agent", text=""), *numbered(16)]
    assert build_summary("T", messages) == "\n".join(["Conversation: T", *numbered_lines(1, 15)])


def test_build_summary_shows_only_given_text() -> None:
    messages = [
        SummaryMessage(role="user", text="run the tests"),
        SummaryMessage(role="agent", text=""),
        SummaryMessage(role="agent", text="All 12 tests pass."),
    ]
    assert build_summary("Tests", messages) == (
        "Conversation: Tests\nUser: run the tests\nAgent: All 12 tests pass."
    )


def test_compose_first_message_exact() -> None:
    summary = "Conversation: Fix the login bug\nUser: Why does login fail?"
    assert compose_first_message(summary, "Now add a test") == (
        "[Carry-over context from previous compacted conversation]\n"
        "Conversation: Fix the login bug\n"
        "User: Why does login fail?\n"
        "\n"
        "[New user request]\n"
        "Now add a test"
    )


def test_compose_first_message_keeps_typed_text_verbatim() -> None:
    assert compose_first_message("S", "  line one\n\tline two  ") == (
        "[Carry-over context from previous compacted conversation]\nS\n\n"
        "[New user request]\n  line one\n\tline two  "
    )
