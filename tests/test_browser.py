"""The browser UI in a real Chromium against a live relay with the demo agent.

Every page records console errors, uncaught exceptions, CSP violations and
dialogs; each test ends by asserting there were none.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from app.agents.base import (
    Activity,
    AgentEvent,
    AgentSpec,
    MessageDone,
    Notice,
    TextDelta,
    TurnDone,
)
from app.agents.demo import reply_text
from app.tokens import format_tokens
from tests.browser import (
    IDLE_TEXT,
    QUESTION,
    Pages,
    agent_reply,
    by_id,
    conv_id,
    item_menu,
    last_said,
    line,
    own_relay,
    send_text,
    user_bubble,
)
from tests.fake_anthropic import FakeAnthropic
from tests.relay import LiveRelay
from tests.stand_in import StandIn
from tests.xss_corpus import PAYLOADS

# ---- 1. chat across two browsers -----------------------------------------------------------------


def test_create_send_and_two_browsers_stay_in_sync(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path, demo_delay=0.3)  # the reply streams in ~5 pieces over ~1.5 s
    try:
        p1 = pages.open(relay)
        by_id(p1, "new-conversation").click()
        expect(by_id(p1, "new-dialog")).to_be_visible()
        by_id(p1, "new-title").fill("Browser chat")
        by_id(p1, "new-provider").select_option("demo")
        by_id(p1, "new-create").click()
        expect(by_id(p1, "new-dialog")).to_be_hidden()
        expect(p1).to_have_url(re.compile(r"/c/\d+$"))
        cid = conv_id(p1)
        expect(by_id(p1, "title")).to_have_text("Browser chat")
        expect(by_id(p1, "conversation-list").get_by_test_id("conversation-item")).to_have_text(
            ["Browser chat"]
        )
        assert relay.get(cid)["provider"] == "demo"
        box = by_id(p1, "message-input")
        # The new conversation opens with the focus in the box (checked before a second
        # browser window opens and takes the focus of the headless browser).
        expect(box).to_be_focused()

        p2 = pages.open(relay, f"/c/{cid}")
        expect(by_id(p2, "title")).to_have_text("Browser chat")

        box.click()
        box.type("line one")
        box.press("Shift+Enter")
        box.type("line two")
        expect(box).to_have_value("line one\nline two")
        expect(by_id(p1, "entry-user")).to_have_count(0)
        assert relay.get(cid)["timeline"] == []
        box.press("Enter")

        typed = "line one\nline two"
        for page in (p1, p2):
            bubble = by_id(page, "entry-user")
            expect(bubble).to_have_count(1)
            expect(bubble).to_have_js_property("textContent", typed)
        expect(box).to_have_value("")
        # Page 2 sees the reply while it streams, then finished.
        streaming = p2.locator('[data-testid="entry-agent"][data-state="streaming"]')
        expect(streaming).to_have_count(1)
        expect(streaming).to_contain_text("You said:")
        expect(agent_reply(p2, typed)).to_have_count(1)
        expect(streaming).to_have_count(0)
        expect(agent_reply(p1, typed)).to_have_count(1)
        relay.wait_idle(cid)

        expected = relay.get(cid)["timeline"]
        agent_text = next(e["text"] for e in expected if e["kind"] == "agent")
        assert agent_text == reply_text(typed)
        shown = [by_id(p, "entry-agent").inner_text() for p in (p1, p2)]
        assert shown[0] == shown[1]
        assert "You said: “line one line two”" in shown[0]
        assert "I am the demo agent: I run offline and quote what you send." in shown[0]
        for page in (p1, p2):
            expect(by_id(page, "turn-indicator")).to_be_hidden()
            expect(by_id(page, "send-button")).to_have_text("Send")

        p1.reload()
        expect(by_id(p1, "title")).to_have_text("Browser chat")
        expect(by_id(p1, "entry-user")).to_have_count(1)
        expect(by_id(p1, "entry-user")).to_have_js_property("textContent", typed)
        expect(agent_reply(p1, typed)).to_have_count(1)
        assert by_id(p1, "entry-agent").inner_text() == shown[0]
        pages.assert_clean()
    finally:
        pages.close()
        relay.stop()


# ---- 2. Stop, Send/Queue and the queue -----------------------------------------------------------


def test_stop_and_queue_while_running(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path, demo_delay=0.03)  # "slow" streams ~230 pieces: ~7 s
    try:
        cid = relay.create(title="Stop me")["id"]
        page = pages.open(relay, f"/c/{cid}")
        send = by_id(page, "send-button")
        expect(send).to_have_text("Send")
        expect(by_id(page, "stop-button")).to_be_hidden()

        send_text(page, "slow please")
        expect(by_id(page, "stop-button")).to_be_visible()
        expect(send).to_have_text("Queue")
        expect(page.locator('[data-testid="entry-agent"][data-state="streaming"]')).to_have_count(1)

        send_text(page, "then this")
        queued = user_bubble(page, "then this")
        expect(queued.get_by_test_id("queued-badge")).to_have_text("Queued")
        expect(queued).to_have_attribute("data-state", "queued")

        by_id(page, "stop-button").click()
        expect(line(page, "Interrupted by the user.")).to_have_count(1)
        expect(line(page, "Interrupted by the user.")).to_have_text("Interrupted by the user.")
        # The slow reply stopped early: its last words never came.
        slow = agent_reply(page, "slow please")
        expect(slow).to_have_count(1)
        expect(slow).not_to_contain_text("word200")
        # The queued message then goes out: badge gone, answered.
        expect(agent_reply(page, "then this")).to_have_count(1)
        expect(queued).to_have_attribute("data-state", "sent")
        expect(by_id(page, "queued-badge")).to_have_count(0)
        expect(send).to_have_text("Send")
        expect(by_id(page, "stop-button")).to_be_hidden()
        view = relay.wait_idle(cid)
        assert [e["state"] for e in view["timeline"] if e["kind"] == "user"] == ["sent", "sent"]
        pages.assert_clean()
    finally:
        pages.close()
        relay.stop()


def test_esc_closes_an_open_menu_and_leaves_the_turn_running(pages: Pages, tmp_path: Path) -> None:
    """Esc on an open ⋯ menu closes the menu only; the next Esc stops the turn (before: the
    first stopped the turn and left the menu open)."""
    relay = own_relay(tmp_path, demo_delay=0.05)  # "slow" streams ~230 pieces: ~12 s
    try:
        cid = relay.create(title="Menu during a turn")["id"]
        page = pages.open(relay, f"/c/{cid}")
        send_text(page, "slow please")
        expect(page.locator('[data-testid="entry-agent"][data-state="streaming"]')).to_have_count(1)
        item_menu(page, "Menu during a turn")
        page.keyboard.press("Escape")
        expect(by_id(page, "conv-menu")).to_be_hidden()
        expect(by_id(page, "stop-button")).to_be_visible()
        expect(line(page, "Interrupted by the user.")).to_have_count(0)
        assert relay.get(cid)["turn"]["state"] == "running"
        page.keyboard.press("Escape")
        expect(line(page, "Interrupted by the user.")).to_have_count(1)
        pages.assert_clean()
    finally:
        pages.close()
        relay.stop()


# ---- 3. permission questions in two browsers -----------------------------------------------------


def test_a_question_answered_by_keyboard_leaves_the_keyboard_in_the_composer(
    pages: Pages, relay: LiveRelay
) -> None:
    # A review: Enter or Space on Allow/Deny dropped the focus to the page (its card's buttons
    # were disabled, then gone): a keyboard or screen-reader user started over from the top.
    cid = relay.create(title="Keyboard answers")["id"]
    page = pages.open(relay, f"/c/{cid}")
    for prompt, button, key, said in (
        ("ask permission", "permission-allow", "Enter", ["Allowed"]),
        ("ask permission again", "permission-deny", "Space", ["Allowed", "Denied"]),
    ):
        send_text(page, prompt)
        by_id(page, button).focus()
        page.keyboard.press(key)
        expect(by_id(page, "permission-answer")).to_have_text(said)
        expect(by_id(page, "message-input")).to_be_focused()
        relay.wait_idle(cid)
    pages.assert_clean()


def test_screen_readers_are_told_replies_questions_and_who_needs_them(
    pages: Pages, relay: LiveRelay
) -> None:
    # A review: a reply was never read out (the timeline is no live region), messages had no
    # "You"/"Agent" to tell them apart, and "needs you" elsewhere was silent.
    cid = relay.create(title="Spoken")["id"]
    other = relay.create(title="Elsewhere")["id"]
    page = pages.open(relay, f"/c/{cid}")
    said = by_id(page, "announce")
    send_text(page, "hello **there**")
    expect(said).to_contain_text("Agent: You said: ")
    expect(said).to_contain_text("hello there")  # its words, without the marks
    expect(page.get_by_role("article", name="You")).to_contain_text("hello **there**")
    expect(page.get_by_role("article", name="Agent")).to_have_count(1)
    relay.wait_idle(cid)
    send_text(page, "ask permission")
    expect(last_said(page)).to_have_text("Bash waits for your answer.")
    by_id(page, "permission-allow").click()
    relay.wait_idle(cid)
    assert relay.send(other, "ask permission").status_code == 202
    expect(said).to_contain_text("“Elsewhere” needs you.")  # (with a reply ending then)
    send_text(page, "slow")  # the demo's long reply: only its first 400 characters are said
    # (idle alone is not enough: the page's POST may not have landed yet, as a CI run found)
    done = {"state": "idle", "queued": 0}
    view = relay.wait_for(
        cid, lambda v: v["turn"] == done and v["timeline"][-2]["text"] == "slow", 60
    )
    reply = view["timeline"][-1]["text"]
    assert len(reply) > 400
    expect(last_said(page)).to_have_text(re.compile(r"^Agent: .{400}…$"))
    pages.assert_clean()


def test_permission_question_in_two_browsers(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Permissions")["id"]
    p1 = pages.open(relay, f"/c/{cid}")
    p2 = pages.open(relay, f"/c/{cid}")
    expect(by_id(p2, "title")).to_have_text("Permissions")

    send_text(p1, "please ask permission")
    for page in (p1, p2):
        expect(by_id(page, "permission-allow")).to_have_text("Allow")
        expect(by_id(page, "permission-deny")).to_have_text("Deny")
        card = by_id(page, "entry-activity").filter(has=by_id(page, "permission-allow"))
        expect(card).to_contain_text("Bash wants to run:")
        expect(card).to_contain_text("touch demo.txt")
    by_id(p1, "permission-allow").click()
    for page in (p2, p1):
        expect(by_id(page, "permission-answer")).to_have_text(["Allowed"])
        expect(by_id(page, "permission-allow")).to_have_count(0)
        expect(by_id(page, "permission-deny")).to_have_count(0)
        tool = page.locator('details[data-testid="entry-activity"]')
        expect(tool).to_have_count(1)
        expect(tool).to_contain_text("Bash · touch demo.txt")
        expect(tool).to_contain_text("created demo.txt (not really: this is the demo)")
        expect(agent_reply(page, "please ask permission")).to_have_count(1)
    relay.wait_idle(cid)

    # Deny, from the second browser this time.
    send_text(p1, "ask permission again")
    expect(by_id(p2, "permission-deny")).to_be_visible()
    by_id(p2, "permission-deny").click()
    for page in (p1, p2):
        expect(by_id(page, "permission-answer")).to_have_text(["Allowed", "Denied"])
        expect(by_id(page, "permission-deny")).to_have_count(0)
        expect(page.locator('details[data-testid="entry-activity"].failed')).to_contain_text(
            "Denied by the user."
        )
        expect(agent_reply(page, "ask permission again")).to_have_count(1)
    relay.wait_idle(cid)

    # A pending question survives a reload, buttons included.
    send_text(p1, "ask permission a third time")
    expect(by_id(p1, "permission-allow")).to_be_visible()
    p1.reload()
    expect(by_id(p1, "title")).to_have_text("Permissions")
    expect(by_id(p1, "permission-allow")).to_be_visible()
    expect(by_id(p1, "permission-deny")).to_be_visible()
    expect(by_id(p1, "permission-answer")).to_have_text(["Allowed", "Denied"])
    by_id(p1, "permission-allow").click()
    expect(by_id(p2, "permission-answer")).to_have_text(["Allowed", "Denied", "Allowed"])
    expect(agent_reply(p2, "ask permission a third time")).to_have_count(1)
    relay.wait_idle(cid)

    # Stopped while it asks: the card says why it is no longer asked (before: "Expired").
    send_text(p1, "ask permission once more")
    expect(by_id(p2, "permission-allow")).to_be_visible()
    by_id(p2, "stop-button").click()
    for page in (p1, p2):
        expect(by_id(page, "permission-answer")).to_have_text(
            ["Allowed", "Denied", "Allowed", "Expired: the turn was stopped"]
        )
        expect(by_id(page, "permission-allow")).to_have_count(0)
    relay.wait_idle(cid)
    pages.assert_clean()


# ---- 4. /compact ---------------------------------------------------------------------------------


def test_compact_command_in_two_browsers(pages: Pages, relay: LiveRelay) -> None:
    old = relay.create(title="Plan trip")["id"]
    assert relay.send(old, "hello there").status_code == 202
    relay.wait_idle(old)
    p1 = pages.open(relay, f"/c/{old}")
    p2 = pages.open(relay, f"/c/{old}")
    for page in (p1, p2):
        expect(agent_reply(page, "hello there")).to_have_count(1)

    # Keyboard: "/" offers the command, ArrowDown + Enter picks it, Enter sends it.
    box = by_id(p1, "message-input")
    box.click()
    box.press("/")
    menu = by_id(p1, "command-menu")
    expect(menu).to_be_visible()
    items = menu.get_by_test_id("command-item")
    expect(items.locator(".command-name")).to_have_text(["/compact", "/handoff", "/clear"])
    box.press("ArrowDown")
    box.press("ArrowUp")
    expect(items.first).to_have_attribute("aria-selected", "true")
    box.press("Enter")
    expect(box).to_have_value("/compact")
    expect(menu).to_be_hidden()
    box.press("Enter")
    dialog = by_id(p1, "compact-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_have_accessible_name(QUESTION)
    expect(dialog.get_by_text(QUESTION, exact=True)).to_be_visible()
    expect(dialog.get_by_role("button")).to_have_text(["Cancel", "Compact"])

    by_id(p1, "compact-cancel").click()
    expect(dialog).to_be_hidden()
    expect(box).to_have_value("/compact")
    expect(by_id(p1, "conversation-list").get_by_test_id("conversation-item")).to_have_count(1)
    expect(by_id(p1, "archive-list").get_by_test_id("archive-item")).to_have_count(0)
    assert relay.get(old)["status"] == "active"
    assert relay.http.get("/api/conversations?status=archived").json()["conversations"] == []
    expect(p1).to_have_url(f"{relay.base}/c/{old}")

    # Mouse: type part of it, click the item, click Send.
    box.fill("")
    box.type("/co")
    expect(menu.get_by_test_id("command-item")).to_have_count(1)
    menu.get_by_test_id("command-item").click()
    expect(box).to_have_value("/compact")
    expect(menu).to_be_hidden()
    by_id(p1, "send-button").click()
    expect(dialog).to_be_visible()
    by_id(p1, "compact-confirm").click()
    expect(dialog).to_be_hidden()

    new = relay.wait_for(old, lambda v: v["compacted_into_id"] is not None)["compacted_into_id"]
    assert new != old
    summary = "\n".join(
        [
            "Conversation: Plan trip",
            "User: hello there",
            "Agent: " + " ".join(reply_text("hello there").split()),
        ]
    )
    for page in (p1, p2):
        expect(page).to_have_url(f"{relay.base}/c/{new}")
        expect(by_id(page, "title")).to_have_text("Plan trip (compacted)")
        expect(by_id(page, "pending-summary")).to_be_visible()
        expect(by_id(page, "pending-summary-text")).to_be_hidden()
        by_id(page, "pending-summary-toggle").click()
        expect(by_id(page, "pending-summary-text")).to_be_visible()
        expect(by_id(page, "pending-summary-text")).to_contain_text("Conversation: Plan trip")
        expect(by_id(page, "pending-summary-text")).to_have_js_property("textContent", summary)
        expect(by_id(page, "entry-user")).to_have_count(0)
        expect(by_id(page, "conversation-list").get_by_test_id("conversation-item")).to_have_text(
            ["Plan trip (compacted)"]
        )
        expect(by_id(page, "archive-list").get_by_test_id("archive-item")).to_have_text(
            ["Plan trip"]
        )
        expect(by_id(page, "compacted-from-link")).to_have_attribute("href", f"/c/{old}")
    expect(by_id(p1, "message-input")).to_have_value("")

    # The archived one, read-only, links forward; the new one links back.
    by_id(p2, "archive-list").get_by_test_id("archive-item").click()
    expect(p2).to_have_url(f"{relay.base}/c/{old}")
    expect(by_id(p2, "title")).to_have_text("Plan trip")
    expect(agent_reply(p2, "hello there")).to_have_count(1)
    expect(by_id(p2, "message-input")).to_be_hidden()
    expect(by_id(p2, "composer")).to_be_hidden()
    expect(by_id(p2, "archived-notice")).to_be_visible()
    expect(by_id(p2, "archived-notice")).to_contain_text(
        "This conversation is archived (read-only)."
    )
    into = by_id(p2, "compacted-into-link")
    expect(into).to_be_visible()
    expect(into).to_have_attribute("href", f"/c/{new}")
    into.click()
    expect(p2).to_have_url(f"{relay.base}/c/{new}")
    expect(by_id(p2, "compacted-from-link")).to_be_visible()
    expect(by_id(p2, "compacted-from-link")).to_have_attribute("href", f"/c/{old}")

    # The first message consumes the summary; the bubble shows only what was typed.
    send_text(p1, "next step")
    for page in (p1, p2):
        expect(by_id(page, "pending-summary")).to_be_hidden()
        expect(by_id(page, "entry-user")).to_have_count(1)
        expect(by_id(page, "entry-user")).to_have_js_property("textContent", "next step")
    # The agent got the summary too: the demo quotes it, but acts only on the new request
    # (its own earlier reply in the summary names its trigger words; they must not fire).
    carried = p2.locator('[data-testid="entry-agent"][data-state="done"]')
    expect(carried.filter(has_text="You said: “[Carry-over context")).to_have_count(1)
    expect(by_id(p2, "permission-allow")).to_have_count(0)
    view = relay.wait_idle(new)
    assert view["pending_summary"] is None
    pages.assert_clean()


# ---- 5. auto-compaction by the agent -------------------------------------------------------------


def test_auto_compaction_line_pill_and_queue(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path, demo_delay=0.25)  # the compaction itself takes 2.5 s
    try:
        cid = relay.create(title="Long one")["id"]
        patched = relay.http.patch(
            f"/api/conversations/{cid}", json={"auto_compact_window": 100000}
        )
        assert patched.status_code == 200, patched.text
        for n in range(1, 6):
            assert relay.send(cid, f"turn {n}").status_code == 202
        view = relay.wait_idle(cid)
        assert view["context_tokens"] >= 67_000  # 9k + 5 × 12k (+ a token per prompt)
        assert view["threshold"] == 67_000

        page = pages.open(relay, f"/c/{cid}", viewport={"width": 1100, "height": 600})
        expect(agent_reply(page, "turn 5")).to_have_count(1)
        send = by_id(page, "send-button")
        expect(send).to_have_text("Send")

        send_text(page, "turn 6")
        compaction = by_id(page, "compaction-line")
        expect(compaction).to_have_text("Compacting context…")
        expect(by_id(page, "turn-indicator")).to_be_visible()
        expect(by_id(page, "turn-indicator")).to_have_text("Compacting the conversation…")
        expect(send).to_have_text("Queue")
        expect(by_id(page, "compaction-pill")).to_have_count(1)

        send_text(page, "while compacting")
        queued = user_bubble(page, "while compacting")
        expect(queued.get_by_test_id("queued-badge")).to_be_visible()
        expect(compaction).to_have_text("Compacting context…")  # still compacting when queued

        expect(compaction).to_have_text("Context compacted · 69k → 3k tokens")
        expect(by_id(page, "compaction-pill")).to_have_count(1)
        expect(agent_reply(page, "while compacting")).to_have_count(1)
        expect(by_id(page, "queued-badge")).to_have_count(0)
        expect(send).to_have_text("Send")
        relay.wait_idle(cid)

        # The pill brings the line into view.
        by_id(page, "timeline").evaluate("(el) => { el.scrollTop = el.scrollHeight; }")
        by_id(page, "timeline").evaluate("(el) => { el.scrollTop = 0; }")
        expect(compaction).not_to_be_in_viewport()
        by_id(page, "compaction-pill").click()
        expect(compaction).to_be_in_viewport()
        pages.assert_clean()
    finally:
        pages.close()
        relay.stop()


# ---- 6. the 🧠 modal and the auto-compact window -------------------------------------------------


def open_context(page: Page) -> Locator:
    by_id(page, "context-button").click()
    modal = by_id(page, "context-modal")
    expect(modal).to_be_visible()
    expect(by_id(page, "window-slider")).to_be_visible()
    return modal


def test_context_modal_window_saves_on_close(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Window")["id"]
    assert relay.send(cid, "hello").status_code == 202
    relay.wait_idle(cid)
    p1 = pages.open(relay, f"/c/{cid}")
    expect(by_id(p1, "context-button")).to_have_text("🧠 Context 21k / 200k")

    modal = open_context(p1)
    expect(by_id(p1, "window-line")).to_have_text("200k · model default")
    expect(by_id(p1, "window-label")).to_have_text("Auto")
    slider = by_id(p1, "window-slider")
    slider.focus()
    slider.press("ArrowRight")
    expect(by_id(p1, "window-label")).to_have_text("100k")
    expect(by_id(p1, "window-note")).to_have_text(IDLE_TEXT)
    assert relay.get(cid)["auto_compact_window"] is None  # moving it saves nothing
    slider.press("Escape")
    expect(modal).to_be_hidden()
    relay.wait_for(cid, lambda v: v["auto_compact_window"] == 100000, timeout=10)

    open_context(p1)
    expect(by_id(p1, "window-label")).to_have_text("100k")
    expect(by_id(p1, "window-slider")).to_have_value("1")
    expect(by_id(p1, "window-line")).to_have_text("100k · your setting")
    by_id(p1, "context-close").click()
    expect(modal).to_be_hidden()

    p2 = pages.open(relay, f"/c/{cid}")
    open_context(p2)
    expect(by_id(p2, "window-label")).to_have_text("100k")
    expect(by_id(p2, "window-line")).to_have_text("100k · your setting")
    p2.keyboard.press("Escape")
    expect(by_id(p2, "context-modal")).to_be_hidden()

    send_text(p1, "after the change")
    restart = "Restarted the session to apply the compaction window (Auto → 100k)"
    for page in (p1, p2):
        expect(line(page, restart)).to_have_text(restart)
        expect(agent_reply(page, "after the change")).to_have_count(1)
    relay.wait_idle(cid)
    assert relay.get(cid)["auto_compact_window"] == 100000
    pages.assert_clean()


def test_the_auto_notch_warns_with_the_environments_window(
    pages: Pages, relay: LiveRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a spec audit: with a setting of its own, the Auto notch assumed the model's
    # window, not the relay environment's (SPEC §4), and warned of nothing.
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000")
    cid = relay.create(title="Env")["id"]
    relay.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 500_000})
    for n in range(5):  # 9k + 5 × 12k = 69k: past Auto's 67k threshold (100k − 33k)
        relay.send(cid, f"m{n}")
        relay.wait_idle(cid)
    page = pages.open(relay, f"/c/{cid}")
    modal = open_context(page)
    expect(by_id(page, "window-label")).to_have_text("500k")
    expect(by_id(page, "window-warning")).to_be_hidden()
    slider = by_id(page, "window-slider")
    slider.focus()
    slider.press("Home")  # Auto
    expect(by_id(page, "window-label")).to_have_text("Auto")
    expect(by_id(page, "window-warning")).to_be_visible()
    slider.press("ArrowRight")  # 100k would too; 200k would not
    expect(by_id(page, "window-warning")).to_be_visible()
    slider.press("ArrowRight")
    expect(by_id(page, "window-warning")).to_be_hidden()
    page.keyboard.press("Escape")
    expect(modal).to_be_hidden()
    pages.assert_clean()


def test_context_modal_backdrop_saves_and_moving_back_saves_nothing(
    pages: Pages, relay: LiveRelay
) -> None:
    cid = relay.create(title="Window twice")["id"]
    assert relay.send(cid, "hello").status_code == 202
    relay.wait_idle(cid)
    page = pages.open(relay, f"/c/{cid}")
    patches: list[str] = []
    page.on("request", lambda r: patches.append(r.url) if r.method == "PATCH" else None)

    modal = open_context(page)
    slider = by_id(page, "window-slider")
    slider.focus()
    slider.press("ArrowRight")
    slider.press("ArrowRight")
    expect(by_id(page, "window-label")).to_have_text("200k")
    with page.expect_request(lambda r: r.method == "PATCH") as patch:
        page.mouse.click(5, 5)  # the backdrop, outside the dialog's box
    expect(modal).to_be_hidden()
    assert patch.value.post_data_json == {"auto_compact_window": 200000}
    relay.wait_for(cid, lambda v: v["auto_compact_window"] == 200000, timeout=10)

    send_text(page, "first")
    restart = "Restarted the session to apply the compaction window (Auto → 200k)"
    expect(line(page, restart)).to_have_text(restart)
    expect(agent_reply(page, "first")).to_have_count(1)
    relay.wait_idle(cid)

    # Move it away and back: closing saves nothing.
    open_context(page)
    expect(by_id(page, "window-line")).to_have_text("200k · your setting")
    expect(by_id(page, "window-label")).to_have_text("200k")
    slider.focus()
    slider.press("ArrowRight")
    expect(by_id(page, "window-label")).to_have_text("300k")
    slider.press("ArrowLeft")
    expect(by_id(page, "window-label")).to_have_text("200k")
    page.mouse.click(5, 5)
    expect(modal).to_be_hidden()
    open_context(page)
    expect(by_id(page, "window-label")).to_have_text("200k")
    expect(by_id(page, "window-line")).to_have_text("200k · your setting")
    page.keyboard.press("Escape")
    expect(modal).to_be_hidden()

    send_text(page, "second")
    expect(agent_reply(page, "second")).to_have_count(1)
    relay.wait_idle(cid)
    page.evaluate("0")  # let the page's events reach this side
    assert patches == [f"{relay.base}/api/conversations/{cid}"]  # the backdrop's, none since
    after = relay.get(cid)
    assert after["auto_compact_window"] == 200000
    expect(by_id(page, "entry-line").filter(has_text="Restarted the session")).to_have_count(1)
    pages.assert_clean()


# ---- 7. nothing the user or the agent writes runs as code ---------------------------------------

XSS = '<img src=x onerror="window.__xss=1"> <script>window.__xss=1</script>'


def test_titles_and_messages_are_shown_literally(pages: Pages, relay: LiveRelay) -> None:
    page = pages.open(relay)
    by_id(page, "empty-new-conversation").click()
    by_id(page, "new-title").fill(XSS)
    by_id(page, "new-provider").select_option("demo")
    by_id(page, "new-create").click()
    expect(page).to_have_url(re.compile(r"/c/\d+$"))
    cid = conv_id(page)
    message = XSS + ' <svg onload="alert(1)"></svg> [x](javascript:alert(1))'
    send_text(page, message)
    expect(by_id(page, "entry-agent")).to_have_attribute("data-state", "done")
    relay.wait_idle(cid)

    expect(by_id(page, "entry-user")).to_have_js_property("textContent", message)
    expect(by_id(page, "title")).to_have_js_property("textContent", XSS)
    expect(by_id(page, "conversation-item")).to_have_js_property("textContent", XSS)
    expect(page).to_have_title(f"{XSS} · oarlock")
    timeline = by_id(page, "timeline")
    expect(timeline.locator("img, script, svg, iframe")).to_have_count(0)
    expect(timeline.locator('a[href^="javascript:"]')).to_have_count(0)
    expect(by_id(page, "entry-agent")).to_contain_text("You said:")
    page.reload()
    expect(by_id(page, "entry-user")).to_have_js_property("textContent", message)
    expect(timeline.locator("img, script, svg, iframe")).to_have_count(0)
    assert page.evaluate("window.__xss") is None
    assert page.evaluate("document.querySelectorAll('img[src=\"x\"]').length") == 0
    pages.assert_clean()


# ---- 8. the XSS corpus through every channel ----------------------------------------------------


class PayloadAgent(StandIn):
    """A stand-in agent whose every output (text, tool input, tool output, lines) is a payload."""

    def __init__(self, spec: AgentSpec) -> None:
        super().__init__(spec)
        self.turns = 0

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """First turn: every payload through every kind of output; later: echo the prompt."""
        self.turns += 1
        if self.turns > 1:
            yield MessageDone(f"echo{self.turns}", prompt)
            yield TurnDone()
            return
        for n, payload in enumerate(PAYLOADS):
            yield Activity(f"t{n}", payload, "call", summary=payload)
            yield Activity(f"t{n}", payload, "result", summary=payload, output=payload)
            yield TextDelta(f"m{n}", payload)
            yield MessageDone(f"m{n}", payload)
        yield Notice(PAYLOADS[0], level="error")
        yield TurnDone()


def test_xss_corpus_is_inert_in_every_channel(pages: Pages, relay: LiveRelay) -> None:
    relay.supervisor.agent_factory = lambda _provider, spec, _settings: PayloadAgent(spec)
    for payload in PAYLOADS:  # titles: the sidebar shows all of them
        relay.create(title=payload[:200])
    cid = relay.create(title="corpus")["id"]
    for payload in PAYLOADS[:10]:  # user messages
        assert relay.send(cid, payload).status_code == 202
    relay.wait_idle(cid, timeout=60)
    page = pages.open(relay, f"/c/{cid}")
    # 56 payload messages + 9 echoes; 112 activity rows; all in the first page of 200 entries.
    expect(by_id(page, "entry-agent")).to_have_count(len(PAYLOADS) + 9)
    expect(by_id(page, "entry-activity")).to_have_count(len(PAYLOADS))
    expect(by_id(page, "conversation-item")).to_have_count(len(PAYLOADS) + 1)
    for details in page.locator("[data-testid=entry-activity] details").all()[:20]:
        details.evaluate("d => { d.open = true }")  # tool output shown too
    page.reload()
    expect(by_id(page, "entry-agent")).to_have_count(len(PAYLOADS) + 9)
    assert page.evaluate("window.__xss") is None
    for region in ("timeline", "conversation-list"):  # no markup from a payload became an element
        tags = "img, iframe, object, embed, svg, script, form, input, style, video, audio, marquee"
        assert page.locator(f"[data-testid={region}]").locator(tags).count() == 0
    shown = by_id(page, "entry-user").first.text_content()
    assert shown == PAYLOADS[0]
    pages.assert_clean()


# ---- 9. a permission question from the real Claude Code CLI -----------------------------------


def test_claude_permission_question_answered_in_the_browser(
    pages: Pages, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for name in ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with FakeAnthropic() as fake:
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
        monkeypatch.setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        relay = own_relay(tmp_path)
        try:
            cid = relay.create(provider="claude", title="Real CLI")["id"]
            work = Path(relay.get(cid)["cwd"])
            page = pages.open(relay, f"/c/{cid}")
            send_text(page, "[[BASH:touch created.txt]]")
            allow = by_id(page, "permission-allow")
            expect(allow).to_be_visible(timeout=30_000)
            card = by_id(page, "entry-activity").filter(has=allow)
            expect(card).to_contain_text(re.compile(r"Bash wants to run:\s*touch created.txt"))
            allow.click()
            expect(by_id(page, "permission-answer")).to_have_text("Allowed")
            expect(by_id(page, "entry-agent").filter(has_text="The tool returned:")).to_have_count(
                1, timeout=30_000
            )
            relay.wait_idle(cid)
            assert (work / "created.txt").is_file()
            pages.assert_clean()
        finally:
            relay.stop()


# ---- 10. a tab whose login is gone ------------------------------------------------------------


def test_tab_goes_to_login_when_its_session_is_gone(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path)
    cid = relay.create(title="Session")["id"]
    page = pages.open(relay, f"/c/{cid}")
    expect(by_id(page, "title")).to_have_text("Session")
    page.context.clear_cookies()  # as when the browser drops the cookie
    relay.stop()
    expect(by_id(page, "connection-status")).to_be_visible()
    again = LiveRelay(relay.settings).start()  # same port, same data: the socket retries
    try:
        # Back to this conversation after the login (before: to the newest one).
        expect(page).to_have_url(re.compile(rf"/login\?ended=1&next=/c/{cid}$"), timeout=20_000)
    finally:
        again.stop()


# ---- 11. long sidebar lists -------------------------------------------------------------------


def test_sidebar_shows_more_than_a_page(pages: Pages, relay: LiveRelay) -> None:
    for n in range(105):
        relay.create(title=f"c{n}")
    page = pages.open(relay)
    items = by_id(page, "conversation-list").get_by_test_id("conversation-item")
    expect(items).to_have_count(100)
    expect(items.first).to_have_text("c104")
    by_id(page, "active-more").click()
    expect(items).to_have_count(105)
    expect(items.last).to_have_text("c0")
    expect(by_id(page, "active-more")).to_have_count(0)
    pages.assert_clean()


# ---- 12. parts the issues name that the tests above do not reach ------------------------------

PILL_AND_LINE = """() => {
  const scroller = document.getElementById('timeline');
  const rail = document.getElementById('pill-rail');
  const line = document.querySelector('.line.compaction');
  const pill = document.querySelector('[data-testid=compaction-pill]');
  return [parseFloat(pill.style.top) / rail.clientHeight, line.offsetTop / scroller.scrollHeight];
}"""


def pill_follows_line(page: Page) -> float:
    """The line's relative height, once the pill stands at the same relative height."""
    page.wait_for_function(
        f"() => {{ const [p, l] = ({PILL_AND_LINE})(); return Math.abs(p - l) < 0.02; }}"
    )
    return float(page.evaluate(PILL_AND_LINE)[1])


