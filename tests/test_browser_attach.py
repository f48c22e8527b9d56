"""Images attached in Chromium: 📎, paste and drop; thumbnails before and after sending."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from playwright.sync_api import APIResponse, Locator, Page, Route, expect

from tests.browser import Pages, by_id, user_bubble
from tests.images import GIF, png
from tests.relay import LiveRelay

# A paste or a drop as the browser makes them: a DataTransfer holding a file (and text, when
# given). A drop comes after a dragover, which must be taken (else the browser opens the file).
GIVE_FILE = """([kind, b64, name, type, text]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], name, { type }));
  if (text) data.setData('text/plain', text);
  const init = { bubbles: true, cancelable: true };
  if (kind === 'paste') {
    const event = new ClipboardEvent('paste', { clipboardData: data, ...init });
    document.getElementById('message-input').dispatchEvent(event);
    return event.defaultPrevented;
  }
  const where = document.getElementById(kind === 'drop' ? 'timeline' : 'sidebar') || document.body;
  const over = new DragEvent('dragover', { dataTransfer: data, ...init });
  where.dispatchEvent(over);
  const drop = new DragEvent('drop', { dataTransfer: data, ...init });
  where.dispatchEvent(drop);
  return over.defaultPrevented && drop.defaultPrevented;
}"""


def give(page: Page, kind: str, content: bytes, name: str, media_type: str, text: str = "") -> bool:
    """Paste, drop (on the timeline) or drop-elsewhere (on the sidebar) a file; whether the
    page took the events (a browser did not handle them itself)."""
    b64 = base64.b64encode(content).decode()
    return bool(page.evaluate(GIVE_FILE, [kind, b64, name, media_type, text]))


def loaded(images: Locator) -> None:
    """Every image shown has loaded (the relay served it to this page)."""
    expect(images.first).to_be_visible()
    for n in range(images.count()):
        expect(images.nth(n)).to_have_js_property("complete", True)
        assert images.nth(n).evaluate("i => i.naturalWidth") > 0


def uploaded(page: Page, count: int) -> None:
    """count images wait, and the page's own uploads are answered: one shows (from the relay's
    event) before its upload's answer, and Enter then says an image is still uploading."""
    expect(by_id(page, "attached")).to_have_count(count)
    expect(by_id(page, "attached-uploading")).to_have_count(0)


def opened(pages: Pages, relay: LiveRelay) -> tuple[Page, int]:
    cid = relay.create(title="Pictures")["id"]
    page = pages.open(relay, f"/c/{cid}")
    expect(by_id(page, "title")).to_have_text("Pictures")
    return page, cid


def test_an_image_picked_with_the_clip_goes_with_the_message(
    pages: Pages, relay: LiveRelay, tmp_path: Path
) -> None:
    page, cid = opened(pages, relay)
    picture = tmp_path / "red.png"
    picture.write_bytes(png(8, 8))
    expect(by_id(page, "attach-button")).to_be_visible()
    by_id(page, "attach-input").set_input_files(str(picture))
    uploaded(page, 1)
    loaded(by_id(page, "attached").locator("img"))
    box = by_id(page, "message-input")
    box.fill("what colour?")
    box.press("Enter")
    expect(by_id(page, "attached")).to_have_count(0)  # they went with it
    bubble = user_bubble(page, "what colour?")
    expect(bubble.get_by_test_id("sent-image")).to_have_count(1)
    loaded(bubble.get_by_test_id("sent-image"))
    reply = by_id(page, "entry-agent").filter(has_text="With 1 image (image/png).")
    expect(reply).to_have_count(1)
    # Another tab (a reload) shows the sent image from the relay.
    page.reload()
    loaded(user_bubble(page, "what colour?").get_by_test_id("sent-image"))
    assert relay.http.get(f"/api/conversations/{cid}/attachments").json()["attachments"] == []
    pages.assert_clean()


def test_pasted_and_dropped_images_wait_until_sent_or_removed(
    pages: Pages, relay: LiveRelay
) -> None:
    page, cid = opened(pages, relay)
    assert give(page, "paste", png(), "screenshot.png", "image/png")  # not pasted as text
    expect(by_id(page, "attached")).to_have_count(1)  # uploaded first (two uploads may cross)
    assert give(page, "drop", GIF, "dot.gif", "image/gif")
    uploaded(page, 2)
    loaded(by_id(page, "attached").locator("img"))
    # Kept by the relay, not the page: a reload shows them again.
    page.reload()
    expect(by_id(page, "attached")).to_have_count(2)
    by_id(page, "attached-remove").first.click()
    expect(by_id(page, "attached")).to_have_count(1)
    waiting = relay.http.get(f"/api/conversations/{cid}/attachments").json()["attachments"]
    assert [image["media_type"] for image in waiting] == ["image/gif"]
    # With an image, /compact is text for the agent: no carry-over preview, no new conversation.
    box = by_id(page, "message-input")
    box.fill("/compact")
    box.press("Enter")
    expect(by_id(page, "entry-agent").filter(has_text="With 1 image (image/gif).")).to_have_count(1)
    expect(by_id(page, "compact-dialog")).to_be_hidden()
    assert relay.get(cid)["status"] == "active"
    pages.assert_clean()


