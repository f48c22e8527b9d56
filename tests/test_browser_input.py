"""Bad input in a real Chromium: text direction, invisible titles, tables under the CSP, /docs."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from playwright.sync_api import Locator, Page, expect

from app.agents.base import AgentEvent, AgentSpec, MessageDone, PermissionRequest, TurnDone
from tests.browser import Pages, by_id, send_text
from tests.relay import LiveRelay
from tests.stand_in import StandIn

REFUSED = (
    "page1 console error: Failed to load resource: "
    "the server responded with a status of 422 (Unprocessable Entity)"
)
RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: reverses what follows it, up to the paragraph's end


class EchoAgent(StandIn):
    """A stand-in agent that answers with the prompt as written (Markdown and all).

    "ask permission" asks to run a tool whose name carries a U+202E.
    """

    def __init__(self, spec: AgentSpec) -> None:
        super().__init__(spec)
        self.turns = 0

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Echo the prompt (after a permission question when asked for one)."""
        self.turns += 1
        if "ask permission" in prompt:
            request = PermissionRequest(f"Bash{RLO}", {"command": "ls"}, f"p{self.turns}")
            await self.spec.ask_permission(request)
        yield MessageDone(f"echo{self.turns}", prompt)
        yield TurnDone()


def echoing(relay: LiveRelay) -> LiveRelay:
    relay.supervisor.agent_factory = lambda _provider, spec, _settings: EchoAgent(spec)
    return relay


def char_lefts(locator: Locator, word: str) -> list[float]:
    """Where each character of word is drawn (its left edge), in the text node holding it."""
    script = """(element, word) => {
      const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
      for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const at = node.data.indexOf(word);
        if (at < 0) continue;
        return [...word].map((_, i) => {
          const range = document.createRange();
          range.setStart(node, at + i);
          range.setEnd(node, at + i + 1);
          return range.getBoundingClientRect().left;
        });
      }
      return null;
    }"""
    lefts = locator.evaluate(script, word)
    assert lefts is not None, f"{word!r} not found"
    return list(lefts)


def isolation(locator: Locator) -> tuple[str | None, str]:
    """The element's dir attribute and its computed unicode-bidi."""
    return (
        locator.get_attribute("dir"),
        locator.evaluate("e => getComputedStyle(e).unicodeBidi"),
    )


# ---- 11. U+202E stays inside the text that holds it ---------------------------------------------


def test_override_in_agent_text_does_not_reverse_what_follows(
    pages: Pages, relay: LiveRelay
) -> None:
    cid = echoing(relay).create(title="direction")["id"]
    page = pages.open(relay, f"/c/{cid}")
    send_text(page, "please ask permission")
    card = by_id(page, "entry-activity").filter(has=by_id(page, "permission-allow"))
    # (The override itself is shown as its code in a permission card, since 69518aa.)
    expect(card).to_contain_text("Bash⟨U+202E⟩ wants to run:")
    # The relay's own words after the agent's tool name read left to right.
    lefts = char_lefts(card.locator(".perm-title"), "wants")
    assert lefts == sorted(lefts), lefts
    by_id(page, "permission-deny").click()
    expect(by_id(page, "permission-answer")).to_have_text("Denied")
    relay.wait_idle(cid)
    pages.assert_clean()


def test_override_in_a_message_does_not_reverse_the_demo_reply_around_it(
    pages: Pages, relay: LiveRelay
) -> None:
    cid = relay.create(title="quote")["id"]
    page = pages.open(relay, f"/c/{cid}")
    send_text(page, f"hello {RLO}world 123")
    reply = by_id(page, "entry-agent").locator(".md p").first
    expect(reply).to_contain_text("You said:")
    relay.wait_idle(cid)
    # The demo's closing quote stays after the quoted text, and the override reverses its own
    # word only ("world"; "123" after it reads left to right: before, it was reversed too).
    text, lefts = reply.evaluate(
        """p => {
          const walker = document.createTreeWalker(p, NodeFilter.SHOW_TEXT);
          const text = [], lefts = [];
          while (walker.nextNode()) {
            const node = walker.currentNode;
            for (let i = 0; i < node.data.length; i++) {
              const range = document.createRange();
              range.setStart(node, i);
              range.setEnd(node, i + 1);
              text.push(node.data[i]);
              lefts.push(range.getBoundingClientRect().left);
            }
          }
          return [text.join(''), lefts];
        }"""
    )
    quote = text.index("\u201d")  # ” (the line's end: the demo's own words follow it)
    assert lefts[quote] == max(lefts[: quote + 1]), list(zip(text, lefts, strict=True))
    at = text.index("world")
    assert lefts[at : at + 5] == sorted(lefts[at : at + 5], reverse=True)  # drawn reversed
    digits = text.index("123")
    assert lefts[digits : digits + 3] == sorted(lefts[digits : digits + 3])
    pages.assert_clean()