def test_meter_warns_and_pill_follows_growth_and_resize(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path)
    try:
        cid = relay.create(title="Meter")["id"]
        relay.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 100_000})
        for n in range(3):  # 9k + 3 × 12k = 45k: below 80% of the 67k threshold
            relay.send(cid, f"m{n}")
            relay.wait_idle(cid)
        page = pages.open(relay, f"/c/{cid}", viewport={"width": 1000, "height": 700})
        meter = by_id(page, "context-button")
        expect(meter).to_have_text("🧠 Context 45k / 100k")
        expect(meter).not_to_have_attribute("data-warn", "true")
        relay.send(cid, "m3")  # 57k > 53.6k: the meter turns to its warning colour, live
        expect(meter).to_have_text("🧠 Context 57k / 100k")
        expect(meter).to_have_attribute("data-warn", "true")
        # Near auto-compaction, far below the context watch's soft (300k): dashed, not amber.
        style = meter.evaluate(
            "b => [getComputedStyle(b).borderStyle, getComputedStyle(b).backgroundColor]"
        )
        assert style[0] == "dashed" and style[1] != "rgb(255, 244, 223)", style
        assert meter.get_attribute("data-watch") is None
        for n in (4, 5):  # the 6th turn starts at 69k ≥ 67k: a compaction line and its pill
            relay.wait_idle(cid)
            relay.send(cid, f"m{n}")
        relay.wait_idle(cid)
        expect(by_id(page, "compaction-pill")).to_have_count(1)
        expect(meter).not_to_have_attribute("data-warn", "true")  # 15k after compacting
        at_first = pill_follows_line(page)
        for n in range(6, 12):  # the timeline grows below the line: it moves up the rail
            relay.send(cid, f"m{n}")
            relay.wait_idle(cid)
        after_growth = pill_follows_line(page)
        assert after_growth < at_first - 0.05
        page.set_viewport_size({"width": 520, "height": 900})  # reflow: the pill follows
        pill_follows_line(page)
        pages.assert_clean()
    finally:
        relay.stop()


