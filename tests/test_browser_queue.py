"""A queued message taken back before the agent gets it (Edit, or ↑ in an empty box), in
Chromium."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Page, Route, expect

from tests.browser import Pages, agent_reply, by_id, line, own_relay, send_text, user_bubble
from tests.relay import LiveRelay

WITHDRAW = re.compile(r"/api/conversations/\d+/messages/\d+$")
TOO_LATE = "This message has already gone to the agent; it can no longer be taken back."
TAKEN_ELSEWHERE = (
    "This message is no longer in this queue: taken back in another tab, or moved by /compact."
)


def busy(pages: Pages, relay: LiveRelay, *queued: str) -> tuple[int, Page]:
    """A tab whose conversation streams a slow reply, with these messages queued behind it."""
    cid = relay.create(title="Queue")["id"]
    page = pages.open(relay, f"/c/{cid}")
    send_text(page, "slow please")
    expect(page.locator('[data-testid="entry-agent"][data-state="streaming"]')).to_have_count(1)
    for text in queued:
        send_text(page, text)
        expect(user_bubble(page, text)).to_have_attribute("data-state", "queued")
    return cid, page


def user_texts(relay: LiveRelay, cid: int) -> list[str]:
    """What the relay holds as the user's messages, once the turns have ended."""
    return [e["text"] for e in relay.wait_idle(cid)["timeline"] if e["kind"] == "user"]


def test_edit_takes_a_queued_message_back_into_the_box_in_every_tab(
    pages: Pages, tmp_path: Path
) -> None:
    relay = own_relay(tmp_path, demo_delay=0.05)  # "slow" streams ~230 pieces: ~12 s
    try:
        cid, page = busy(pages, relay, "then this")
        other = pages.open(relay, f"/c/{cid}")
        expect(user_bubble(other, "then this")).to_have_attribute("data-state", "queued")
        box = by_id(page, "message-input")
        box.fill("typed since")

        user_bubble(page, "then this").get_by_test_id("withdraw").click()
        # Gone from both tabs; the text is back in the box, before what was typed since.
        expect(user_bubble(page, "then this")).to_have_count(0)
        expect(user_bubble(other, "then this")).to_have_count(0)
        expect(box).to_have_value("then this\ntyped since")
        expect(box).to_be_focused()
        expect(by_id(other, "message-input")).to_have_value("")

        by_id(page, "stop-button").click()
        expect(line(page, "Interrupted by the user.")).to_have_count(1)
        assert user_texts(relay, cid) == ["slow please"]  # the agent never got it
        expect(agent_reply(page, "then this")).to_have_count(0)
        pages.assert_clean()
    finally:
        pages.close()
        relay.stop()


def test_arrow_up_in_an_empty_box_takes_back_the_last_queued_message(
    pages: Pages, tmp_path: Path
) -> None:
    relay = own_relay(tmp_path, demo_delay=0.05)
    try:
        cid, page = busy(pages, relay, "first queued", "second queued")
        box = by_id(page, "message-input")
        box.press("ArrowUp")
        expect(box).to_have_value("second queued")
        expect(user_bubble(page, "second queued")).to_have_count(0)
        box.press("ArrowUp")  # the box is not empty now: the caret moves, nothing is taken
        box.press("End")
        box.type(", edited")
        box.press("Enter")  # queued again, edited, after the first
        edited = user_bubble(page, "second queued, edited")
        expect(edited).to_have_attribute("data-state", "queued")
        expect(user_bubble(page, "first queued")).to_have_attribute("data-state", "queued")

        by_id(page, "stop-button").click()
        expect(agent_reply(page, "second queued, edited")).to_have_count(1)
        texts = ["slow please", "first queued", "second queued, edited"]
        assert user_texts(relay, cid) == texts
        pages.assert_clean()
    finally:
        pages.close()
        relay.stop()


def test_an_edit_that_comes_too_late_says_so_and_takes_nothing(
    pages: Pages, tmp_path: Path
) -> None:
    relay = own_relay(tmp_path, demo_delay=0.05)
    try:
        cid, page = busy(pages, relay, "then this")
        held: list[Route] = []
        page.route(WITHDRAW, lambda route: held.append(route))  # a slow network
        user_bubble(page, "then this").get_by_test_id("withdraw").click()
        expect(user_bubble(page, "then this").get_by_test_id("withdraw")).to_be_disabled()

        by_id(page, "stop-button").click()  # the queue moves on: the message goes out
        expect(user_bubble(page, "then this")).to_have_attribute("data-state", "sent")
        assert len(held) == 1
        held[0].continue_()
        expect(page.locator("#toast")).to_have_text(TOO_LATE)
        expect(by_id(page, "message-input")).to_have_value("")
        expect(agent_reply(page, "then this")).to_have_count(1)
        assert user_texts(relay, cid) == ["slow please", "then this"]
        pages.assert_clean("409")
    finally:
        pages.close()
        relay.stop()


def test_an_edit_of_a_message_another_tab_took_back_says_so(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path, demo_delay=0.05)
    try:
        cid, page = busy(pages, relay, "then this")
        other = pages.open(relay, f"/c/{cid}")
        held: list[Route] = []
        other.route(WITHDRAW, lambda route: held.append(route))  # a slow network
        user_bubble(other, "then this").get_by_test_id("withdraw").click()
        user_bubble(page, "then this").get_by_test_id("withdraw").click()
        expect(by_id(page, "message-input")).to_have_value("then this")
        expect(user_bubble(other, "then this")).to_have_count(0)
        assert len(held) == 1
        held[0].continue_()
        expect(other.locator("#toast")).to_have_text(TAKEN_ELSEWHERE)
        expect(by_id(other, "message-input")).to_have_value("")  # the text is in one box only
        by_id(page, "stop-button").click()
        assert user_texts(relay, cid) == ["slow please"]
        pages.assert_clean("404")
    finally:
        pages.close()
        relay.stop()
