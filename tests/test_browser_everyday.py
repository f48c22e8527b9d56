"""What an exploratory run on a phone and by keyboard found (session 22), each seen in Chromium."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, expect

from app.agents.base import AgentEvent, MessageDone, TextDelta, TurnDone
from app.db import get_session
from app.models import Conversation
from tests.browser import Pages, by_id, item_menu, own_relay, send_text, user_bubble
from tests.relay import LiveRelay
from tests.test_browser_polish import ScriptAgent, use_script

PHONE = {"viewport": {"width": 375, "height": 667}, "is_mobile": True, "has_touch": True}

# The header's boxes on a phone: the title's visible text and what overlaps what.
HEADER = """() => {
  const box = (sel) => document.querySelector(sel).getBoundingClientRect();
  const main = document.querySelector('#title .title-main');
  const overlap = (a, b) => a.right > b.left && b.right > a.left
    && a.bottom > b.top && b.bottom > a.top;
  const badge = box('#provider-badge'), state = box('#agent-state'), actions = box('#head-actions');
  return {
    whole: main.scrollWidth <= main.clientWidth + 1,
    shown: main.clientWidth >= 24,
    suffix: document.querySelector('#title .title-suffix')?.textContent ?? null,
    overlaps: [overlap(badge, actions), overlap(state, actions), overlap(badge, state)],
  };
}"""


async def _until_stopped(agent: ScriptAgent, prompt: str) -> AsyncIterator[AgentEvent]:
    """A turn that runs until Stop."""
    while not agent.interrupted:  # noqa: ASYNC110 - the stand-in's flag, set by interrupt()
        await asyncio.sleep(0.02)
    yield MessageDone(f"m-{prompt}", "Stopped.")
    yield TurnDone()


def test_the_phone_header_keeps_the_title_readable_while_a_turn_runs(
    pages: Pages, relay: LiveRelay
) -> None:
    # Before: the cwd sized the badge's column, the state sat under 🧠, and with Stop showing
    # the title got 0 px ("(compacted)" alone); "(compacted ×2)" was not kept whole.
    use_script(relay, _until_stopped)
    cwd = Path(relay.settings.data_dir) / "a-rather-long-project-directory" / "and-a-subdirectory"
    cwd.mkdir(parents=True)
    cid = relay.create(title="Refactor (compacted ×2)", cwd=str(cwd))["id"]
    page = pages.open(relay, f"/c/{cid}", **PHONE)
    expect(by_id(page, "title")).to_have_text("Refactor (compacted ×2)")
    idle = page.evaluate(HEADER)
    assert idle == {
        "whole": True,
        "shown": True,
        "suffix": " (compacted ×2)",
        "overlaps": [False] * 3,
    }
    send_text(page, "run until stopped")
    expect(by_id(page, "stop-button")).to_be_visible()
    # Stop takes room: the title is cut (with an ellipsis), never to nothing.
    assert page.evaluate(HEADER) == {**idle, "whole": False}
    by_id(page, "stop-button").click()
    expect(by_id(page, "stop-button")).to_be_hidden()
    pages.assert_clean()


def test_the_whole_sidebar_row_opens_its_conversation(pages: Pages, relay: LiveRelay) -> None:
    # Before: only the title was a link; a click on the time or on "running" did nothing.
    use_script(relay, _until_stopped)
    busy, idle = (relay.create(title=title)["id"] for title in ("Busy row", "Idle row"))
    relay.send(busy, "run until stopped")
    page = pages.open(relay, f"/c/{idle}")
    # The rows in their final order (the turn made Busy the newest) before any click.
    expect(page.locator(".conv-item").first.get_by_test_id("conv-running")).to_be_visible()

    def click_middle(testid: str, title: str) -> None:  # where a user's pointer lands
        item = page.locator(".conv-item").filter(has=page.get_by_text(title, exact=True))
        page.mouse.click(*middle(item.get_by_test_id(testid)))

    click_middle("conv-running", "Busy row")
    expect(page).to_have_url(re.compile(f"/c/{busy}$"))
    expect(by_id(page, "title")).to_have_text("Busy row")
    click_middle("conv-when", "Idle row")
    expect(page).to_have_url(re.compile(f"/c/{idle}$"))
    expect(by_id(page, "title")).to_have_text("Idle row")
    # The ⋯ button over the row still opens its menu, not the conversation.
    item_menu(page, "Busy row")
    expect(page).to_have_url(re.compile(f"/c/{idle}$"))
    page.keyboard.press("Escape")
    click_middle("conv-running", "Busy row")
    by_id(page, "stop-button").click()
    expect(by_id(page, "stop-button")).to_be_hidden()
    pages.assert_clean()


def middle(target: Locator) -> tuple[float, float]:
    """The middle of an element where a user's pointer lands. The sidebar is redrawn on its
    updates: a box read from an element just replaced is None (or zeros): read again."""
    for _ in range(100):
        box = target.bounding_box()
        if box is not None and box["width"] > 0:
            return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        target.page.wait_for_timeout(20)
    raise AssertionError(f"{target} has no box")


WORDS = ["supercalifragilistic", "expialidocious", "antidisestablishment", "floccinaucinihilipili"]
TABLE = "\n".join([" | ".join("abcd"), "---|---|---|---", " | ".join(WORDS), " | ".join("wxyz")])


async def _a_table(_agent: ScriptAgent, prompt: str) -> AsyncIterator[AgentEvent]:
    """Every reply is TABLE (the demo agent quotes a message on one line: no table)."""
    yield MessageDone(f"m-{prompt}", TABLE)
    yield TurnDone()


def test_a_table_keeps_whole_words_and_scrolls_sideways_on_a_phone(
    pages: Pages, relay: LiveRelay
) -> None:
    use_script(relay, _a_table)
    cid = relay.create(title="Tables")["id"]
    page = pages.open(relay, f"/c/{cid}", **PHONE)
    send_text(page, "a table, please")
    table = by_id(page, "entry-agent").locator("table")
    expect(table).to_be_visible()
    cells = table.locator("td")
    expect(cells).to_have_count(8)
    # Before: the bubble's overflow-wrap:anywhere made each cell a letter wide, never scrolling.
    broken = cells.evaluate_all("cells => cells.map(c => c.scrollWidth > c.clientWidth + 1)")
    heights = cells.evaluate_all("cells => cells.map(c => c.getBoundingClientRect().height)")
    assert broken == [False] * 8
    assert max(heights) < 2 * min(heights), heights  # each long word stays one word
    assert table.evaluate("t => t.scrollWidth > t.clientWidth")  # it scrolls instead
    pages.assert_clean()


def test_clicking_send_leaves_the_focus_in_the_box(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Focus")["id"]
    page = pages.open(relay, f"/c/{cid}")
    box = by_id(page, "message-input")
    box.fill("first by click")
    by_id(page, "send-button").click()
    expect(user_bubble(page, "first by click")).to_be_visible()
    # Before: the focus fell to the page (the button is disabled once the box empties).
    expect(box).to_be_focused()
    page.keyboard.type("next words")
    expect(box).to_have_value("next words")
    pages.assert_clean()


def test_after_a_delete_by_keyboard_the_focus_goes_to_a_neighbour(
    pages: Pages, relay: LiveRelay
) -> None:
    ids = [relay.create(title=title)["id"] for title in ("Older", "Doomed", "Newer")]
    page = pages.open(relay, f"/c/{ids[0]}")
    item_menu(page, "Doomed")
    by_id(page, "conv-delete").click()
    expect(by_id(page, "confirm-dialog")).to_be_visible()
    by_id(page, "confirm-ok").press("Enter")
    expect(by_id(page, "conversation-item")).to_have_count(2)
    # Before: the focus went back to Doomed's ⋯, removed a frame later: the page had it.
    focused = page.locator(":focus")
    expect(focused).to_have_attribute("data-testid", "conv-menu-button")
    expect(page.locator(".conv-item", has=focused)).to_contain_text("Older")
    pages.assert_clean()


def test_after_unpin_by_keyboard_the_focus_stays_in_the_pins(
    pages: Pages, relay: LiveRelay
) -> None:
    cid = relay.create(title="Pins")["id"]
    for text in ("keep one", "keep two"):
        relay.send(cid, text)
        relay.wait_idle(cid)
    page = pages.open(relay, f"/c/{cid}")
    for text in ("keep one", "keep two"):
        user_bubble(page, text).get_by_test_id("pin-toggle").click()
    unpins = by_id(page, "unpin")
    expect(unpins).to_have_count(2)
    unpins.first.focus()
    page.keyboard.press("Enter")
    expect(unpins).to_have_count(1)
    expect(unpins.first).to_be_focused()  # before: the page had the focus
    page.keyboard.press("Enter")
    expect(unpins).to_have_count(0)
    expect(page.locator(":focus")).to_have_attribute("data-testid", "pin-toggle")
    pages.assert_clean()


def test_the_compact_dialog_focuses_compact_once_the_preview_is_in(
    pages: Pages, relay: LiveRelay
) -> None:
    cid = relay.create(title="Compact by keyboard")["id"]
    relay.send(cid, "hello")
    relay.wait_idle(cid)
    page = pages.open(relay, f"/c/{cid}")
    send_text(page, "/compact")
    expect(by_id(page, "compact-confirm")).to_be_enabled()
    # Before: the left-out fold had it, and Enter unfolded it instead of compacting.
    expect(by_id(page, "compact-confirm")).to_be_focused()
    page.keyboard.press("Enter")
    expect(by_id(page, "title")).to_have_text("Compact by keyboard (compacted)")
    pages.assert_clean()


# The WCAG contrast of an element's text on the first background behind it that is not
# transparent (the page's own colours have no alpha but for hovers, not measured here).
CONTRAST = """el => {
  const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
  const linear = (v) => (v / 255 <= 0.03928 ? v / 255 / 12.92 : ((v / 255 + 0.055) / 1.055) ** 2.4);
  const lum = (c) => c.map(linear).reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const clear = (e) => getComputedStyle(e).backgroundColor === 'rgba(0, 0, 0, 0)';
  let back = el;
  while (back && clear(back)) back = back.parentElement;
  const a = lum(rgb(getComputedStyle(el).color));
  const b = lum(rgb(getComputedStyle(back || document.body).backgroundColor));
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_secondary_text_is_readable_in_both_schemes(
    pages: Pages, relay: LiveRelay, scheme: str
) -> None:
    # A review: the "faint" text (a reply's time, "just now" in the sidebar, the keys hint,
    # the version) was 2.2-2.6:1 in the light scheme, the sidebar's muted text 4.2:1.
    cid = relay.create(title="Contrast")["id"]
    relay.send(cid, "hello")
    relay.wait_idle(cid)
    archived = relay.create(title="Archived one")["id"]
    relay.http.post(f"/api/conversations/{archived}/archive")
    page = pages.open(relay, f"/c/{cid}", color_scheme=scheme)
    expect(by_id(page, "agent-footer")).to_be_visible()
    for selector in (
        ".msg-foot",
        ".conv-when",
        ".composer-keys",
        ".brand-version",
        ".archive .conv-link",
        ".cwd",
        ".agent-state",
    ):
        ratio = page.locator(selector).first.evaluate(CONTRAST)
        assert ratio >= 4.5, (selector, round(ratio, 2))
    pages.assert_clean()


@pytest.mark.parametrize("width", [500, 620, 683, 880, 901, 1000])
def test_a_narrow_window_keeps_the_title_and_stop_usable(
    pages: Pages, tmp_path: Path, width: int
) -> None:
    # Reviews: between a phone's 480 px and ~880 px the title got 12 px ("k") beside the
    # provider badge, the agent's state and the header's buttons; at 481-560 px (a 280 px
    # sidebar beside the chat) Stop was off-screen and the message box 7-86 px wide; at 901 px a
    # long title during a turn was one letter again.
    relay = own_relay(tmp_path, demo_delay=0.05)
    try:
        cid = relay.create(title="A long title for the narrow window")["id"]
        page = pages.open(relay, f"/c/{cid}", viewport={"width": width, "height": 800})
        send_text(page, "slow please")
        stop = by_id(page, "stop-button")
        expect(stop).to_be_visible()
        title = by_id(page, "title")
        expect(title).to_have_text("A long title for the narrow window")
        assert title.evaluate("b => b.getBoundingClientRect().width") >= 150, "the title is cut"
        edge = stop.evaluate("b => b.getBoundingClientRect().right")
        assert edge <= width, ("Stop is past the window's edge", edge)
        box = by_id(page, "message-input").evaluate("b => b.getBoundingClientRect().width")
        assert box >= 200, ("the message box", box)
        for part in ("provider-badge", "agent-state", "context-button"):
            assert by_id(page, part).is_visible()
        stop.click()
        relay.wait_idle(cid)
        pages.assert_clean()
    finally:
        relay.stop()


def test_a_phone_s_drawer_takes_the_keyboard_in_and_gives_it_back(
    pages: Pages, relay: LiveRelay
) -> None:
    # A review, on a narrow screen: the closed drawer's ~20 items were in the Tab order out of
    # sight; ☰ left the focus on itself; Esc, or a conversation chosen, left it on a hidden item.
    first = relay.create(title="First")["id"]
    relay.create(title="Second")
    page = pages.open(relay, f"/c/{first}", **PHONE)
    expect(by_id(page, "title")).to_have_text("First")
    sidebar = page.locator("#sidebar")
    expect(sidebar).to_have_js_property("inert", True)
    page.keyboard.press("Tab")
    assert page.evaluate("!document.getElementById('sidebar').contains(document.activeElement)")
    menu = by_id(page, "menu-button")
    menu.focus()
    page.keyboard.press("Enter")
    expect(sidebar).to_have_js_property("inert", False)
    expect(sidebar.locator(".conv-link.current")).to_be_focused()
    page.keyboard.press("Escape")
    expect(menu).to_be_focused()
    expect(sidebar).to_have_js_property("inert", True)
    page.keyboard.press("Enter")
    second = by_id(page, "conversation-item").filter(has_text="Second")
    second.focus()
    page.keyboard.press("Enter")
    expect(by_id(page, "title")).to_have_text("Second")
    expect(menu).to_be_focused()
    # A wide window has no drawer: its sidebar is never inert.
    page.set_viewport_size({"width": 1000, "height": 700})
    expect(sidebar).to_have_js_property("inert", False)
    pages.assert_clean()


@pytest.mark.parametrize("command", ["/compact", "/clear"])
def test_an_enter_held_down_confirms_no_compact_or_clear(
    pages: Pages, relay: LiveRelay, command: str
) -> None:
    # A review: Enter held past the key repeat's delay sent the command, then its repeats
    # pressed the button the dialog focused: compacted, or cleared, with no choice made.
    cid = relay.create(title="Held Enter")["id"]
    relay.send(cid, "hello")
    relay.wait_idle(cid)
    page = pages.open(relay, f"/c/{cid}")
    box = by_id(page, "message-input")
    box.fill(command)
    box.press("Escape")  # the / menu closed: Enter sends
    page.keyboard.down("Enter")
    confirm = by_id(page, command[1:] + "-confirm")
    expect(confirm).to_be_focused()
    for _ in range(3):
        page.keyboard.down("Enter")  # the key's repeats (repeat: true)
    page.keyboard.up("Enter")
    page.wait_for_timeout(300)
    expect(confirm).to_be_visible()
    assert relay.get(cid)["status"] == "active"
    page.keyboard.press("Enter")  # a press of its own confirms
    expect(by_id(page, "title")).to_have_text(
        re.compile(r"Held Enter \(compacted\)|New conversation")
    )
    assert relay.get(cid)["status"] == "archived"
    pages.assert_clean()


def test_a_window_moved_while_another_tab_compacts_goes_to_the_new_conversation(
    pages: Pages, relay: LiveRelay
) -> None:
    cid = relay.create(title="Moved window")["id"]
    page = pages.open(relay, f"/c/{cid}")
    by_id(page, "context-button").click()
    slider = by_id(page, "window-slider")
    expect(slider).to_be_visible()
    slider.focus()
    page.keyboard.press("ArrowRight")
    compacted = relay.send(cid, "/compact")
    assert compacted.status_code == 201, compacted.text
    new_id = compacted.json()["compacted_into"]["id"]
    expect(page).to_have_url(f"{relay.base}/c/{new_id}")
    # Before: saved to the archived one on close: "…not saved: This conversation is archived".
    relay.wait_for(new_id, lambda view: view["auto_compact_window"] is not None, timeout=10)
    assert relay.get(cid)["auto_compact_window"] is None
    pages.assert_clean()


def test_the_new_conversation_dialog_fits_a_phone(pages: Pages, relay: LiveRelay) -> None:
    page = pages.open(relay, "/", **PHONE)
    page.get_by_test_id("empty-new-conversation").click()
    dialog = by_id(page, "new-dialog")
    expect(by_id(page, "import-toggle")).to_be_visible()
    # Before: "Continue a session started in a terminal…" ran past the edge (no wrap), and the
    # whole dialog scrolled sideways.
    assert dialog.evaluate("d => d.scrollWidth <= d.clientWidth")
    toggle = by_id(page, "import-toggle").bounding_box()
    box = dialog.bounding_box()
    assert toggle is not None and box is not None
    assert toggle["x"] + toggle["width"] <= box["x"] + box["width"]
    pages.assert_clean()


def two_pieces(first: str, second: str, shown: threading.Event) -> Any:
    """A script: first, then (once the page shows it rendered) second, then the whole message."""

    async def script(_agent: ScriptAgent, prompt: str) -> AsyncIterator[AgentEvent]:
        yield TextDelta(f"m-{prompt}", first)
        # Rendered at once (a paragraph's last space dropped); the second piece then shows as
        # plain text until the next rendering. It was a fixed 0.05 s pause: on a loaded machine
        # both pieces reached the page before the first rendering.
        await asyncio.to_thread(shown.wait, 60)
        yield TextDelta(f"m-{prompt}", second)
        await asyncio.sleep(0.5)
        yield MessageDone(f"m-{prompt}", first + second)
        yield TurnDone()

    return script


@pytest.mark.parametrize(
    ("first", "second", "whole", "good", "bad"),
    [
        # Before: "Try ask permissionor slow." until the next rendering.
        ("Try ask permission ", "or slow.", "Try ask permission or slow.", "n or", "nor"),
        # A newline inside a paragraph is a space too (a soft break).
        ("Try ask permission\n", "or slow.", "Try ask permission\nor slow.", "n or", "nor"),
        # In code a newline is kept, and no space is added in front of the next line.
        ("```\nx = 1\n", "y = 2\n```", "x = 1\ny = 2", "1\ny", "1\n y"),
    ],
)
def test_streamed_text_after_a_rendered_part_keeps_its_spacing(
    pages: Pages, relay: LiveRelay, first: str, second: str, whole: str, good: str, bad: str
) -> None:
    shown = threading.Event()
    use_script(relay, two_pieces(first, second, shown))
    cid = relay.create(title="Spaces")["id"]
    page = pages.open(relay, f"/c/{cid}")
    # Every state the streaming message's text passes through, as the page showed it.
    page.evaluate("""() => {
      window.seen = [];
      new MutationObserver(() => {
        const entry = document.querySelector('[data-testid="entry-agent"][data-state="streaming"]');
        if (entry) window.seen.push(entry.querySelector('.bubble').textContent);
      }).observe(document.body, { subtree: true, childList: true, characterData: true });
    }""")
    send_text(page, "go")
    streaming = page.locator('[data-testid="entry-agent"][data-state="streaming"] .bubble')
    expect(streaming.locator("p, pre")).to_have_count(1)  # the first piece, rendered
    shown.set()
    expect(by_id(page, "entry-agent")).to_contain_text(whole)
    seen = page.evaluate("window.seen")
    assert any(good in text for text in seen), seen  # shown so while streaming
    assert not [text for text in seen if bad in text], seen


def test_text_typed_in_a_conversation_deleted_elsewhere_stays_to_be_copied(
    pages: Pages, relay: LiveRelay
) -> None:
    cid = relay.create(title="Deleted under the cursor")["id"]
    page = pages.open(relay, f"/c/{cid}")
    by_id(page, "message-input").fill("a long thought I was still typing")
    expect(by_id(page, "agent-state")).to_be_visible()
    assert relay.http.delete(f"/api/conversations/{cid}").status_code == 204
    expect(page.locator("#missing-text")).to_have_text("This conversation was deleted.")
    # Before: gone without a trace (an archive keeps it read-only; a delete now shows it).
    expect(by_id(page, "missing-draft")).to_have_value("a long thought I was still typing")
    expect(by_id(page, "missing-draft")).to_be_visible()
    pages.assert_clean("404")  # its reload, as intended


def test_text_typed_in_a_conversation_archived_elsewhere_says_it_is_only_to_copy(
    pages: Pages, relay: LiveRelay
) -> None:
    # A review: the composer kept the text (to copy) and looked live; Enter did nothing, silently.
    cid = relay.create(title="Archived under the cursor")["id"]
    page = pages.open(relay, f"/c/{cid}")
    box = by_id(page, "message-input")
    box.fill("a thought to keep")
    expect(by_id(page, "archived-hint")).to_be_hidden()
    assert relay.http.post(f"/api/conversations/{cid}/archive").status_code == 200
    expect(by_id(page, "archived-hint")).to_have_text(
        "Archived meanwhile: this text can no longer be sent. Copy it from here."
    )
    expect(box).to_have_value("a thought to keep")
    expect(box).to_have_js_property("readOnly", True)
    expect(page.locator(".composer-keys")).to_be_hidden()
    pages.assert_clean()


def test_a_missing_conversation_shows_no_draft_box(pages: Pages, relay: LiveRelay) -> None:
    page = pages.open(relay, "/c/424242")
    expect(page.locator("#missing-text")).to_have_text("This conversation does not exist.")
    expect(by_id(page, "missing-draft")).to_be_hidden()
    pages.assert_clean("404")


def test_a_figure_without_a_window_draws_no_full_bar(pages: Pages, relay: LiveRelay) -> None:
    # As an imported session shows before its first turn here: a figure, no window yet.
    cid = relay.create(title="Imported")["id"]
    with get_session(relay.app.state.engine) as session:
        conversation = session.get(Conversation, cid)
        assert conversation is not None and conversation.model_window is None
        conversation.context_tokens = 22_000
        session.add(conversation)
        session.commit()
    page = pages.open(relay, f"/c/{cid}")
    by_id(page, "context-button").click()
    expect(by_id(page, "context-used")).to_have_text("22k used")
    # Before: a bar scaled to the figure itself, full, which read as "the context is full".
    expect(by_id(page, "context-bar")).to_be_hidden()
    pages.assert_clean()


def test_a_finger_gets_targets_larger_than_the_pointers(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Fingers")["id"]
    relay.send(cid, "hello")
    relay.wait_idle(cid)
    page = pages.open(relay, f"/c/{cid}", **PHONE)
    pin = user_bubble(page, "hello").get_by_test_id("pin-toggle")
    expect(pin).to_be_visible()
    by_id(page, "menu-button").click()
    menu = page.locator(".conv-item").get_by_test_id("conv-menu-button")
    expect(menu).to_be_visible()
    sizes = [box for box in (pin.bounding_box(), menu.bounding_box()) if box is not None]
    # Before: the pin 28 x 12 px, the ⋯ 24 x 24 (and both always shown, hover being absent).
    assert [(b["width"] >= 32, b["height"] >= 28) for b in sizes] == [(True, True)] * 2, sizes
    pages.assert_clean()


# The timeline's scroll position against where it was (bottom): up, or back down.
SCROLLED = """([bottom, up]) => {
  const top = document.querySelector('#timeline').scrollTop;
  return up ? top < bottom - 100 : top >= bottom - 1;
}"""


def test_page_up_in_the_composer_scrolls_the_timeline(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Long")["id"]
    for n in range(12):
        relay.send(cid, f"message number {n} " + "with some words " * 20)
        relay.wait_idle(cid)
    page = pages.open(relay, f"/c/{cid}", viewport={"width": 900, "height": 600})
    expect(user_bubble(page, "message number 11")).to_be_in_viewport()
    box = by_id(page, "message-input")
    box.focus()
    bottom = by_id(page, "timeline").evaluate("t => t.scrollTop")
    # Before: nothing (the keyboard's only way up was tabbing through every Pin button).
    box.press("PageUp")
    page.wait_for_function(SCROLLED, arg=[bottom, True])  # up by most of a page
    box.press("PageDown")
    page.wait_for_function(SCROLLED, arg=[bottom, False])  # and back down
    expect(box).to_be_focused()
    # Each Pin button says which message it pins.
    pin = user_bubble(page, "message number 11").get_by_test_id("pin-toggle")
    expect(pin).to_have_attribute("aria-label", re.compile(r"^Pin: message number 11 with some"))
    pages.assert_clean()


def test_a_right_to_left_override_in_a_title_reverses_nothing_around_it(
    pages: Pages, relay: LiveRelay
) -> None:
    # Found by a hostile review: "report\u202etxt.exe" reversed the rest of the delete
    # question after it, spoofing what was about to be deleted, and the compacted suffix.
    spoof = "report\u202etxt.exe"
    isolated = f"\u2068{spoof}\u2069"
    cid = relay.create(title=spoof)["id"]
    page = pages.open(relay, f"/c/{cid}")
    item_menu(page, spoof)
    by_id(page, "conv-delete").click()
    expect(by_id(page, "confirm-dialog")).to_contain_text(
        f"Delete “{isolated}”? Its messages and backups are deleted too."
    )
    by_id(page, "confirm-cancel").click()
    compacted = relay.send(cid, "/compact")
    assert compacted.status_code == 201, compacted.text
    new = compacted.json()["compacted_into"]["id"]
    expect(page).to_have_url(f"{relay.base}/c/{new}")
    expect(by_id(page, "title")).to_have_text(f"{isolated} (compacted)")
    expect(page.locator("#compacted-from-link")).to_have_text(f"Compacted from “{isolated}”")
    # An isolate the title opens and never closes (found by a hostile review: our PDI closed
    # it, ours stayed open, the override reversed the rest of the question).
    unclosed = "evil\u202e\u2067 x"
    relay.create(title=unclosed)
    item_menu(page, unclosed)
    by_id(page, "conv-delete").click()
    question = page.locator("#confirm-question")
    expect(question).to_have_text(
        f"Delete “\u2068{unclosed}\u2069\u2069”? Its messages and backups are deleted too."
        " This cannot be undone."
    )
    assert left_to_right(question, "backups")
    by_id(page, "confirm-cancel").click()
    pages.assert_clean()


def left_to_right(element: Locator, word: str) -> bool:
    """Whether each letter of word (in element's one text node) is drawn right of the last."""
    return element.evaluate(
        """(el, word) => {
          const node = el.firstChild;
          const at = node.data.indexOf(word);
          const xs = [...word].map((_, i) => {
            const range = document.createRange();
            range.setStart(node, at + i);
            range.setEnd(node, at + i + 1);
            return range.getBoundingClientRect().left;
          });
          return at >= 0 && xs.every((x, i) => i === 0 || x > xs[i - 1]);
        }""",
        word,
    )