def test_archive_search_filters_by_title(pages: Pages, relay: LiveRelay) -> None:
    for title in ("Fix the parser", "Write docs", "Parser benchmarks"):
        cid = relay.create(title=title)["id"]
        relay.send(cid, "/compact")
    page = pages.open(relay)
    archived = by_id(page, "archive-list").get_by_test_id("archive-item")
    expect(archived).to_have_count(3)
    expect(by_id(page, "drawer-close")).to_be_hidden()  # a wide screen: no drawer to close
    by_id(page, "archive-search").fill("parser")
    expect(archived).to_have_text(["Parser benchmarks", "Fix the parser"])
    by_id(page, "archive-search").fill("nothing like it")
    expect(archived).to_have_count(0)
    expect(page.get_by_text("No archived conversation matches.")).to_be_visible()
    pages.assert_clean()


def test_archive_search_finds_conversations_past_the_loaded_page(
    pages: Pages, relay: LiveRelay
) -> None:
    """The list holds the newest 100; the search asks the relay for the rest (a dogfood run:
    "No archived conversation matches." for one on the second page)."""
    titles = ["Needle oldest"] + [f"Filler {n}" for n in range(101)]
    for title in titles:  # archived in this order: the first is the oldest
        cid = relay.create(title=title)["id"]
        assert relay.http.post(f"/api/conversations/{cid}/archive").status_code == 200
    page = pages.open(relay)
    archived = by_id(page, "archive-list").get_by_test_id("archive-item")
    expect(archived).to_have_count(100)
    search = by_id(page, "archive-search")
    search.fill("needle")
    expect(archived).to_have_text(["Needle oldest"])
    expect(by_id(page, "archived-more")).to_have_count(0)  # every match is shown
    search.fill("FILLER")
    expect(archived).to_have_count(100)
    by_id(page, "archived-more").click()  # the matches' next page
    expect(archived).to_have_count(101)
    expect(archived.last).to_have_text("Filler 0")
    expect(by_id(page, "archived-more")).to_have_count(0)
    search.fill("nothing like it")
    expect(page.get_by_text("No archived conversation matches.")).to_be_visible()
    search.press("Escape")
    expect(by_id(page, "archived-more")).to_have_count(1)  # the whole archive's pages again
    pages.assert_clean()


