"""What a tab meets when another tab, or time away, changed its conversation (found by an
exploratory run): a /compact or an archive elsewhere keeps what was typed, and a tab that was
disconnected follows a compaction or a delete when it comes back."""

from __future__ import annotations

import re
import time
from pathlib import Path

from playwright.sync_api import Page, Route, WebSocketRoute, expect

from tests.browser import Pages, by_id
from tests.relay import LiveRelay, make_settings

DRAFT = "A long message I was carefully typing"


class Cuttable:
    """The page's sockets to the relay, which the test cuts off and lets through again."""

    def __init__(self, page: Page) -> None:
        self.open: list[WebSocketRoute] = []
        self.held: list[WebSocketRoute] = []
        self.cut = False
        page.route_web_socket(re.compile(r"/ws$"), self._route)

    def _route(self, route: WebSocketRoute) -> None:
        if self.cut:
            self.held.append(route)  # open for the page, silent: no hello yet
            return
        route.connect_to_server()
        self.open.append(route)

    def cut_off(self) -> None:
        """Close the page's sockets; new ones wait."""
        self.cut = True
        for route in self.open:
            route.close()
        self.open.clear()

    def let_through(self) -> None:
        """Join the waiting sockets to the relay."""
        self.cut = False
        for route in self.held:
            route.connect_to_server()
        self.open += self.held
        self.held.clear()


def typed(page: Page) -> None:
    box = by_id(page, "message-input")
    box.fill(DRAFT)
    expect(box).to_have_value(DRAFT)


