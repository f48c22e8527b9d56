import pytest

from app.tokens import format_tokens


def test_format_tokens_zero() -> None:
    assert format_tokens(0) == "0"


def test_format_tokens_below_thousand() -> None:
    assert format_tokens(999) == "999"


def test_format_tokens_one_thousand() -> None:
    assert format_tokens(1_000) == "1k"


def test_format_tokens_one_decimal_below_ten_thousand() -> None:
    assert format_tokens(2_500) == "2.5k"


def test_format_tokens_drops_zero_decimal() -> None:
    assert format_tokens(3_000) == "3k"


def test_format_tokens_rounds_half_up_in_thousands_with_decimal() -> None:
    assert format_tokens(2_450) == "2.5k"


def test_format_tokens_rounds_down_below_half() -> None:
    assert format_tokens(2_449) == "2.4k"


def test_format_tokens_rounds_to_zero_decimal() -> None:
    assert format_tokens(2_960) == "3k"


def test_format_tokens_last_one_decimal_value() -> None:
    assert format_tokens(9_949) == "9.9k"


def test_format_tokens_rounds_out_of_one_decimal_range() -> None:
    assert format_tokens(9_950) == "10k"


def test_format_tokens_ten_thousand() -> None:
    assert format_tokens(10_000) == "10k"


def test_format_tokens_whole_thousands() -> None:
    assert format_tokens(150_046) == "150k"


def test_format_tokens_whole_thousands_rounds_half_up() -> None:
    assert format_tokens(120_500) == "121k"


def test_format_tokens_whole_thousands_rounds_down() -> None:
    assert format_tokens(120_499) == "120k"


def test_format_tokens_just_below_million_stays_thousands() -> None:
    assert format_tokens(999_499) == "999k"


def test_format_tokens_rounds_up_to_million() -> None:
    assert format_tokens(999_500) == "1M"


def test_format_tokens_one_million() -> None:
    assert format_tokens(1_000_000) == "1M"


def test_format_tokens_million_rounds_down_below_half() -> None:
    assert format_tokens(1_049_999) == "1M"


def test_format_tokens_million_rounds_half_up() -> None:
    assert format_tokens(1_050_000) == "1.1M"


def test_format_tokens_million_with_decimal() -> None:
    assert format_tokens(1_200_000) == "1.2M"


def test_format_tokens_millions_drop_zero_decimal() -> None:
    assert format_tokens(1_960_000) == "2M"


def test_format_tokens_tens_of_millions() -> None:
    assert format_tokens(12_345_678) == "12.3M"


def test_format_tokens_negative_raises() -> None:
    with pytest.raises(ValueError) as excinfo:
        format_tokens(-1)
    assert str(excinfo.value) == "token count must not be negative: -1"