def test_phone_layout_drawer_and_chat(pages: Pages, relay: LiveRelay) -> None:
    first = relay.create(title="On the phone")["id"]
    relay.create(title="Other")
    page = pages.open(relay, f"/c/{first}", viewport={"width": 390, "height": 800})
    sidebar_item = by_id(page, "conversation-list").get_by_test_id("conversation-item")
    expect(sidebar_item.first).not_to_be_in_viewport()  # the sidebar is a closed drawer
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scroll
    by_id(page, "menu-button").click()
    expect(sidebar_item.first).to_be_in_viewport()
    sidebar_item.filter(has_text="Other").click()
    expect(by_id(page, "title")).to_have_text("Other")
    expect(sidebar_item.first).not_to_be_in_viewport()  # choosing closes the drawer
    send_text(page, "hello from a phone")
    expect(agent_reply(page, "hello from a phone")).to_have_count(1)
    expect(by_id(page, "send-button")).to_be_in_viewport()
    pages.assert_clean()


def test_back_closes_the_drawer_on_a_phone(pages: Pages, relay: LiveRelay) -> None:
    # Found by a UX review on a phone: Back went to the conversation before and left the
    # drawer open over it.
    first = relay.create(title="First")["id"]
    second = relay.create(title="Second")["id"]
    page = pages.open(relay, f"/c/{first}", viewport={"width": 390, "height": 800})
    items = by_id(page, "conversation-list").get_by_test_id("conversation-item")
    by_id(page, "menu-button").click()
    items.filter(has_text="Second").click()  # chosen in the drawer
    expect(by_id(page, "title")).to_have_text("Second")
    by_id(page, "menu-button").click()
    expect(items.first).to_be_in_viewport()
    page.go_back()  # closes the drawer, stays
    expect(items.first).not_to_be_in_viewport()
    expect(page).to_have_url(f"{relay.base}/c/{second}")
    expect(by_id(page, "title")).to_have_text("Second")
    page.go_back()  # then the conversation before (not the drawer again)
    expect(page).to_have_url(f"{relay.base}/c/{first}")
    expect(by_id(page, "title")).to_have_text("First")
    by_id(page, "menu-button").click()
    page.locator("#scrim").click(position={"x": 380, "y": 400})  # closed by a tap beside it
    expect(items.first).not_to_be_in_viewport()
    by_id(page, "menu-button").click()
    page.wait_for_function(DRAWER_OPEN)
    assert box(by_id(page, "search-input"))["x"] >= 8  # not against the screen's edge
    close = by_id(page, "drawer-close")  # and by its own ✕, a finger's size
    assert box(close)["width"] >= 44 and box(close)["height"] >= 44
    close.click()
    expect(items.first).not_to_be_in_viewport()
    expect(by_id(page, "menu-button")).to_be_focused()
    page.go_back()  # no step left behind by the drawer: back before First
    expect(page).not_to_have_url(f"{relay.base}/c/{first}")
    pages.assert_clean()


