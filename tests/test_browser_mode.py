"""The permission mode changed from the composer, in Chromium: every tab follows, "Never ask" is
confirmed first, a refusal puts it back and says why, an archived conversation's is read-only."""

from __future__ import annotations

import json
from pathlib import Path

from playwright.sync_api import Page, Route, expect

from tests.browser import Pages, by_id, own_relay, send_text, user_bubble
from tests.relay import LiveRelay
from tests.test_browser_everyday import PHONE


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
