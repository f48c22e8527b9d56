"""The context watch and the handoff in Chromium (SPEC §7), with the demo agent.

The relays here run with small thresholds (soft 20k, hard 40k): the demo's context starts at
9k and grows 12k a turn, so one turn passes soft and three pass hard.
"""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect

from tests.browser import Pages, by_id, own_relay, send_text, user_bubble
from tests.relay import LiveRelay

SOFT, HARD = 20_000, 40_000
CLEAR_QUESTION = "Start a fresh conversation with the latest handoff?"
NO_HANDOFF = "No handoff was saved; the new conversation starts empty."
DEMO_HANDOFF = (
    "Done: Talked with the demo agent, which quoted every message.\n"
    "Next: Start fresh with /clear and carry on.\n"
    "Files: app/agents/demo.py, DemoAgent.turn"
)
AMBER = "rgb(255, 241, 214)"
RED = "rgb(253, 236, 235)"


def test_amber_red_bar_note_card_and_modal_edit(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path, context_soft=SOFT, context_hard=HARD)
    try:
        cid = relay.create(title="Watch")["id"]
        page = pages.open(relay, f"/c/{cid}")
        button, bar = by_id(page, "context-button"), by_id(page, "watch-bar")
        send_text(page, "m0")  # delivered at no known size: no note
        expect(button).to_have_text("🧠 Context 21k / 200k")
        expect(button).to_have_attribute("data-watch", "soft")
        expect(button).to_have_css("background-color", AMBER)  # (after its transition)
        expect(bar).to_be_visible()
        expect(by_id(page, "watch-text")).to_have_text(
            "Context at 21k tokens: a fresh start is recommended."
        )
        expect(bar.get_by_role("button")).to_have_text(["Save a handoff", "Start fresh"])
        expect(by_id(page, "context-note")).to_have_count(0)

        send_text(page, "m1")  # delivered at 21k: the note goes with it, the bubble stays "m1"
        bubble = user_bubble(page, "m1")
        expect(bubble.get_by_test_id("context-note")).to_have_text("Context note sent to the agent")
        expect(bubble.locator(".plain")).to_have_js_property("textContent", "m1")
        expect(by_id(page, "context-note")).to_have_count(1)
        expect(button).to_have_text("🧠 Context 33k / 200k")
        send_text(page, "m2")
        expect(button).to_have_text("🧠 Context 45k / 200k")
        expect(button).to_have_attribute("data-watch", "hard")
        expect(button).to_have_css("background-color", RED)
        expect(bar).to_have_attribute("data-level", "hard")
        expect(by_id(page, "watch-text")).to_have_text(
            "Context at 45k tokens: a fresh start is recommended."
        )

        by_id(page, "watch-handoff").click()  # sends /handoff: the demo saves one
        expect(user_bubble(page, "/handoff")).to_have_count(1)
        card = by_id(page, "handoff-card")
        expect(card).to_have_count(1)
        expect(card.locator(".handoff-title")).to_have_text("Handoff saved")
        expect(card).to_contain_text("Talked with the demo agent, which quoted every message.")
        expect(card).to_contain_text("app/agents/demo.py, DemoAgent.turn")

        button.click()
        expect(by_id(page, "context-modal")).to_be_visible()
        expect(by_id(page, "handoff-text")).to_have_js_property("textContent", DEMO_HANDOFF)
        expect(by_id(page, "handoff-meta")).to_contain_text("saved by the agent")
        by_id(page, "handoff-edit").click()
        expect(by_id(page, "handoff-files")).to_have_value("app/agents/demo.py\nDemoAgent.turn")
        by_id(page, "handoff-done").fill("x" * 5_000)
        by_id(page, "handoff-next").fill("y" * 4_001)
        by_id(page, "handoff-files").fill("")
        by_id(page, "handoff-save").click()
        expect(by_id(page, "handoff-error")).to_contain_text(
            "The handoff is 9,001 characters long; the limit is 9,000"
        )
        # Chromium logs the refused request; that one is expected, nothing else is.
        (refused,) = [p for p in pages.problems if "status of 422" in p]
        pages.problems.remove(refused)
        by_id(page, "handoff-done").fill("Parser <b>done</b>")
        by_id(page, "handoff-next").fill("Wire it in")
        by_id(page, "handoff-files").fill("app/parse.py\n\nparse_line\n")
        by_id(page, "handoff-save").click()
        expect(by_id(page, "handoff-form")).to_be_hidden()
        expect(by_id(page, "handoff-text")).to_have_js_property(
            "textContent",
            "Done: Parser <b>done</b>\nNext: Wire it in\nFiles: app/parse.py, parse_line",
        )
        expect(by_id(page, "handoff-meta")).to_contain_text("written by you")
        stored = relay.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"]
        assert (stored["done"], stored["files"], stored["source"]) == (
            "Parser <b>done</b>",
            ["app/parse.py", "parse_line"],
            "user",
        )
        # The agent saves another while the modal is open: the modal shows it at once.
        relay.send(cid, "save a handoff again")
        expect(by_id(page, "handoff-text")).to_have_js_property("textContent", DEMO_HANDOFF)
        expect(by_id(page, "handoff-meta")).to_contain_text("saved by the agent")
        by_id(page, "context-close").click()
        expect(by_id(page, "handoff-card")).to_have_count(2)
        pages.assert_clean()
    finally:
        relay.stop()