def test_a_phone_with_its_keyboard_up_keeps_the_dialog_buttons_in_sight(
    pages: Pages, relay: LiveRelay
) -> None:
    # Found by a UX review on a phone: with the on-screen keyboard up, the New conversation
    # dialog's buttons were half off-screen. The page asks the keyboard to resize it
    # (interactive-widget=resizes-content); on the page so shortened, the form scrolls and its
    # buttons stay in sight.
    cid = relay.create(title="Keyboard")["id"]
    page = pages.open(relay, f"/c/{cid}", viewport={"width": 390, "height": 360})
    meta = page.locator('meta[name="viewport"]')
    expect(meta).to_have_attribute("content", re.compile(r"interactive-widget=resizes-content"))
    by_id(page, "menu-button").click()
    by_id(page, "new-conversation").click()
    expect(by_id(page, "new-title")).to_be_focused()
    expect(by_id(page, "new-create")).to_be_in_viewport(ratio=1)
    by_id(page, "new-cwd").fill("relative/path")
    by_id(page, "new-dialog").evaluate("d => { d.scrollTop = 0; }")  # the top of the form seen
    by_id(page, "new-create").click()
    error = by_id(page, "new-error")  # shown where the buttons are, not under them
    expect(error).to_have_text("The working directory must be an absolute path.")
    found = box(error)
    middle = {"x": found["x"] + found["width"] / 2, "y": found["y"] + found["height"] / 2}
    assert error.evaluate(SEEN_AT, middle), "the error is covered"
    by_id(page, "new-cwd").fill("")
    by_id(page, "new-title").fill("Typed with the keyboard up")
    by_id(page, "new-create").click()
    expect(by_id(page, "title")).to_have_text("Typed with the keyboard up")
    pages.assert_clean("status of 400")  # (the refused folder)


