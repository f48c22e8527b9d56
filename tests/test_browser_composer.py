"""The composer in a real Chromium on a slow network: it empties as a message is sent, takes the
next while one is on its way (sent after it, in order), and gives back what was not taken."""

from __future__ import annotations

import json
import re

from playwright.sync_api import Locator, Page, Route, expect

from tests.browser import Pages, by_id, send_text, user_bubble
from tests.relay import LiveRelay

MESSAGES = re.compile(r"/api/conversations/\d+/messages$")
REFUSAL = "The database is read-only: nothing was stored."  # what the relay says in a 503


class Network:
    """The page's message POSTs; the first one held (a slow network) until released."""

    def __init__(self, page: Page) -> None:
        self.held: list[Route] = []
        self.posted: list[str] = []  # the texts, in the order the page sent them
        page.route(MESSAGES, self._route)

    def _route(self, route: Route) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        self.posted.append(json.loads(route.request.post_data or "{}")["text"])
        if len(self.posted) == 1:
            self.held.append(route)  # on its way until release()
        else:
            route.continue_()

    def release(self, *, refused: bool = False) -> None:
        """Let the held POST reach the relay, or answer it as a relay that cannot store does."""
        for route in self.held:
            if refused:
                body = json.dumps({"detail": REFUSAL})
                route.fulfill(status=503, content_type="application/json", body=body)
            else:
                route.continue_()
        self.held.clear()


def _user_texts(relay: LiveRelay, cid: int) -> list[str]:
    return [e["text"] for e in relay.get(cid)["timeline"] if e["kind"] == "user"]


def _composer(pages: Pages, relay: LiveRelay, title: str) -> tuple[int, Page, Network, Locator]:
    """A new conversation open in a page whose message POSTs are watched; its composer."""
    cid = relay.create(title=title)["id"]
    page = pages.open(relay, f"/c/{cid}")
    return cid, page, Network(page), by_id(page, "message-input")


def test_a_message_typed_while_one_is_on_its_way_is_sent_after_it(
    pages: Pages, relay: LiveRelay
) -> None:
    cid, page, network, box = _composer(pages, relay, "Type ahead")

    send_text(page, "first, on a slow network")
    expect(box).to_have_value("")  # emptied at once: what is typed next is a new message
    expect(by_id(page, "send-button")).to_be_disabled()  # nothing to send in it now
    send_text(page, "second, typed meanwhile")
    expect(box).to_have_value("")
    page.wait_for_timeout(300)
    assert network.posted == ["first, on a slow network"]  # the second waits for the first
    assert _user_texts(relay, cid) == []

    network.release()
    expect(user_bubble(page, "second, typed meanwhile")).to_be_visible()
    relay.wait_for(cid, lambda v: len([e for e in v["timeline"] if e["kind"] == "agent"]) == 2)
    assert network.posted == ["first, on a slow network", "second, typed meanwhile"]
    assert _user_texts(relay, cid) == ["first, on a slow network", "second, typed meanwhile"]
    expect(by_id(page, "entry-user")).to_have_text(
        ["first, on a slow network", "second, typed meanwhile"]
    )
    expect(box).to_have_value("")
    pages.assert_clean()


def test_a_refused_message_goes_back_to_the_composer_with_the_one_after_it(
    pages: Pages, relay: LiveRelay
) -> None:
    cid, page, network, box = _composer(pages, relay, "Refused")

    send_text(page, "refused first")
    send_text(page, "waiting second")
    expect(box).to_have_value("")
    box.press_sequentially("typed meanwhile")  # not sent: it stays below what comes back
    network.release(refused=True)
    expect(by_id(page, "composer-error")).to_contain_text(REFUSAL)
    # Both back where they were written, in order, the second never sent; nothing typed lost.
    expect(box).to_have_value("refused first\nwaiting second\ntyped meanwhile")
    expect(by_id(page, "send-button")).to_be_enabled()
    page.wait_for_timeout(300)
    assert network.posted == ["refused first"]
    assert _user_texts(relay, cid) == []
    # The page logged the refused POST as a failed resource load: that was the point.
    pages.assert_clean("status of 503")
