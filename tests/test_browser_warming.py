"""Warming in a real Chromium: reaching the composer with the Tab key starts the agent.

A click or a keystroke in the composer warms (tests/test_browser_memory.py); issue 18 also
asks for a focus of the composer. The focus the relay gives it itself (opening a
conversation) must not warm, or browsing conversations would start every agent.
"""

from __future__ import annotations

from playwright.sync_api import expect

from tests.browser import Pages, by_id
from tests.relay import LiveRelay
from tests.test_browser_memory import GatedDemo, gated

MAX_TABS = 60  # the page's focusable elements before the composer, with room to spare


def test_tabbing_into_the_composer_warms(relay: LiveRelay, pages: Pages) -> None:
    gated(relay)
    GatedDemo.gate.set()
    cid = relay.create(title="Tab to me")["id"]
    page = pages.open(relay, f"/c/{cid}")
    expect(by_id(page, "title")).to_have_text("Tab to me")  # loaded
    state = by_id(page, "agent-state")
    expect(state).to_have_text("asleep")
    page.evaluate("document.activeElement && document.activeElement.blur()")
    for _ in range(MAX_TABS):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "message-input":
            break
        assert GatedDemo.starts == []  # only the composer's focus warms
    else:
        raise AssertionError("the Tab key never reached the composer")
    expect(state).to_have_text("ready")
    assert GatedDemo.starts == [cid]
    pages.assert_clean()
