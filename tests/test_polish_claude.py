"""Issue 17's rough edges met with the real `claude` CLI against the fake Messages API."""

from __future__ import annotations

import pytest

from tests.fake_anthropic import FakeAnthropic
from tests.test_claude_relay import (  # noqa: F401 (fixtures)
    StartRelay,
    create_claude,
    of_kind,
    start,
    turn,
)


def test_api_retries_are_one_line_updated_in_place(
    start: StartRelay,  # noqa: F811
    fake: FakeAnthropic,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "3")
    live = start()
    cid = create_claude(live)
    fake.fail(500, 500, 500)  # three failures, then the answer
    view = turn(live, cid, "first")
    lines = of_kind(view, "line")
    assert [(e["data"]["level"], e["text"]) for e in lines] == [
        ("warning", "API error 500 (server_error), retrying (attempt 3 of 3)"),
    ]
    assert lines[0]["data"]["attempt"] == 3
    assert [e["text"] for e in of_kind(view, "agent")] == ["You said: first"]

    fake.fail(500)  # the next turn's retries get a line of their own
    view = turn(live, cid, "second")
    assert [e["text"] for e in of_kind(view, "line")] == [
        "API error 500 (server_error), retrying (attempt 3 of 3)",
        "API error 500 (server_error), retrying (attempt 1 of 3)",
    ]