def box(locator: Locator) -> dict[str, float]:
    """The element's box in CSS pixels (it must be shown)."""
    found = locator.bounding_box()
    assert found is not None, locator
    return found


def test_phones_keep_the_header_readable_and_the_important_taps_large(
    pages: Pages, relay: LiveRelay
) -> None:
    # Found by a UX review on phones: at 360 px the agent's state could run under the 🧠
    # button; sideways (844 x 390) the sidebar was a fixed column and the title was
    # gone; Allow and Deny were 27 px tall; a desktop's "Enter to send" hint showed.
    old = relay.create(title="Renamed on the phone")["id"]
    compacted = relay.send(old, "/compact")
    assert compacted.status_code == 201, compacted.text
    cid = compacted.json()["compacted_into"]["id"]
    relay.send(cid, "please ask permission")
    relay.wait_for(cid, lambda v: v["questions"] == 1)
    touch = {"is_mobile": True, "has_touch": True}
    narrow = pages.open(relay, f"/c/{cid}", viewport={"width": 360, "height": 640}, **touch)
    expect(by_id(narrow, "stop-button")).to_be_visible()
    head, actions = box(narrow.locator(".chat-head")), box(by_id(narrow, "stop-button"))
    context = box(by_id(narrow, "context-button"))
    assert head["x"] + head["width"] <= context["x"] <= actions["x"]  # side by side, not over
    for part in ("agent-state", "provider-badge"):
        shown = box(by_id(narrow, part))
        assert shown["x"] + shown["width"] <= context["x"], part
    # The name is cut, never to nothing; " (compacted)" is kept whole, beside it.
    name, suffix = box(narrow.locator(".title-main")), box(narrow.locator(".title-suffix"))
    assert name["width"] >= 24 and name["x"] + name["width"] <= suffix["x"], (name, suffix)
    assert suffix["x"] + suffix["width"] <= context["x"]
    for answer in ("permission-allow", "permission-deny"):
        assert box(by_id(narrow, answer))["height"] >= 44, answer
    assert box(narrow.locator("#sidebar"))["x"] + box(narrow.locator("#sidebar"))["width"] <= -24

    sideways = pages.open(relay, f"/c/{cid}", viewport={"width": 844, "height": 390}, **touch)
    expect(by_id(sideways, "menu-button")).to_be_visible()  # a drawer, as on a phone held up
    items = by_id(sideways, "conversation-list").get_by_test_id("conversation-item")
    expect(items.first).not_to_be_in_viewport()
    expect(sideways.locator(".composer-keys")).to_be_hidden()  # no Enter or Shift on a touch screen
    expect(sideways.locator(".title-main")).to_have_text("Renamed on the phone")
    # Waited for, not read once: the title is drawn again with each conversation event, and a
    # CI run read it once while it was being replaced (no box at all).
    sideways.wait_for_function(TITLE_AT_LEAST, arg=150)
    by_id(sideways, "menu-button").click()
    expect(items.first).to_be_in_viewport()
    # A finger's ⋯ (40 px) ran over the time or "needs you" beside it (a dogfood run).
    item = sideways.locator(f'.conv-item[data-id="{cid}"]')
    expect(item.locator(".conv-meta")).to_contain_text("needs you")
    sideways.wait_for_function(DRAWER_OPEN)  # (not sliding in any more)
    meta, more = box(item.locator(".conv-meta")), box(item.locator(".conv-menu-btn"))
    assert meta["x"] + meta["width"] <= more["x"], (meta, more)
    pages.assert_clean()


