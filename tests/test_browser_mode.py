"""The permission mode changed from the composer, in Chromium: every tab follows, "Never ask" is
confirmed first, a refusal puts it back and says why, an archived conversation's is read-only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from playwright.sync_api import Page, Route, expect

from app.providers import ROOT_BYPASS
from tests import test_claude_relay as claude_relay
from tests.browser import Pages, by_id, own_relay, send_text, user_bubble
from tests.relay import LiveRelay
from tests.test_browser_everyday import PHONE
from tests.test_claude_relay import StartRelay

# The real CLI's fixtures (a fresh HOME and the fake API make Claude Code available).
start = claude_relay.start


def mode(relay: LiveRelay, cid: int) -> str:
    return str(relay.get(cid)["permission_mode"])


def test_the_mode_changes_from_the_composer_in_every_tab(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Modes")["id"]
    page = pages.open(relay, f"/c/{cid}")
    other = pages.open(relay, f"/c/{cid}")
    select = by_id(page, "mode-select")
    expect(select).to_have_value("default")
    expect(select.locator("option:checked")).to_have_text("Ask before acting")

    select.select_option("plan")
    expect(by_id(other, "mode-select")).to_have_value("plan")
    assert mode(relay, cid) == "plan"

    # "Never ask" waits for a confirmation; Cancel (or Esc) leaves the mode as it was.
    select.select_option("bypassPermissions")
    dialog = by_id(page, "bypass-dialog")
    expect(dialog).to_be_visible()
    expect(by_id(page, "bypass-cancel")).to_be_focused()
    by_id(page, "bypass-cancel").click()
    expect(dialog).to_be_hidden()
    expect(select).to_have_value("plan")
    expect(select).to_be_focused()
    select.select_option("bypassPermissions")
    page.keyboard.press("Escape")
    expect(select).to_have_value("plan")
    assert mode(relay, cid) == "plan"

    select.select_option("bypassPermissions")
    by_id(page, "bypass-ok").click()
    expect(by_id(other, "mode-select")).to_have_value("bypassPermissions")
    assert mode(relay, cid) == "bypassPermissions"
    select.select_option("acceptEdits")  # and back, without a question
    expect(by_id(other, "mode-select")).to_have_value("acceptEdits")
    assert mode(relay, cid) == "acceptEdits"
    pages.assert_clean()


def test_a_refused_mode_goes_back_and_says_why(pages: Pages, relay: LiveRelay) -> None:
    """As the relay refuses bypassPermissions to a Claude Code agent run as root (409)."""
    cid = relay.create(title="Refused")["id"]
    page = pages.open(relay, f"/c/{cid}")
    reason = "Claude Code refuses bypassPermissions when it runs as root."

    def refuse(route: Route) -> None:
        if route.request.method == "PATCH":
            route.fulfill(
                status=409, content_type="application/json", body=json.dumps({"detail": reason})
            )
        else:
            route.continue_()

    page.route(f"**/api/conversations/{cid}", refuse)
    select = by_id(page, "mode-select")
    select.select_option("bypassPermissions")
    by_id(page, "bypass-ok").click()
    expect(page.locator("#toast")).to_have_text(f"The permission mode was not changed: {reason}")
    expect(select).to_have_value("default")
    assert mode(relay, cid) == "default"
    pages.assert_clean("409")


@pytest.mark.skipif(os.geteuid() != 0, reason="the CLI refuses bypassPermissions only as root")
def test_a_mode_the_agent_would_refuse_is_not_offered(
    pages: Pages, start: StartRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As root, "Never ask" in a Claude Code conversation asked for a confirmation, then the
    # relay refused it (409): it is marked unavailable up front, the reason as its tooltip.
    monkeypatch.delenv("IS_SANDBOX", raising=False)
    live = start()
    cid = live.create(provider="claude", title="As root")["id"]
    demo = live.create(title="Demo")["id"]
    page = pages.open(live, f"/c/{cid}")
    bypass = by_id(page, "mode-select").locator("option[value=bypassPermissions]")
    expect(bypass).to_be_disabled()
    expect(bypass).to_have_text("Never ask (not available here)")
    expect(bypass).to_have_attribute("title", ROOT_BYPASS)
    page.goto(f"{live.base}/c/{demo}")  # the demo agent takes it
    expect(bypass).to_be_enabled()
    expect(bypass).to_have_text("Never ask")

    # The new conversation's list too, following the provider chosen.
    by_id(page, "new-conversation").click()
    modes = by_id(page, "new-permission")
    new_bypass = modes.locator("option[value=bypassPermissions]")
    by_id(page, "new-provider").select_option("demo")
    modes.select_option("bypassPermissions")
    by_id(page, "new-provider").select_option("claude")
    expect(modes).to_have_value("default")
    expect(new_bypass).to_be_disabled()
    expect(new_bypass).to_have_text("bypassPermissions — never ask (not available here)")
    # Said under the list too: a touch screen shows no tooltip.
    expect(by_id(page, "new-permission-note")).to_have_text(ROOT_BYPASS)
    by_id(page, "new-provider").select_option("demo")
    expect(new_bypass).to_be_enabled()
    expect(by_id(page, "new-permission-note")).to_be_hidden()
    pages.assert_clean()


def test_a_sandbox_that_lets_the_agent_take_it_offers_it(
    pages: Pages, start: StartRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IS_SANDBOX", "1")
    live = start(agent_env_passthrough="IS_SANDBOX")
    cid = live.create(provider="claude", title="Sandboxed")["id"]
    page = pages.open(live, f"/c/{cid}")
    bypass = by_id(page, "mode-select").locator("option[value=bypassPermissions]")
    expect(bypass).to_have_text("Never ask")
    expect(bypass).to_be_enabled()
    pages.assert_clean()


def test_an_archived_conversation_s_mode_cannot_be_changed(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Archived mode")["id"]
    page: Page = pages.open(relay, f"/c/{cid}")
    select = by_id(page, "mode-select")
    expect(select).to_be_enabled()
    relay.http.post(f"/api/conversations/{cid}/archive")
    expect(select).to_be_disabled()
    pages.assert_clean()


def test_a_finger_gets_the_mode_and_a_queued_message_s_edit_large(
    pages: Pages, tmp_path: Path
) -> None:
    relay = own_relay(tmp_path, demo_delay=0.05)
    try:
        cid = relay.create(title="Fingers")["id"]
        page = pages.open(relay, f"/c/{cid}", **PHONE)
        send_text(page, "slow please")
        send_text(page, "queued")
        edit = user_bubble(page, "queued").get_by_test_id("withdraw")
        targets = [by_id(page, "mode-select"), edit]
        for target in targets:
            expect(target).to_be_visible()
        boxes = [target.bounding_box() or {} for target in targets]
        # With the pointer's sizes both were under 32 px high.
        assert [(b["width"] >= 44, b["height"] >= 32) for b in boxes] == [(True, True)] * 2, boxes
        by_id(page, "stop-button").click()
        relay.wait_idle(cid)
        pages.assert_clean()
    finally:
        pages.close()
        relay.stop()
