"""Shared pieces of the browser tests: watched pages, the pages fixture, locator helpers.

Browser test files are named tests/test_browser*.py; `make test` runs them in their own
pytest process (Playwright's sync API keeps an event loop running).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect

from app.tokens import format_tokens
from tests.relay import TOKEN, LiveRelay, make_settings

T = 15_000  # ms: the longest any expectation or action waits
expect.set_options(timeout=T)

# Records CSP violations in the page itself (Chromium also logs them as console errors).
CSP_WATCH = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`);
});
"""

QUESTION = "Compact this conversation into a new one with carry-over summary?"
IDLE_TEXT = "Applies on the next message (the session restarts once)."


class Pages:
    """Logged-in pages, each in its own browser context, watched for problems."""

    def __init__(self, browser: Browser) -> None:
        self.browser = browser
        self.contexts: list[BrowserContext] = []
        self.pages: list[Page] = []
        self.problems: list[str] = []
        self.dialogs: list[str] = []

    def open(self, relay: LiveRelay, path: str = "/", **context_args: Any) -> Page:
        """A new browser (context), logged in with the token, showing path."""
        context = self.browser.new_context(**context_args)
        self.contexts.append(context)
        page = self.watch(context.new_page())
        page.goto(f"{relay.base}/?token={TOKEN}")
        if path != "/":
            page.goto(relay.base + path)
        return page

    def watch(self, page: Page) -> Page:
        """Watch a page (one open() made, or another tab of its context) for problems."""
        page.set_default_timeout(T)
        name = f"page{len(self.pages) + 1}"
        page.on(
            "console",
            lambda m: (
                self.problems.append(f"{name} console {m.type}: {m.text}")
                if m.type == "error"
                else None
            ),
        )
        page.on("pageerror", lambda e: self.problems.append(f"{name} pageerror: {e}"))
        page.on("dialog", self._on_dialog)
        page.add_init_script(CSP_WATCH)
        self.pages.append(page)
        return page

    def _on_dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def assert_clean(self, *expected: str) -> None:
        """No console error, page error, CSP violation or dialog on any page.

        A problem that contains one of the expected strings is allowed; the filter runs after
        every page was asked for its CSP violations, so messages still in flight are covered.
        """
        for page in self.pages:
            if not page.is_closed():
                violations = page.evaluate("window.__cspViolations || []")
                self.problems.extend(f"CSP violation: {v}" for v in violations)
        problems = [p for p in self.problems if not any(text in p for text in expected)]
        assert problems == [], problems  # say what the page complained of
        assert self.dialogs == []

    def close(self) -> None:
        for context in self.contexts:
            context.close()
        self.contexts.clear()


def own_relay(tmp_path: Path, **overrides: Any) -> LiveRelay:
    """A relay with other settings than the shared fixture's (stop it in finally)."""
    return LiveRelay(make_settings(tmp_path / "data", **overrides)).start()


def by_id(page: Page, testid: str) -> Locator:
    return page.get_by_test_id(testid)


def last_said(page: Page) -> Locator:
    """The last line said to screen readers (#announce, a log of the latest lines)."""
    return by_id(page, "announce").locator(":scope > div").last


def item_menu(page: Page, title: str) -> None:
    """Open the ⋯ menu of the sidebar item with this title."""
    item = page.locator(".conv-item").filter(has=page.get_by_text(title, exact=True))
    item.hover()
    item.get_by_test_id("conv-menu-button").click()
    expect(by_id(page, "conv-menu")).to_be_visible()


def send_text(page: Page, text: str) -> None:
    """Type a one-line message in the composer and press Enter."""
    box = by_id(page, "message-input")
    box.click()
    box.fill(text)
    box.press("Enter")


def user_bubble(page: Page, text: str) -> Locator:
    return by_id(page, "entry-user").filter(has_text=text)


def agent_reply(page: Page, prompt: str) -> Locator:
    """The finished agent message that quotes prompt."""
    quoted = " ".join(prompt.split())
    return page.locator('[data-testid="entry-agent"][data-state="done"]').filter(
        has_text=f"You said: “{quoted}”"
    )


def line(page: Page, text: str) -> Locator:
    return by_id(page, "entry-line").filter(has_text=text)


def conv_id(page: Page) -> int:
    match = re.search(r"/c/(\d+)$", page.url)
    assert match, page.url
    return int(match.group(1))


def context_categories(http: httpx.Client, cid: int) -> list[dict[str, Any]]:
    """The 🧠 modal's categories through this client, once the agent's report holds some."""
    deadline = time.monotonic() + 60
    while not (found := http.get(f"/api/conversations/{cid}/context").json()["categories"]):
        assert time.monotonic() < deadline, "the agent never reported what fills its window"
        time.sleep(0.2)
    return list(found)


def shown_categories(categories: list[dict[str, Any]]) -> list[str]:
    """The modal's "What fills it" items as they read: each name, then its tokens."""
    return [f"{c['name']}{format_tokens(c['tokens'])}" for c in categories]
