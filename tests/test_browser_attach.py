"""Images attached in Chromium: 📎, paste and drop; thumbnails before and after sending."""

from __future__ import annotations

import base64
from pathlib import Path

from playwright.sync_api import Locator, Page, expect

from tests.browser import Pages, by_id, user_bubble
from tests.images import GIF, png
from tests.relay import LiveRelay

# A paste or a drop as the browser makes them: a DataTransfer holding a file.
GIVE_FILE = """([kind, b64, name, type]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], name, { type }));
  const box = document.getElementById('message-input');
  const target = kind === 'paste' ? box : document.getElementById('composer');
  const event = kind === 'paste'
    ? new ClipboardEvent('paste', { clipboardData: data, bubbles: true, cancelable: true })
    : new DragEvent('drop', { dataTransfer: data, bubbles: true, cancelable: true });
  target.dispatchEvent(event);
  return event.defaultPrevented;
}"""


def give(page: Page, kind: str, content: bytes, name: str, media_type: str) -> bool:
    b64 = base64.b64encode(content).decode()
    return bool(page.evaluate(GIVE_FILE, [kind, b64, name, media_type]))


def loaded(images: Locator) -> None:
    """Every image shown has loaded (the relay served it to this page)."""
    expect(images.first).to_be_visible()
    for n in range(images.count()):
        expect(images.nth(n)).to_have_js_property("complete", True)
        assert images.nth(n).evaluate("i => i.naturalWidth") > 0


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
    expect(by_id(page, "attached")).to_have_count(1)
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
    assert give(page, "drop", GIF, "dot.gif", "image/gif")
    expect(by_id(page, "attached")).to_have_count(2)
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
    # A paste without an image is the browser's own: the text goes in the box.
    pasted = page.evaluate("""() => {
      const data = new DataTransfer();
      data.setData('text/plain', 'plain words');
      const init = { clipboardData: data, bubbles: true, cancelable: true };
      const event = new ClipboardEvent('paste', init);
      document.getElementById('message-input').dispatchEvent(event);
      return event.defaultPrevented;
    }""")
    assert pasted is False
    pages.assert_clean()


def test_a_message_taken_back_brings_its_image_back(pages: Pages, relay: LiveRelay) -> None:
    page, _cid = opened(pages, relay)
    box = by_id(page, "message-input")
    box.fill("slow")
    box.press("Enter")  # a long turn: the next message waits in the queue
    give(page, "paste", png(), "shot.png", "image/png")
    expect(by_id(page, "attached")).to_have_count(1)
    box.fill("look at this")
    box.press("Enter")
    queued = user_bubble(page, "look at this")
    expect(queued.get_by_test_id("queued-badge")).to_be_visible()
    expect(queued.get_by_test_id("sent-image")).to_have_count(1)
    queued.get_by_test_id("withdraw").click()
    expect(box).to_have_value("look at this")
    expect(by_id(page, "attached")).to_have_count(1)  # back with its text
    pages.assert_clean()
