"""Claude Code's plan, approved in Chromium: the real CLI in plan mode against the fake
Messages API. The card shows the plan as text and asks how the work goes on; the mode under
the message box follows the answer."""

from __future__ import annotations

from playwright.sync_api import expect

from tests import test_claude_relay as claude_relay
from tests.browser import Pages, by_id, send_text
from tests.fake_anthropic import FakeAnthropic
from tests.test_claude_relay import TIMEOUT, StartRelay

# The real CLI's fixtures: the fake Messages API, a fresh HOME, relays on tmp_path.
start = claude_relay.start

PLAN = "## Plan\n1. Write one.txt\n2. <b>Check</b> it"


def test_a_plan_is_read_and_approved_from_its_card(
    pages: Pages, start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = live.create(provider="claude", title="Plan", permission_mode="plan")["id"]
    page = pages.open(live, f"/c/{cid}")
    other = pages.open(live, f"/c/{cid}")
    expect(by_id(page, "mode-select")).to_have_value("plan")

    fake.tool_calls.append(("ExitPlanMode", {"plan": PLAN}))
    send_text(page, "make a plan")
    card = page.locator(".activity.plan")
    expect(card.get_by_test_id("plan-text")).to_have_text(PLAN)  # as text: no bold, no tag
    expect(card.locator("b")).to_have_count(0)
    for name in ("Approve, accept edits", "Approve, ask before edits", "Keep planning"):
        expect(card.get_by_role("button", name=name)).to_be_enabled()

    card.get_by_test_id("plan-accept-edits").click()
    expect(card.get_by_test_id("permission-answer")).to_have_text("Approved, edits accepted")
    other_card = other.locator(".activity.plan")
    expect(other_card.get_by_test_id("permission-answer")).to_have_text("Approved, edits accepted")
    expect(by_id(page, "mode-select")).to_have_value("acceptEdits")
    expect(by_id(other, "mode-select")).to_have_value("acceptEdits")
    live.wait_idle(cid, timeout=TIMEOUT)
    assert live.get(cid)["permission_mode"] == "acceptEdits"
    pages.assert_clean()


def test_keep_planning_tells_the_agent_and_stays_in_plan_mode(
    pages: Pages, start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = live.create(provider="claude", title="Plan", permission_mode="plan")["id"]
    page = pages.open(live, f"/c/{cid}")
    fake.tool_calls.append(("ExitPlanMode", {"plan": PLAN}))
    send_text(page, "make a plan")
    card = page.locator(".activity.plan")
    card.get_by_test_id("plan-keep").click()
    expect(card.get_by_test_id("permission-answer")).to_have_text("Kept in planning")
    expect(by_id(page, "message-input")).to_be_focused()  # for what should change
    live.wait_idle(cid, timeout=TIMEOUT)
    assert "keep planning" in str(fake.message_bodies()[-1]["messages"][-1])
    expect(by_id(page, "mode-select")).to_have_value("plan")
    assert live.get(cid)["permission_mode"] == "plan"
    pages.assert_clean()