def test_what_is_not_an_image_is_said_and_text_pastes_as_text(
    pages: Pages, relay: LiveRelay, tmp_path: Path
) -> None:
    page, _cid = opened(pages, relay)
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    by_id(page, "attach-input").set_input_files(str(notes))
    expect(by_id(page, "composer-error")).to_have_text(
        "notes.txt is not a PNG, JPEG, GIF or WebP image."
    )
    expect(by_id(page, "attached")).to_have_count(0)
    # What only the relay finds out (from the bytes) names the file too: several may be picked.
    (tmp_path / "cut.png").write_bytes(png(64, 64)[:60])
    (tmp_path / "fake.png").write_text("not a picture")
    for name, said in [
        ("cut.png", "cut.png cannot be read: it is damaged or cut short."),
        ("fake.png", "fake.png is not a PNG, JPEG, GIF or WebP image."),
    ]:
        by_id(page, "attach-input").set_input_files(str(tmp_path / name))
        expect(by_id(page, "composer-error")).to_have_text(said)
    expect(by_id(page, "attached")).to_have_count(0)
    # A paste with text too (a spreadsheet's cells also offer a picture of them) is text.
    assert give(page, "paste", png(), "cells.png", "image/png", text="a\tb") is False
    expect(by_id(page, "attached")).to_have_count(0)
    # A file dropped outside the conversation is taken, not opened in place of the page.
    assert give(page, "elsewhere", png(), "stray.png", "image/png")
    expect(by_id(page, "attached")).to_have_count(0)
    assert page.url.endswith(f"/c/{_cid}")
    pages.assert_clean("status of 422", "status of 415")


def test_a_message_taken_back_brings_its_image_back(pages: Pages, relay: LiveRelay) -> None:
    page, _cid = opened(pages, relay)
    box = by_id(page, "message-input")
    box.fill("slow")
    box.press("Enter")  # a long turn: the next message waits in the queue
    give(page, "paste", png(), "shot.png", "image/png")
    uploaded(page, 1)
    box.fill("look at this")
    box.press("Enter")
    queued = user_bubble(page, "look at this")
    expect(queued.get_by_test_id("queued-badge")).to_be_visible()
    expect(queued.get_by_test_id("sent-image")).to_have_count(1)
    queued.get_by_test_id("withdraw").click()
    expect(box).to_have_value("look at this")
    expect(by_id(page, "attached")).to_have_count(1)  # back with its text
    pages.assert_clean()