def test_user_agent_and_title_text_is_isolated(pages: Pages, relay: LiveRelay) -> None:
    title = f"abc{RLO}def"
    cid = relay.create(title=title)["id"]
    page = pages.open(relay, f"/c/{cid}")
    message = f"hello {RLO}world"
    send_text(page, message)
    expect(by_id(page, "entry-agent")).to_have_attribute("data-state", "done")
    relay.wait_idle(cid)
    isolated = ("auto", "isolate")
    user_text = by_id(page, "entry-user").locator(".plain")
    expect(user_text).to_have_js_property("textContent", message)
    assert isolation(user_text) == isolated
    assert isolation(by_id(page, "entry-agent").locator(".md")) == isolated
    assert isolation(by_id(page, "conversation-item").locator(".conv-title")) == isolated
    assert isolation(by_id(page, "title"))[0] == "auto"
    # Plain-text places cannot hold an element: the title is wrapped in FSI … PDI there.
    expect(page).to_have_title(f"\u2068{title}\u2069 · oarlock")
    tooltip = by_id(page, "conversation-item").get_attribute("title") or ""
    assert tooltip.startswith(f"\u2068{title}\u2069 · Demo (offline) · last active ")
    pages.assert_clean()


# ---- 11. titles that look empty -----------------------------------------------------------------


def test_new_conversation_dialog_refuses_an_invisible_title(pages: Pages, relay: LiveRelay) -> None:
    page = pages.open(relay)
    by_id(page, "new-conversation").click()
    by_id(page, "new-title").fill("\u200b\u200c\u200d")
    by_id(page, "new-provider").select_option("demo")
    by_id(page, "new-create").click()
    expect(by_id(page, "new-error")).to_have_text("The title has no visible character.")
    expect(by_id(page, "new-error")).to_be_visible()
    expect(by_id(page, "new-dialog")).to_be_visible()
    assert relay.http.get("/api/conversations").json()["conversations"] == []
    by_id(page, "new-title").fill("Visible")
    by_id(page, "new-create").click()
    expect(by_id(page, "new-dialog")).to_be_hidden()
    expect(by_id(page, "title")).to_have_text("Visible")
    pages.problems.remove(REFUSED)  # Chromium logs the refused request; nothing else may show
    pages.assert_clean()


def test_renaming_to_an_invisible_title_is_refused(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Kept")["id"]
    page = pages.open(relay, f"/c/{cid}")
    by_id(page, "title").click()
    field = by_id(page, "title-input")
    field.fill("\u2060\ufeff\u200b")
    field.press("Enter")
    expect(
        page.get_by_text("The title was not saved: The title has no visible character.")
    ).to_be_visible()
    expect(by_id(page, "title")).to_have_text("Kept")
    assert relay.get(cid)["title"] == "Kept"
    # What was typed comes back in the field (found by an exploratory run: it was dropped).
    expect(field).to_be_focused()
    expect(field).to_have_value("\u2060\ufeff\u200b")
    field.fill("Kept, then renamed")
    field.press("Enter")
    expect(by_id(page, "title")).to_have_text("Kept, then renamed")
    # The header shows the title before the PATCH is answered: wait for the stored one.
    relay.wait_for(cid, lambda view: view["title"] == "Kept, then renamed", timeout=10)
    pages.problems.remove(REFUSED)  # Chromium logs the refused request; nothing else may show
    pages.assert_clean()


# ---- 20. aligned table columns under the CSP ----------------------------------------------------

TABLE = "| left | centre | right |\n|:-----|:------:|------:|\n| a | b | c |"


def test_aligned_table_renders_without_inline_styles(pages: Pages, relay: LiveRelay) -> None:
    cid = echoing(relay).create(title="table")["id"]
    assert relay.send(cid, TABLE).status_code == 202
    relay.wait_idle(cid)
    page = pages.open(relay, f"/c/{cid}")
    table = by_id(page, "entry-agent").locator(".md table")
    expect(table).to_be_visible()
    aligns = table.locator("td").evaluate_all(
        "cells => cells.map(c => getComputedStyle(c).textAlign)"
    )
    assert aligns == ["left", "center", "right"]
    heads = table.locator("th").evaluate_all(
        "cells => cells.map(c => getComputedStyle(c).textAlign)"
    )
    assert heads == ["left", "center", "right"]
    assert table.locator("[style]").count() == 0
    pages.assert_clean()  # no CSP violation, no console error


# ---- 21. the API docs under the CSP -------------------------------------------------------------


def test_api_docs_page_shows_the_routes(pages: Pages, relay: LiveRelay) -> None:
    page: Page = pages.open(relay, "/docs")
    expect(page).to_have_title("API · oarlock")
    operations = by_id(page, "docs-operation")
    routes = page.locator(".docs-route")
    expect(
        routes.filter(
            has_text=re.compile(r"^POST\s+/api/conversations/\{conversation_id\}/messages$")
        )
    ).to_have_count(1)
    expect(operations.filter(has_text="GET /api/providers")).to_have_count(1)
    expect(page.locator("script")).to_have_count(0)
    link = by_id(page, "openapi-link")
    expect(link).to_have_attribute("href", "/openapi.json")
    assert relay.http.get("/openapi.json").json()["info"]["title"] == "oarlock"
    pages.assert_clean()
