"""The model of a Claude Code conversation chosen under the message box, in Chromium: the real
CLI against the fake Messages API uses it from its next request; every tab follows."""

from __future__ import annotations

from playwright.sync_api import expect

from tests import test_claude_relay as claude_relay
from tests.browser import Pages, by_id, send_text
from tests.fake_anthropic import FakeAnthropic
from tests.test_claude_relay import TIMEOUT, StartRelay, requested_models

# The real CLI's fixtures: the fake Messages API, a fresh HOME, relays on tmp_path.
start = claude_relay.start


def test_the_model_is_chosen_under_the_message_box(
    pages: Pages, start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = live.create(provider="claude", title="Model")["id"]
    demo = live.create(title="Demo")["id"]
    page = pages.open(live, f"/c/{cid}")
    other = pages.open(live, f"/c/{cid}")
    select = by_id(page, "model-select")
    expect(select).to_have_value("")
    expect(select.locator("option:checked")).to_have_text("Default")

    select.select_option("haiku")
    expect(by_id(other, "model-select")).to_have_value("haiku")
    send_text(page, "hello")
    # (The reply's element: the screen readers' line (#announce) holds its words too.)
    expect(by_id(page, "entry-agent").get_by_text("You said: hello")).to_be_visible()
    live.wait_idle(cid, timeout=TIMEOUT)
    assert "haiku" in requested_models(fake)[-1]
    assert live.get(cid)["chosen_model"] == "haiku"

    # One set through the API shows as itself; a demo conversation has no model to choose.
    live.http.patch(f"/api/conversations/{cid}", json={"chosen_model": "claude-sonnet-4-5"})
    expect(select).to_have_value("claude-sonnet-4-5")
    live.create(provider="claude", title="Other")
    page.locator(".conv-item").filter(has_text="Other").click()  # the same page: not reloaded
    expect(by_id(page, "title")).to_have_text("Other")
    expect(select).to_have_value("")
    expect(select.locator("option")).to_have_text(["Default", "Opus", "Sonnet", "Haiku"])
    page.goto(f"{live.base}/c/{demo}")
    expect(by_id(page, "mode-select")).to_be_visible()
    expect(select).to_be_hidden()
    pages.assert_clean()