def test_every_tab_shows_the_images_waiting(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Two tabs")["id"]
    first = pages.open(relay, f"/c/{cid}")
    second = pages.open(relay, f"/c/{cid}")
    for page in (first, second):
        expect(by_id(page, "title")).to_have_text("Two tabs")
    give(first, "paste", png(), "shot.png", "image/png")
    give(first, "paste", GIF, "dot.gif", "image/gif")
    uploaded(first, 2)
    expect(by_id(second, "attached")).to_have_count(2)  # told, not reloaded
    remove = by_id(second, "attached-remove").first
    remove.focus()
    remove.press("Enter")
    expect(by_id(first, "attached")).to_have_count(1)
    # The focus stays on the images: the next one's ✕ (this one was removed).
    expect(by_id(second, "attached-remove")).to_be_focused()
    # The other tab sends it: this one no longer offers it.
    box = by_id(second, "message-input")
    box.fill("with the gif")
    box.press("Enter")
    expect(by_id(first, "attached")).to_have_count(0)
    expect(user_bubble(first, "with the gif").get_by_test_id("sent-image")).to_have_count(1)
    pages.assert_clean()


def test_a_message_the_relay_refuses_gives_its_images_back(pages: Pages, relay: LiveRelay) -> None:
    page, _cid = opened(pages, relay)
    give(page, "paste", png(), "shot.png", "image/png")
    uploaded(page, 1)
    box = by_id(page, "message-input")
    box.fill("no words either")
    page.route(
        re.compile(r"/api/conversations/\d+/messages$"),
        lambda route: route.fulfill(status=409, json={"detail": "Refused for the test."}),
    )
    box.press("Enter")
    expect(by_id(page, "composer-error")).to_have_text("Refused for the test.")
    expect(box).to_have_value("no words either")
    expect(by_id(page, "attached")).to_have_count(1)
    loaded(by_id(page, "attached").locator("img"))
    page.unroute(re.compile(r"/api/conversations/\d+/messages$"))
    # Images and no words: said, not sent silently nor ignored.
    box.fill("")
    box.press("Enter")
    expect(by_id(page, "composer-error")).to_have_text("Add a few words to go with the images.")
    pages.assert_clean("409")


def test_no_clip_where_the_agent_takes_no_images(
    pages: Pages, relay: LiveRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-key")
    cid = relay.create(provider="deepseek", title="No images")["id"]
    page = pages.open(relay, f"/c/{cid}")
    expect(by_id(page, "title")).to_have_text("No images")
    expect(by_id(page, "provider-badge")).to_have_text("DeepSeek")
    expect(by_id(page, "attach-button")).to_be_hidden()
    assert (
        give(page, "paste", png(), "shot.png", "image/png") is False
    )  # pasted as the browser does
    assert give(page, "drop", png(), "shot.png", "image/png")  # taken: the page stays
    expect(by_id(page, "attached")).to_have_count(0)
    assert relay.http.get(f"/api/conversations/{cid}/attachments").json()["attachments"] == []
    pages.assert_clean()


def test_five_images_go_with_a_message_and_the_rest_wait(pages: Pages, relay: LiveRelay) -> None:
    page, _cid = opened(pages, relay)
    for n in range(7):
        give(page, "paste", png(2 + n, 2), f"shot{n}.png", "image/png")
    uploaded(page, 7)
    box = by_id(page, "message-input")
    box.fill("the first five")
    box.press("Enter")
    expect(page.locator("#toast")).to_have_text(
        "5 images go with this message; 2 more wait for the next one."
    )
    bubble = user_bubble(page, "the first five")
    expect(bubble.get_by_test_id("sent-image")).to_have_count(5)
    expect(by_id(page, "attached")).to_have_count(2)
    pages.assert_clean()


def test_the_command_menu_says_compact_is_text_while_an_image_waits(
    pages: Pages, relay: LiveRelay
) -> None:
    """An image from another tab made Enter on /compact send it as text (a dogfood run): the
    menu said "Start a new conversation…"."""
    page, cid = opened(pages, relay)
    box = by_id(page, "message-input")
    box.fill("/c")
    items = by_id(page, "command-menu").get_by_test_id("command-item")
    expect(items).to_have_count(2)
    expect(items.first).to_contain_text("Start a new conversation with a carry-over summary")
    relay.attach(cid, png())  # another tab's upload: this menu is open meanwhile
    expect(by_id(page, "attached")).to_have_count(1)
    as_text = "Sent to the agent as text while images are attached"
    expect(items).to_have_text([f"/compact{as_text}", f"/clear{as_text}"])
    box.fill("/h")
    expect(items).to_contain_text(["Ask the agent to save a handoff"])  # the others unchanged
    by_id(page, "attached-remove").click()
    expect(by_id(page, "attached")).to_have_count(0)
    box.fill("/compact")
    expect(items.first).to_contain_text("Start a new conversation with a carry-over summary")
    pages.assert_clean()


def test_a_list_answered_late_does_not_undo_a_newer_one(pages: Pages, relay: LiveRelay) -> None:
    """The composer's first read of the images waiting, answered after an upload's event had
    already shown the newer list, put the older one back (found by a review)."""
    cid = relay.create(title="Late list")["id"]
    listed = re.compile(rf"/api/conversations/{cid}/attachments$")
    held: list[tuple[Route, APIResponse]] = []
    page = pages.open(relay)  # logged in; the conversation is opened below

    def hold(route: Route) -> None:
        held.append((route, route.fetch()))  # the relay's answer now (nothing waits), kept back

    def live() -> list[tuple[Route, APIResponse]]:
        # The list page (/) opens the newest conversation, this one, and may ask for its list
        # before the goto below cancels that request: fulfilling it would reach no page.
        return [(route, answer) for route, answer in held if route.request.failure is None]

    page.route(listed, hold)
    page.goto(f"{relay.base}/c/{cid}")
    expect(by_id(page, "title")).to_have_text("Late list")
    while not live():
        page.wait_for_timeout(20)
    relay.attach(cid, png())  # its event shows it
    expect(by_id(page, "attached")).to_have_count(1)
    route, old = live()[0]
    with page.expect_response(listed):
        route.fulfill(response=old)  # the list from before the upload: empty
    page.evaluate("() => new Promise((done) => setTimeout(done, 100))")
    expect(by_id(page, "attached")).to_have_count(1)


def test_an_image_that_cannot_be_read_says_so(pages: Pages, relay: LiveRelay) -> None:
    """Not the browser's broken-image icon: words, in a sent message and above the box."""
    page, cid = opened(pages, relay)
    sent = relay.attach(cid, png())
    response = relay.http.post(
        f"/api/conversations/{cid}/messages", json={"text": "look", "attachments": [sent]}
    )
    assert response.status_code == 202, response.text
    relay.attach(cid, GIF)  # waiting
    page.route(re.compile(r"/api/attachments/\d+$"), lambda route: route.fulfill(status=404))
    page.reload()
    bubble = user_bubble(page, "look")
    expect(bubble.get_by_test_id("image-gone")).to_have_text("Image unavailable")
    expect(bubble.get_by_test_id("sent-image")).to_have_count(0)
    expect(by_id(page, "attached").get_by_test_id("image-gone")).to_have_count(1)
    expect(by_id(page, "attached-remove")).to_have_count(1)  # still removable
    pages.assert_clean("404")
