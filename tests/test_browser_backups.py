"""Backups in Chromium (SPEC §6): the header link, the 🧠 list, a backup's view, starting fresh.

The fresh start runs the real Claude Code CLI against the fake Messages API, so the first
message the agent gets is checked verbatim from the request the fake recorded.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from app.backups import first_message
from tests import test_claude_relay as claude_relay
from tests.browser import Pages, by_id, conv_id, send_text, user_bubble
from tests.fake_anthropic import FakeAnthropic, user_texts
from tests.relay import LiveRelay
from tests.test_claude_relay import StartRelay

# The real CLI's fixtures: the fake Messages API, a fresh HOME, relays on tmp_path.
start = claude_relay.start

NAME = re.compile(r"^1-backup-\d{1,2}(st|nd|rd|th)-[A-Z][a-z]{2}-\d{4}-\d{1,2}-\d{2}[ap]m\.md$")


def wait_backups(live: LiveRelay, cid: int, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:
        found = live.http.get(f"/api/conversations/{cid}/backups").json()["backups"]
        if len(found) >= count or time.monotonic() > deadline:
            return list(found)
        time.sleep(0.05)


def test_backup_link_list_view_and_start_fresh(
    pages: Pages, start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    old = live.create(provider="claude", title="Long build")["id"]
    p1 = pages.open(live, f"/c/{old}")
    p2 = pages.open(live, f"/c/{old}")
    expect(by_id(p1, "backup-link")).to_be_hidden()  # no backup yet
    fake.input_tokens = 51_000
    send_text(p1, "fix the failing parser test")
    (backup,) = wait_backups(live, old, 1)
    name = backup["name"]
    assert NAME.match(name), name
    markdown = live.http.get(f"/api/conversations/{old}/backups/{name}").text

    # The header links the newest backup, in every tab, as soon as it is written.
    for page in (p1, p2):
        expect(by_id(page, "backup-link")).to_have_text(f"↳ {name}")

    # The 🧠 modal lists it: name, trigger, context remaining, time.
    by_id(p1, "context-button").click()
    items = by_id(p1, "backup-list").get_by_test_id("backup-item")
    expect(items).to_have_count(1)
    expect(items.get_by_test_id("backup-open")).to_have_text(name)
    expect(items.get_by_test_id("backup-facts")).to_contain_text("tokens_50k · 94.9% left · ")

    # Opening it shows it rendered, with Download.
    items.get_by_test_id("backup-open").click()
    viewer = by_id(p1, "backup-dialog")
    expect(viewer).to_be_visible()
    expect(by_id(p1, "backup-title")).to_have_text(name)
    body = by_id(p1, "backup-body")
    expect(body.locator("h1")).to_have_text("Session Backup")
    expect(body.locator("h2")).to_have_text(
        ["User Requests", "Files Modified", "Tasks", "Skills Loaded", "Key Replies"]
    )
    expect(body.locator("ul").first.locator("li")).to_have_text(["fix the failing parser test"])
    with p1.expect_download() as download:
        by_id(p1, "backup-download").click()
    assert download.value.suggested_filename == name
    assert Path(download.value.path()).read_text(encoding="utf-8") == markdown

    # Start fresh: confirm, then both tabs move to the new conversation.
    by_id(p1, "backup-fresh").click()
    confirm = by_id(p1, "fresh-dialog")
    expect(confirm).to_be_visible()
    expect(confirm.get_by_role("button")).to_have_text(["Cancel", "Start fresh"])
    by_id(p1, "fresh-confirm").click()
    expect(viewer).to_be_hidden()
    for page in (p1, p2):
        expect(page).not_to_have_url(re.compile(rf"/c/{old}$"))
        expect(by_id(page, "pending-summary")).to_be_visible()
        # What goes is the backup, not a summary (found by an exploratory run).
        expect(by_id(page, "pending-summary-label")).to_have_text(
            "The backup of the previous conversation will be sent with your first message."
        )
    new = conv_id(p1)
    assert conv_id(p2) == new
    assert live.get(old)["status"] == "archived"
    assert live.get(new)["compacted_from_id"] == old
    expect(by_id(p1, "compacted-from-link")).to_be_visible()

    fake.input_tokens = 1_000
    send_text(p1, "carry on from the backup")
    expect(user_bubble(p2, "carry on from the backup")).to_have_count(1)
    live.wait_idle(new, timeout=60)
    bodies = fake.message_bodies()
    last = [m for m in bodies[-1]["messages"] if m["role"] == "user"][-1]
    assert user_texts(last)[-1] == first_message(name, markdown, "carry on from the backup")
    expect(by_id(p1, "entry-user")).to_have_text(["carry on from the backup"])
    pages.assert_clean()


def test_compaction_line_links_its_backup(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Demo")["id"]
    relay.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 100_000})
    hostile = '<img src=x onerror="alert(1)"> turn 1'  # shown in the backup as text only
    for n in range(1, 7):  # 9k + 12k a turn: turn 6 starts past 67k and compacts first
        relay.send(cid, {1: hostile, 2: "turn 2 see https://example.com/spec"}.get(n, f"turn {n}"))
        relay.wait_idle(cid)
    found = wait_backups(relay, cid, 4)
    auto = found[0]
    assert auto["trigger"] == "precompact_auto"
    page = pages.open(relay, f"/c/{cid}")
    link = by_id(page, "compaction-backup")
    expect(link).to_have_text(f"↳ {auto['name']}")
    expect(by_id(page, "backup-link")).to_have_text(f"↳ {auto['name']}")
    link.click()
    expect(by_id(page, "backup-title")).to_have_text(auto["name"])
    expect(by_id(page, "backup-meta")).to_contain_text("precompact_auto · 31.0% left · ")
    requests = by_id(page, "backup-body").locator("ul").first.locator("li")
    expect(requests.first).to_have_text(hostile)
    expect(by_id(page, "backup-body").locator("img")).to_have_count(0)
    # A link in it opens a new tab, as in a message (before: it replaced the app in this tab).
    link = by_id(page, "backup-body").locator('a[href="https://example.com/spec"]').first
    expect(link).to_have_attribute("target", "_blank")
    expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
    by_id(page, "backup-close").click()
    expect(by_id(page, "backup-dialog")).to_be_hidden()
    by_id(page, "context-button").click()
    expect(by_id(page, "backup-list").get_by_test_id("backup-open")).to_have_text(
        [b["name"] for b in found]
    )
    pages.assert_clean()


def compacted_with_backups(relay: LiveRelay, title: str) -> int:
    """A demo conversation whose sixth turn compacts (as above), its 4 backups written."""
    cid = relay.create(title=title)["id"]
    relay.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 100_000})
    for n in range(1, 7):
        relay.send(cid, f"turn {n}")
        relay.wait_idle(cid)
    wait_backups(relay, cid, 4)
    return cid


def test_a_compaction_line_with_its_backup_stays_readable_on_narrow_screens(
    pages: Pages, relay: LiveRelay
) -> None:
    """Found by an exploratory run: at 390 px the pill was 37 px wide and 568 px tall, a letter
    a row, beside the backup's unshrinking name (and 115 × 81 px at 768)."""
    cid = compacted_with_backups(relay, "Narrow")
    page = pages.open(relay, f"/c/{cid}")
    pill, link = by_id(page, "compaction-line"), by_id(page, "compaction-backup")
    expect(pill).to_be_visible()
    wide = pill.bounding_box()
    assert wide is not None
    for width, height in ((390, 844), (768, 1024), (1280, 800)):
        page.set_viewport_size({"width": width, "height": height})
        pill.scroll_into_view_if_needed()
        box, ref = pill.bounding_box(), link.bounding_box()
        assert box is not None and ref is not None
        assert (round(box["width"]), round(box["height"])) == (
            round(wide["width"]),
            round(wide["height"]),
        ), width  # the pill as on a wide screen: one line, its full width
        assert ref["width"] > 40, width  # the backup's link still there to tap
    pages.assert_clean()


def test_a_backup_reads_field_by_field_and_downloads_on_a_phone(
    pages: Pages, relay: LiveRelay
) -> None:
    """Found by an exploratory run: the header's fields ran together in one paragraph, and at
    375 px Download began left of the dialog (its buttons did not wrap)."""
    cid = compacted_with_backups(relay, "Phone backup")
    phone = {"viewport": {"width": 375, "height": 667}, "is_mobile": True, "has_touch": True}
    page = pages.open(relay, f"/c/{cid}", **phone)
    by_id(page, "compaction-backup").click()
    viewer = by_id(page, "backup-dialog")
    expect(viewer).to_be_visible()
    header = by_id(page, "backup-body").locator("p").first.inner_text().splitlines()
    assert [line.split(":")[0] for line in header] == [
        "Conversation",
        "Session ID",
        "Trigger",
        "Context Remaining",
        "Generated",
    ]
    box, download = viewer.bounding_box(), by_id(page, "backup-download").bounding_box()
    assert box is not None and download is not None
    left, right = download["x"], download["x"] + download["width"]
    assert box["x"] <= left and right <= box["x"] + box["width"], (box, download)
    pages.assert_clean()