def test_a_draft_follows_a_compact_made_in_another_tab(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Typing here")["id"]
    page = pages.open(relay, f"/c/{cid}")
    typed(page)
    compacted = relay.send(cid, "/compact")  # as another tab's confirmed /compact
    assert compacted.status_code == 201, compacted.text
    new = compacted.json()["compacted_into"]["id"]
    expect(page).to_have_url(f"{relay.base}/c/{new}")
    box = by_id(page, "message-input")
    expect(box).to_have_value(DRAFT)  # before: empty, text gone
    expect(box).to_be_focused()  # the keyboard goes on typing there (before: lost to the page)
    page.keyboard.type(", and more")
    expect(box).to_have_value(f"{DRAFT}, and more")
    page.go_back()
    expect(by_id(page, "archived-notice")).to_be_visible()
    expect(by_id(page, "composer")).to_be_hidden()  # the text moved on; nothing left here
    pages.assert_clean()


def test_a_message_on_its_way_while_another_tab_compacts_comes_back_in_the_new_one(
    pages: Pages, relay: LiveRelay
) -> None:
    # Found by a hostile review: a message whose POST was slow, refused because another tab's
    # /compact archived its conversation meanwhile, went into the archived one's draft (read
    # only), and the tab said "This conversation is archived" in the new one.
    cid = relay.create(title="Compacted under a slow send")["id"]
    page = pages.open(relay, f"/c/{cid}")
    held: list[Route] = []
    page.route(f"**/api/conversations/{cid}/messages", lambda route: held.append(route))
    box = by_id(page, "message-input")
    box.fill("sent on a slow network")
    box.press("Enter")
    expect(box).to_have_value("")
    deadline = time.monotonic() + 15
    while not held:  # the POST is on its way, held
        assert time.monotonic() < deadline, "the message was never posted"
        page.wait_for_timeout(50)
    compacted = relay.send(cid, "/compact")  # another tab's
    assert compacted.status_code == 201, compacted.text
    new = compacted.json()["compacted_into"]["id"]
    expect(page).to_have_url(f"{relay.base}/c/{new}")
    expect(by_id(page, "title")).to_have_text("Compacted under a slow send (compacted)")
    held[0].continue_()  # it reaches the relay now: 409, the conversation is archived
    expect(box).to_have_value("sent on a slow network")
    said = (
        "The conversation was compacted before your message reached it: the message is back"
        " in the new one's composer, to send again."
    )
    expect(by_id(page, "composer-error")).to_have_text(said)
    assert [e for e in relay.get(cid)["timeline"] if e["kind"] == "user"] == []
    assert [e for e in relay.get(new)["timeline"] if e["kind"] == "user"] == []  # not sent
    pages.assert_clean("409")


def test_a_draft_stays_readable_when_another_tab_archives(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Archived while typed")["id"]
    page = pages.open(relay, f"/c/{cid}")
    typed(page)
    assert relay.http.post(f"/api/conversations/{cid}/archive").status_code == 200
    expect(by_id(page, "archived-notice")).to_be_visible()
    box = by_id(page, "message-input")
    expect(box).to_be_visible()  # before: hidden, with the text inside
    expect(box).to_have_value(DRAFT)
    expect(box).not_to_be_editable()
    expect(by_id(page, "send-button")).to_be_disabled()
    pages.assert_clean()


def left_then_deleted(page: Page, relay: LiveRelay) -> int:
    """Text typed in a conversation, the tab gone to another, the first deleted elsewhere."""
    gone = relay.create(title="Typed, left, deleted")["id"]
    stay = relay.create(title="Where I went")["id"]
    page.goto(f"{relay.base}/c/{gone}")
    typed(page)
    by_id(page, "conversation-item").filter(has_text="Where I went").click()
    expect(page).to_have_url(f"{relay.base}/c/{stay}")
    assert relay.http.delete(f"/api/conversations/{gone}").status_code == 204
    expect(page.locator("#toast")).to_contain_text(
        "“Typed, left, deleted” was deleted; what you had typed in it is kept."
    )
    return gone


def test_a_draft_left_in_a_conversation_deleted_elsewhere_is_kept(
    pages: Pages, relay: LiveRelay
) -> None:
    # Found by a hostile review: text typed in a conversation the tab then left vanished when
    # another tab deleted that conversation (only the open conversation's text was kept).
    page = pages.open(relay)
    gone = left_then_deleted(page, relay)
    page.locator("#toast").get_by_role("button", name="Show it").click()
    expect(page).to_have_url(f"{relay.base}/c/{gone}")
    expect(page.locator("#missing-text")).to_have_text("This conversation was deleted.")
    expect(by_id(page, "missing-draft")).to_have_value(DRAFT)
    page.reload()  # the text is still there, this tab's until it closes
    expect(page.locator("#missing-text")).to_have_text("This conversation does not exist.")
    expect(by_id(page, "missing-draft")).to_have_value(DRAFT)
    pages.assert_clean("404")  # the deleted conversation asked for, as intended


def test_the_kept_draft_s_toast_waits_for_the_keyboard(pages: Pages, relay: LiveRelay) -> None:
    # Found by a hostile review: the toast's button went away after 12 s, and from the
    # keyboard it is the page's last stop: the text was out of reach of someone tabbing to it.
    page = pages.open(relay)
    page.clock.install()  # (before the conversation's page loads: its timers are the clock's)
    gone = left_then_deleted(page, relay)
    page.clock.fast_forward("01:00")
    toast = page.locator("#toast")
    expect(toast).to_be_visible()
    by_id(page, "message-input").focus()
    show = toast.get_by_role("button", name="Show it")
    for _ in range(12):
        page.keyboard.press("Tab")
        if show.evaluate("button => button === document.activeElement"):
            break
    expect(show).to_be_focused()
    page.keyboard.press("Tab")
    expect(toast.get_by_role("button", name="Dismiss")).to_be_focused()
    page.keyboard.press("Escape")
    expect(toast).to_be_hidden()
    expect(by_id(page, "message-input")).to_be_focused()  # back where it was typing
    page.goto(f"{relay.base}/c/{gone}")
    expect(by_id(page, "missing-draft")).to_have_value(DRAFT)
    pages.assert_clean("404")


def test_a_tab_away_during_a_compact_follows_it_when_it_comes_back(
    pages: Pages, tmp_path: Path
) -> None:
    # A short idle timeout: the relay forgets the archived conversation's events within 3 s
    # (the default keeps a conversation that had no turn for the whole timeout).
    with LiveRelay(make_settings(tmp_path / "data", agent_idle_timeout=3)) as relay:
        away_during_a_compact(pages, relay)


def away_during_a_compact(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Away")["id"]
    page = pages.open(relay, f"/c/{cid}")
    sockets = Cuttable(page)
    page.reload()  # its socket now through the route
    expect(by_id(page, "message-input")).to_be_editable()
    typed(page)
    sockets.cut_off()
    compacted = relay.send(cid, "/compact")
    assert compacted.status_code == 201, compacted.text
    new = compacted.json()["compacted_into"]["id"]
    hub = relay.supervisor.hub
    # Once the relay forgot the archived conversation's events, the tab gets a snapshot,
    # without the 'compacted' event, when it comes back.
    waited = 0
    while hub.knows(cid) and waited < 30_000:
        page.wait_for_timeout(250)
        waited += 250
    assert not hub.knows(cid), "the relay still keeps the old conversation's events"
    sockets.let_through()
    expect(page).to_have_url(f"{relay.base}/c/{new}", timeout=30_000)
    expect(by_id(page, "message-input")).to_have_value(DRAFT)
    expect(by_id(page, "message-input")).to_be_focused()
    pages.assert_clean()


def test_a_tab_away_during_a_delete_drops_the_conversation_when_it_comes_back(
    pages: Pages, relay: LiveRelay
) -> None:
    cid = relay.create(title="Deleted while away")["id"]
    page = pages.open(relay, f"/c/{cid}")
    sockets = Cuttable(page)
    page.reload()
    expect(by_id(page, "conversation-item")).to_have_text(["Deleted while away"])
    other = relay.create(title="Also deleted while away")["id"]
    expect(by_id(page, "conversation-item")).to_have_count(2)
    sockets.cut_off()
    assert relay.http.delete(f"/api/conversations/{cid}").status_code == 204
    assert relay.http.delete(f"/api/conversations/{other}").status_code == 204
    relay.create(title="Made while away")
    sockets.let_through()
    expect(page.locator("#missing-text")).to_have_text("This conversation was deleted.")
    # before: both still listed (the open one shown as live); what was made meanwhile shows
    expect(by_id(page, "conversation-item")).to_have_text(["Made while away"])
    pages.assert_clean()