# The shown title's width is at least the argument (CSS pixels).
DRAWER_OPEN = "() => document.getElementById('sidebar').getBoundingClientRect().x == 0"
SEEN_AT = "(el, p) => el.contains(document.elementFromPoint(p.x, p.y))"
TITLE_AT_LEAST = """(least) => {
  const title = document.querySelector('.title-main');
  return Boolean(title) && title.getBoundingClientRect().width >= least;
}"""


def test_load_earlier_pages_back_through_a_long_timeline(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Long")["id"]
    for n in range(110):  # 220 entries: more than the first page of 200
        relay.send(cid, f"n{n}")
    relay.wait_idle(cid, timeout=120)
    first_page = [e["text"] for e in relay.get(cid)["timeline"] if e["kind"] == "user"]
    assert 0 < len(first_page) < 110  # the first page (200 entries) does not hold them all
    page = pages.open(relay, f"/c/{cid}")
    expect(by_id(page, "entry-user")).to_have_count(len(first_page))
    expect(by_id(page, "entry-user").first).to_have_text(first_page[0])
    by_id(page, "load-earlier").click()
    expect(by_id(page, "entry-user")).to_have_count(110)
    expect(by_id(page, "entry-user").first).to_have_text("n0")
    expect(by_id(page, "load-earlier")).to_be_hidden()
    pages.assert_clean()


class ManyReplies(StandIn):
    """ "long turn": once the test has queued messages, 210 replies, then a wait for the test."""

    REPLIES = 210
    queued = threading.Event()
    go_on = threading.Event()

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Many replies in the long turn; one for any other."""
        if prompt == "long turn":
            await asyncio.to_thread(ManyReplies.queued.wait, 30)
            for n in range(self.REPLIES):
                yield MessageDone(f"r{n}", f"reply {n}")
            await asyncio.to_thread(ManyReplies.go_on.wait, 60)
        yield MessageDone("end", f"done: {prompt}")
        yield TurnDone()


def test_load_earlier_pages_back_past_a_message_queued_early_in_a_long_turn(
    pages: Pages, relay: LiveRelay
) -> None:
    # Found by a review: "Load earlier" went on from the lowest seq loaded, a queued message's
    # (always shown, numbered when it was queued): the turn's entries between it and the
    # first page were never shown.
    relay.supervisor.agent_factory = lambda _provider, spec, _settings: ManyReplies(spec)
    ManyReplies.queued.clear()
    ManyReplies.go_on.clear()
    cid = relay.create(title="Queued early")["id"]
    try:
        assert relay.send(cid, "long turn").status_code == 202
        assert relay.send(cid, "queued early").status_code == 202
        ManyReplies.queued.set()
        relay.wait_for(cid, lambda v: any(e["text"] == "reply 209" for e in v["timeline"]))
        page = pages.open(relay, f"/c/{cid}")
        replies = page.get_by_test_id("entry-agent")
        expect(replies.filter(has_text="reply 209")).to_have_count(1)
        expect(user_bubble(page, "queued early").get_by_test_id("queued-badge")).to_be_visible()
        expect(replies.filter(has_text="reply 0")).to_have_count(0)  # not in the first page
        by_id(page, "load-earlier").click()
        expect(replies.filter(has_text="reply 0")).to_have_count(1)
        expect(replies).to_have_count(210)
        expect(by_id(page, "load-earlier")).to_be_hidden()
    finally:
        ManyReplies.go_on.set()
    relay.wait_idle(cid, timeout=60)
    pages.assert_clean()


def test_a_long_queue_leaves_every_page_its_history(pages: Pages, relay: LiveRelay) -> None:
    # Found by reviews: with 250 messages queued in a long turn, queued messages took a page's
    # places (the page before the turn's replies held only queued ones, shown already, and
    # "Load earlier" asked for it again); with a page smaller than the queue, no history
    # showed at all (an API review). A page now holds only what is not queued.
    relay.supervisor.agent_factory = lambda _provider, spec, _settings: ManyReplies(spec)
    ManyReplies.queued.clear()
    ManyReplies.go_on.clear()
    cid = relay.create(title="Long queue")["id"]
    try:
        assert relay.send(cid, "hello").status_code == 202
        relay.wait_idle(cid)
        assert relay.send(cid, "long turn").status_code == 202
        for n in range(250):
            assert relay.send(cid, f"q{n}").status_code == 202
        ManyReplies.queued.set()
        relay.wait_for(cid, lambda v: any(e["text"] == "reply 209" for e in v["timeline"]))
        page = pages.open(relay, f"/c/{cid}")
        replies = page.get_by_test_id("entry-agent")
        expect(replies.filter(has_text="reply 209")).to_have_count(1)
        expect(replies).to_have_count(200)  # a whole page of the turn's replies (10 to 209)
        expect(page.get_by_test_id("queued-badge")).to_have_count(100)  # then the queue's next
        expect(user_bubble(page, "long turn")).to_have_count(0)
        by_id(page, "load-earlier").focus()
        page.keyboard.press("Enter")
        expect(user_bubble(page, "long turn")).to_have_count(1)
        expect(by_id(page, "timeline")).to_be_focused()  # the button gone (a review: the body)
        expect(replies.filter(has_text="done: hello")).to_have_count(1)
        expect(page.get_by_test_id("queued-badge")).to_have_count(100)  # none twice
    finally:
        ManyReplies.go_on.set()
    relay.wait_idle(cid, timeout=120)
    pages.assert_clean()


def test_browser_token_format_matches_the_server(pages: Pages, relay: LiveRelay) -> None:
    edges = [0, 999, 1000, 2450, 2500, 3000, 9949, 9950, 10_000, 150_046, 999_499, 999_500]
    edges += [1_000_000, 1_049_999, 1_050_000, 1_234_567]
    page = pages.open(relay)
    shown = page.evaluate(
        "async (ns) => { const u = await import('/static/util.js');"
        " return ns.map((n) => u.fmtTokens(n)); }",
        edges,
    )
    assert shown == [format_tokens(n) for n in edges]