def test_clear_end_to_end_in_two_browsers(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path, context_soft=SOFT, context_hard=HARD)
    try:
        old = relay.create(title="Fresh")["id"]
        relay.send(old, "please save a handoff")
        relay.wait_idle(old)
        p1 = pages.open(relay, f"/c/{old}")
        p2 = pages.open(relay, f"/c/{old}")

        # Autocomplete lists the three commands, one line each; /cl narrows to /clear.
        box = by_id(p1, "message-input")
        box.click()
        box.press("/")
        items = by_id(p1, "command-menu").get_by_test_id("command-item")
        expect(items.locator(".command-name")).to_have_text(["/compact", "/handoff", "/clear"])
        expect(items.locator(".command-desc")).to_have_text(
            [
                "Start a new conversation with a carry-over summary",
                "Ask the agent to save a handoff for this project now",
                "Start a fresh conversation with the latest handoff",
            ]
        )
        box.type("cl")
        expect(items.locator(".command-name")).to_have_text(["/clear"])
        box.press("Enter")
        expect(box).to_have_value("/clear")
        box.press("Enter")
        dialog = by_id(p1, "clear-dialog")
        expect(dialog).to_be_visible()
        expect(dialog).to_have_accessible_name(CLEAR_QUESTION)
        expect(by_id(p1, "clear-handoff")).to_have_js_property("textContent", DEMO_HANDOFF)
        expect(by_id(p1, "clear-status")).to_be_hidden()
        by_id(p1, "clear-cancel").click()
        expect(dialog).to_be_hidden()
        assert relay.get(old)["status"] == "active"

        by_id(p1, "watch-fresh").click()  # the bar's Start fresh asks the same question
        expect(dialog).to_be_visible()
        by_id(p1, "clear-confirm").click()
        new = relay.wait_for(old, lambda v: v["compacted_into_id"] is not None)["compacted_into_id"]
        for page in (p1, p2):
            expect(page).to_have_url(f"{relay.base}/c/{new}")
            expect(by_id(page, "pending-summary")).to_be_visible()
            expect(by_id(page, "pending-summary-label")).to_have_text(
                "The handoff of the previous session will be sent with your first message."
            )
            expect(by_id(page, "watch-bar")).to_be_hidden()  # a fresh conversation: no size yet
            expect(by_id(page, "carry-from").get_by_test_id("carry-summary")).to_contain_text(
                "Carried here: the latest handoff. Left out: all "
            )
            expect(by_id(page, "archive-list").get_by_test_id("archive-item")).to_have_text(
                ["Fresh"]
            )
        expect(box).to_have_value("")
        send_text(p1, "carry on")
        for page in (p1, p2):
            expect(by_id(page, "entry-user")).to_have_js_property("textContent", "carry on")
            expect(
                page.locator('[data-testid="entry-agent"][data-state="done"]').filter(
                    has_text="You said: “[Handoff from the previous session] Done: Talked"
                )
            ).to_have_count(1)

        # A project with no handoff: the confirmation says the new one starts empty.
        other = tmp_path / "data" / "other"
        other.mkdir()
        bare = relay.create(title="Bare", cwd=str(other))["id"]
        p1.goto(f"{relay.base}/c/{bare}")
        send_text(p1, "/clear")
        expect(by_id(p1, "clear-status")).to_have_text(NO_HANDOFF)
        expect(by_id(p1, "clear-handoff")).to_be_hidden()
        by_id(p1, "clear-confirm").click()
        moved = relay.wait_for(bare, lambda v: v["compacted_into_id"] is not None)
        expect(p1).to_have_url(f"{relay.base}/c/{moved['compacted_into_id']}")
        expect(by_id(p1, "pending-summary")).to_be_hidden()
        pages.assert_clean()
    finally:
        relay.stop()


def test_a_handoff_being_written_survives_the_modal_closing(pages: Pages, relay: LiveRelay) -> None:
    # Found by a hostile review: closing the 🧠 modal (Esc, ✕, a click outside) dropped a
    # handoff being written, without a word.
    cid = relay.create(title="Half written")["id"]
    page = pages.open(relay, f"/c/{cid}")
    by_id(page, "context-button").click()
    by_id(page, "handoff-edit").click()
    by_id(page, "handoff-done").fill("The parser")
    by_id(page, "handoff-next").fill("Its tests")
    page.keyboard.press("Escape")
    expect(by_id(page, "context-modal")).to_be_hidden()
    by_id(page, "context-button").click()
    expect(by_id(page, "handoff-form")).to_be_visible()
    expect(by_id(page, "handoff-done")).to_have_value("The parser")
    expect(by_id(page, "handoff-next")).to_have_value("Its tests")
    by_id(page, "handoff-cancel").click()  # Cancel lets it go
    expect(by_id(page, "handoff-edit")).to_be_focused()  # (a review: the page's body had it)
    by_id(page, "context-close").click()
    by_id(page, "context-button").click()
    expect(by_id(page, "handoff-edit")).to_have_text("Write a handoff")
    expect(by_id(page, "handoff-form")).to_be_hidden()
    assert relay.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"] is None
    # Save lets it go too: reopened, the modal shows the handoff saved, not a form.
    by_id(page, "handoff-edit").click()
    by_id(page, "handoff-done").fill("The lexer")
    by_id(page, "handoff-save").focus()
    page.keyboard.press("Enter")  # saved from the keyboard
    expect(by_id(page, "handoff-text")).to_contain_text("The lexer")
    expect(by_id(page, "handoff-edit")).to_be_focused()
    by_id(page, "context-close").click()
    by_id(page, "context-button").click()
    expect(by_id(page, "handoff-text")).to_contain_text("The lexer")
    expect(by_id(page, "handoff-edit")).to_have_text("Edit")
    expect(by_id(page, "handoff-form")).to_be_hidden()
    assert relay.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"]["done"] == (
        "The lexer"
    )
    pages.assert_clean()
