"""The context report's summary form (issue 18, session 6): the real CLI against the fake API.

`get_context_usage` with `detail: "summary"` gives the same window figures as the full
report from the CLI's own estimates, without the ~26 token-count requests of the full one.
The relay asks it after a new CLI's first turn (the window check); the 🧠 modal still asks
the full report.
"""

from __future__ import annotations

import time

import pytest

from tests import test_claude_code as claude_code
from tests import test_claude_relay as claude_relay
from tests.agent_turns import run_turn
from tests.fake_anthropic import FakeAnthropic
from tests.test_claude_relay import TIMEOUT, StartRelay, context, create_claude, turn

make_agent = claude_code.make_agent
start = claude_relay.start  # home and fake: conftest
MakeAgent = claude_code.MakeAgent

WINDOW_KEYS = ("maxTokens", "rawMaxTokens", "autoCompactThreshold", "autocompactSource")


def token_counts(fake: FakeAnthropic) -> int:
    """How many token-count requests the fake API has received."""
    return sum(1 for r in list(fake.requests) if r.path.split("?")[0].endswith("/count_tokens"))


async def test_the_summary_has_the_full_reports_window_without_token_counts(
    make_agent: MakeAgent, fake: FakeAnthropic
) -> None:
    agent = make_agent(env={"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "300000"})
    await agent.start()
    await run_turn(agent, "hello")
    before = token_counts(fake)

    summary = await agent.context_summary()

    assert summary is not None
    assert token_counts(fake) == before  # answered by the CLI alone
    full = await agent.context_usage()
    assert full is not None
    assert token_counts(fake) > before  # the full one counts each part with the API
    assert {k: summary[k] for k in WINDOW_KEYS} == {k: full[k] for k in WINDOW_KEYS}
    assert (summary["maxTokens"], summary["autocompactSource"]) == (300_000, "env")
    assert {c["name"] for c in summary["categories"]} >= {"System prompt", "Free space"}


def test_the_first_turn_checks_the_window_without_token_counts_and_the_modal_counts(
    start: StartRelay, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "300000")
    live = start()
    cid = create_claude(live)
    turn(live, cid, "hello")
    runner = live.supervisor.runners[cid]
    deadline = time.monotonic() + TIMEOUT
    while runner.context_report is None or not (runner.reporting and runner.reporting.done()):
        assert time.monotonic() < deadline, "no context report after the first turn"
        time.sleep(0.05)
    assert runner.context_report["maxTokens"] == 300_000
    assert token_counts(fake) == 0  # the window check asked the CLI alone

    data = context(live, cid)  # the 🧠 modal: the full report, each part counted

    assert token_counts(fake) > 0
    assert data["agent"] == {
        "maxTokens": 300_000,
        "autocompactSource": "env",
        "autoCompactThreshold": 267_000,
    }
    assert data["categories"] and {c["name"] for c in data["categories"]} >= {"System prompt"}
