import pytest

from app.window import (
    COMPACT_BUFFER,
    COMPACT_WARNING,
    ENV_VAR,
    MIN_WINDOW,
    NOTCHES,
    ResolvedWindow,
    apply_note,
    engine_window,
    free_until_compaction,
    parse_env_window,
    resolve_window,
    restart_line,
    source_text,
    validate_setting,
    will_compact,
    window_label,
    window_line,
)

NOTCH_ERROR = (
    "auto_compact_window must be one of: null, 100000, 200000, 300000, 500000, 700000, 1000000"
)


def test_constants_values() -> None:
    assert (NOTCHES, MIN_WINDOW, COMPACT_BUFFER, ENV_VAR, COMPACT_WARNING) == (
        (None, 100_000, 200_000, 300_000, 500_000, 700_000, 1_000_000),
        100_000,
        33_000,
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW",
        "The conversation will be compacted on the next message.",
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("abc", None),
        ("200kb", None),
        ("k", None),
        ("12abc", None),
        ("-5", None),
        ("0", None),
        ("0k", None),
        ("1", 100_000),
        ("50000", 100_000),
        ("99999", 100_000),
        ("100000", 100_000),
        ("200000", 200_000),
        (" 200000\n", 200_000),
        ("2000000", 2_000_000),
        ("200", 100_000),
        ("200k", 200_000),
        ("200K", 200_000),
        ("50k", 100_000),
        ("1m", 1_000_000),
        ("1M", 1_000_000),
        ("1.5m", 1_500_000),
        ("0.5m", 500_000),
        ("150.5k", 150_500),
    ],
)
def test_parse_env_window_values(value: str | None, expected: int | None) -> None:
    assert parse_env_window(value) == expected


def test_window_label_auto() -> None:
    assert window_label(None) == "Auto"


def test_window_label_notches() -> None:
    assert [window_label(notch) for notch in NOTCHES] == [
        "Auto",
        "100k",
        "200k",
        "300k",
        "500k",
        "700k",
        "1M",
    ]


def test_resolve_window_setting() -> None:
    assert resolve_window(100_000, None, 1_000_000) == ResolvedWindow(
        window=100_000, source="setting", capped=False, threshold=67_000
    )


def test_resolve_window_setting_wins_over_env() -> None:
    assert resolve_window(300_000, "200000", 1_000_000) == ResolvedWindow(
        window=300_000, source="setting", capped=False, threshold=267_000
    )


def test_resolve_window_setting_capped_by_model() -> None:
    assert resolve_window(1_000_000, None, 200_000) == ResolvedWindow(
        window=200_000, source="setting", capped=True, threshold=167_000
    )


def test_resolve_window_setting_equal_to_model_not_capped() -> None:
    assert resolve_window(200_000, None, 200_000) == ResolvedWindow(
        window=200_000, source="setting", capped=False, threshold=167_000
    )


def test_resolve_window_env() -> None:
    assert resolve_window(None, "200000", 1_000_000) == ResolvedWindow(
        window=200_000, source="env", capped=False, threshold=167_000
    )


def test_resolve_window_env_below_minimum() -> None:
    assert resolve_window(None, "50000", 1_000_000) == ResolvedWindow(
        window=100_000, source="env", capped=False, threshold=67_000
    )


def test_resolve_window_env_just_below_minimum() -> None:
    assert resolve_window(None, "99999", 1_000_000) == ResolvedWindow(
        window=100_000, source="env", capped=False, threshold=67_000
    )


def test_resolve_window_env_above_model_capped() -> None:
    assert resolve_window(None, "2000000", 1_000_000) == ResolvedWindow(
        window=1_000_000, source="env", capped=True, threshold=967_000
    )


def test_resolve_window_env_on_small_model_capped() -> None:
    assert resolve_window(None, "500000", 200_000) == ResolvedWindow(
        window=200_000, source="env", capped=True, threshold=167_000
    )


def test_resolve_window_env_garbage_falls_back_to_model() -> None:
    assert resolve_window(None, "abc", 1_000_000) == ResolvedWindow(
        window=1_000_000, source="model", capped=False, threshold=967_000
    )


def test_resolve_window_unset_uses_model() -> None:
    assert resolve_window(None, None, 200_000) == ResolvedWindow(
        window=200_000, source="model", capped=False, threshold=167_000
    )


def test_engine_window_is_the_model_s_compacted_at_80_percent() -> None:
    assert engine_window(128_000) == ResolvedWindow(
        window=128_000, source="model", capped=False, threshold=102_400
    )


def test_source_text_each_source() -> None:
    assert [
        source_text(ResolvedWindow(window=200_000, source=source, capped=False, threshold=167_000))
        for source in ("setting", "model", "env")
    ] == ["your setting", "model default", "from CLAUDE_CODE_AUTO_COMPACT_WINDOW"]


def test_window_line_before_first_turn() -> None:
    assert window_line(None) == ""


def test_window_line_setting() -> None:
    assert window_line(resolve_window(100_000, None, 1_000_000)) == "100k · your setting"


def test_window_line_model_default() -> None:
    assert window_line(resolve_window(None, None, 1_000_000)) == "1M · model default"


def test_window_line_env() -> None:
    assert (
        window_line(resolve_window(None, "200000", 1_000_000))
        == "200k · from CLAUDE_CODE_AUTO_COMPACT_WINDOW"
    )


def test_window_line_setting_capped() -> None:
    assert (
        window_line(resolve_window(1_000_000, None, 200_000))
        == "200k · your setting · capped to 200k by the model"
    )


def test_window_line_env_capped() -> None:
    assert (
        window_line(resolve_window(None, "500000", 200_000))
        == "200k · from CLAUDE_CODE_AUTO_COMPACT_WINDOW · capped to 200k by the model"
    )


def test_apply_note_turn_running() -> None:
    assert apply_note(turn_running=True, background_work=False) == "Applies after the current turn."


def test_apply_note_turn_running_wins_over_background_work() -> None:
    assert apply_note(turn_running=True, background_work=True) == "Applies after the current turn."


def test_apply_note_background_work() -> None:
    assert (
        apply_note(turn_running=False, background_work=True)
        == "Applies when background work has finished."
    )


def test_apply_note_idle() -> None:
    assert (
        apply_note(turn_running=False, background_work=False)
        == "Applies on the next message (the session restarts once)."
    )


def test_will_compact_unknown_usage() -> None:
    assert will_compact(None, 67_000) is False


def test_will_compact_below_threshold() -> None:
    assert will_compact(66_999, 67_000) is False


def test_will_compact_at_threshold() -> None:
    assert will_compact(67_000, 67_000) is True


def test_will_compact_smaller_window_than_used() -> None:
    resolved = resolve_window(100_000, None, 1_000_000)
    assert will_compact(150_000, resolved.threshold) is True


def test_free_until_compaction_counts_buffer() -> None:
    resolved = resolve_window(200_000, None, 1_000_000)
    assert free_until_compaction(46_000, resolved.threshold) == 121_000


def test_free_until_compaction_never_negative() -> None:
    assert free_until_compaction(80_000, 67_000) == 0


def test_free_until_compaction_unknown_usage() -> None:
    assert free_until_compaction(None, 67_000) is None


def test_restart_line_auto_to_notch() -> None:
    assert (
        restart_line(None, 100_000)
        == "Restarted the session to apply the compaction window (Auto → 100k)"
    )


def test_restart_line_notch_to_auto() -> None:
    assert (
        restart_line(1_000_000, None)
        == "Restarted the session to apply the compaction window (1M → Auto)"
    )


def test_validate_setting_accepts_every_notch() -> None:
    assert [validate_setting(notch) for notch in NOTCHES] == list(NOTCHES)


@pytest.mark.parametrize("value", [0, 50_000, 150_000, 2_000_000, -100_000])
def test_validate_setting_rejects_other_values(value: int) -> None:
    with pytest.raises(ValueError) as excinfo:
        validate_setting(value)
    assert str(excinfo.value) == NOTCH_ERROR


def test_validate_setting_rejects_float() -> None:
    with pytest.raises(ValueError) as excinfo:
        validate_setting(100_000.0)  # type: ignore[arg-type]
    assert str(excinfo.value) == NOTCH_ERROR


def test_validate_setting_rejects_bool() -> None:
    with pytest.raises(ValueError) as excinfo:
        validate_setting(True)
    assert str(excinfo.value) == NOTCH_ERROR
