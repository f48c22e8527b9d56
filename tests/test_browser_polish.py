"""Issue 17's rough edges, each seen where a user meets it: a real Chromium, desktop and phone."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from app.agents.base import (
    Activity,
    AgentEvent,
    AgentSpec,
    CompactionFinished,
    CompactionStarted,
    MessageDone,
    Notice,
    PermissionRequest,
    TextDelta,
    TurnDone,
)
from tests.browser import Pages, by_id, line, own_relay, send_text
from tests.fake_anthropic import FakeAnthropic
from tests.relay import LiveRelay
from tests.stand_in import StandIn

PHONE = {"viewport": {"width": 390, "height": 780}, "is_mobile": True, "has_touch": True}

Script = Callable[["ScriptAgent", str], AsyncIterator[AgentEvent]]


class ScriptAgent(StandIn):
    """A stand-in agent whose turns are a test's script."""

    def __init__(self, spec: AgentSpec, script: Script) -> None:
        super().__init__(spec)
        self.script = script
        self.interrupted = False

    async def interrupt(self) -> None:
        """Stop at the script's next check."""
        self.interrupted = True

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Run the script."""
        self.interrupted = False
        async for event in self.script(self, prompt):
            yield event


def use_script(relay: LiveRelay, script: Script) -> None:
    """Every conversation's agent runs script."""
    relay.supervisor.agent_factory = lambda _p, spec, _s: ScriptAgent(spec, script)


def reply(text: str) -> Script:
    """A script answering text in one message."""

    async def script(_agent: ScriptAgent, _prompt: str) -> AsyncIterator[AgentEvent]:
        yield MessageDone("m1", text)
        yield TurnDone()

    return script


def open_new(pages: Pages, relay: LiveRelay, **context: Any) -> tuple[Page, int]:
    """A page showing a new demo conversation."""
    cid = relay.create(title="Polish")["id"]
    return pages.open(relay, f"/c/{cid}", **context), cid


# ---- 1. a reply renders while it streams ------------------------------------------------------


def test_streaming_reply_is_rendered_as_it_streams(pages: Pages, relay: LiveRelay) -> None:
    page, cid = open_new(pages, relay)
    send_text(page, "slow please")  # the demo's long reply: ~200 pieces
    streaming = page.locator('[data-testid="entry-agent"][data-state="streaming"]')
    # "I am the **demo** agent" is bold while the reply is still being written.
    expect(streaming.locator("strong")).to_have_text("demo")
    expect(streaming.locator("em").first).to_have_text("use a tool")
    done = page.locator('[data-testid="entry-agent"][data-state="done"]')
    expect(done.locator("strong")).to_have_text("demo")
    relay.wait_idle(cid)
    pages.assert_clean()


def _stream_markdown(looked: threading.Event) -> Script:
    """A reply whose raw HTML and link arrive in pieces; it ends once the test has looked."""

    async def script(_agent: ScriptAgent, _prompt: str) -> AsyncIterator[AgentEvent]:
        pieces = ["Here is ", "<img src=x onerror=window.__xss=1> ", "**bold", "** and ", "a list:"]
        for piece in [*pieces, "\n\n- one\n- two"]:
            yield TextDelta("s1", piece)
            await asyncio.sleep(0.15)
        # The partial rendering stays while the test looks (it was a fixed 3 s: slow, and a
        # limit on how long the checks could take).
        await asyncio.to_thread(looked.wait, 60)
        yield MessageDone("s1", "done")
        yield TurnDone()

    return script


def test_streaming_rendering_stays_sanitized(pages: Pages, relay: LiveRelay) -> None:
    looked = threading.Event()
    use_script(relay, _stream_markdown(looked))
    page, cid = open_new(pages, relay)
    send_text(page, "go")
    streaming = page.locator('[data-testid="entry-agent"][data-state="streaming"]')
    expect(streaming.locator("li")).to_have_text(["one", "two"])
    expect(streaming.locator("strong")).to_have_text("bold")
    expect(streaming).to_contain_text("<img src=x onerror=window.__xss=1>")  # shown as text
    assert streaming.locator("img").count() == 0
    assert page.evaluate("window.__xss") is None
    looked.set()
    relay.wait_idle(cid)
    pages.assert_clean()


def _fast_then_slow(looked: threading.Event) -> Script:
    """A few words, then 150,000 characters at once (faster than anyone reads), then a pause."""

    async def script(_agent: ScriptAgent, _prompt: str) -> AsyncIterator[AgentEvent]:
        yield TextDelta("f1", "**first** words ")
        await asyncio.sleep(0.3)  # rendered by now
        for _ in range(15):
            yield TextDelta("f1", "x" * 9_999 + " ")
        yield TextDelta("f1", "**late** end")
        await asyncio.to_thread(looked.wait, 60)  # the text stops growing
        yield MessageDone("f1", "done")
        yield TurnDone()

    return script


def test_a_text_growing_faster_than_it_is_read_stays_plain_until_it_slows(
    pages: Pages, relay: LiveRelay
) -> None:
    # A rendering waits as long as the text it would render needs (RENDER_CHARS_PER_SECOND:
    # 1.5 s for these 150,000 characters); before, the pause grew with the text last
    # rendered, and the whole text was rendered and sent to every tab 0.1 s after the last.
    looked = threading.Event()
    use_script(relay, _fast_then_slow(looked))
    page, cid = open_new(pages, relay)
    send_text(page, "go")
    streaming = page.locator('[data-testid="entry-agent"][data-state="streaming"]')
    bold = streaming.locator("strong")
    expect(bold).to_have_text("first")
    plain = "el => el.textContent.includes('**late** end')"  # arrived, not rendered yet
    streaming.wait_for(state="attached")
    selector = "[data-testid=entry-agent][data-state=streaming]"
    page.wait_for_function(f"() => ({plain})(document.querySelector('{selector}'))")
    page.wait_for_timeout(300)  # well inside the 1.5 s
    assert bold.all_text_contents() == ["first"]
    assert streaming.evaluate(plain)
    # No longer growing: rendered while the message still streams.
    expect(bold).to_have_text(["first", "late"], timeout=10_000)
    assert streaming.get_attribute("data-state") == "streaming"
    looked.set()
    relay.wait_idle(cid)
    pages.assert_clean()


# ---- 2. highlighted code, links, a copy button every font can show ----------------------------

CODE_REPLY = (
    "```python\ndef answer():\n    return 42\n```\n\nDocs: https://example.com/docs and app.py"
)


def test_code_is_highlighted_urls_are_links_and_copy_is_a_word(
    pages: Pages, relay: LiveRelay
) -> None:
    use_script(relay, reply(CODE_REPLY))
    for context in ({}, PHONE):
        page, cid = open_new(pages, relay, **context)
        send_text(page, "code please")
        agent = page.locator('[data-testid="entry-agent"][data-state="done"]')
        keyword = agent.locator("pre code span.k").first
        expect(keyword).to_have_text("def")
        # highlight.css is loaded: a keyword is coloured unlike the code around it.
        colours = keyword.evaluate(
            "k => [getComputedStyle(k).color, getComputedStyle(k.closest('code')).color]"
        )
        assert colours[0] != colours[1]
        link = agent.get_by_role("link", name="https://example.com/docs")
        expect(link).to_have_attribute("href", "https://example.com/docs")
        assert agent.get_by_role("link").count() == 1  # app.py is a file name, not a link
        copy = agent.get_by_test_id("copy-code")
        expect(copy).to_have_text("Copy")
        if context:  # a phone has no hover: the button is shown
            expect(copy).to_have_css("opacity", "1")
        relay.wait_idle(cid)
    pages.assert_clean()


# ---- 3. edits asked and shown as diffs, the question above its tool's row ---------------------

EDIT_INPUT = {
    "file_path": "/work/app.py",
    "old_string": "def answer():\n    return 41\n",
    "new_string": "def answer():\n    return 42\n",
}
WRITE_INPUT = {"file_path": "/work/NOTES.md", "content": "first line\nsecond line\n"}


async def _edit_then_write(agent: ScriptAgent, _prompt: str) -> AsyncIterator[AgentEvent]:
    """As Claude Code does: the call is announced, then permission is asked, then it runs."""
    for tool_id, name, tool_input in (("e1", "Edit", EDIT_INPUT), ("w1", "Write", WRITE_INPUT)):
        summary = tool_input["file_path"]
        yield Activity(tool_id, name, "call", summary=summary, input=tool_input)
        decision = await agent.spec.ask_permission(PermissionRequest(name, tool_input, tool_id))
        output = "The file was updated." if decision.allow else "Denied."
        yield Activity(tool_id, name, "result", summary=summary, output=output)
    yield MessageDone("m1", "Edited.")
    yield TurnDone()


HIDDEN_TAIL = {"command": "npm run build" + "\n" * 40 + "touch /tmp/elsewhere/PWNED"}


Call = tuple[str, str, dict[str, Any]]  # tool id, tool name, input


def asking(*calls: Call) -> Callable[[ScriptAgent, str], AsyncIterator[AgentEvent]]:
    """A turn that asks permission for each call in turn (denied or allowed, it goes on)."""

    async def script(agent: ScriptAgent, _prompt: str) -> AsyncIterator[AgentEvent]:
        for tool_id, name, tool_input in calls:
            yield Activity(tool_id, name, "call", summary=name, input=tool_input)
            request = PermissionRequest(name, tool_input, tool_id)
            decision = await agent.spec.ask_permission(request)
            yield Activity(tool_id, name, "result", summary=name, output=str(decision.allow))
        yield TurnDone()

    return script


def test_a_pending_permission_shows_the_whole_command(pages: Pages, relay: LiveRelay) -> None:
    # A hostile review: 40 blank lines pushed a command's second part below the card's 220 px
    # box, which Chromium showed with no scrollbar: "npm run build" was all one saw.
    use_script(relay, asking(("b1", "Bash", HIDDEN_TAIL)))
    page, cid = open_new(pages, relay)
    send_text(page, "build please")
    box = page.locator(".permission.state-pending .perm-input")
    expect(box).to_contain_text("touch /tmp/elsewhere/PWNED")
    assert box.evaluate("e => e.scrollHeight <= e.clientHeight + 1")  # nothing scrolled away
    by_id(page, "permission-deny").click()
    relay.wait_idle(cid)
    pages.assert_clean()


REVERSED = 'echo "\u202e"; touch /tmp/elsewhere/PWNED; echo "\u202c done"'
EDIT_HIDDEN = {"file_path": "/work/app.py", "old_string": "a = 1", "new_string": "a = 1\u200b"}


def test_a_permission_shows_invisible_characters_as_their_codes(
    pages: Pages, relay: LiveRelay
) -> None:
    # A hostile review: a U+202E in a command made "touch …PWNED" read as a harmless echo of a
    # garbled string in the card; Allow ran it.
    use_script(
        relay,
        asking(
            ("b0", "Bash", {"command": "ls -la"}),
            ("b1", "Bash", {"command": REVERSED, "timeout": "\u2066600\u2069"}),
            ("e1", "Edit", EDIT_HIDDEN),
        ),
    )
    page, cid = open_new(pages, relay)
    send_text(page, "go")
    box = page.locator(".permission.state-pending .perm-input")
    expect(box).to_have_text("ls -la")
    expect(by_id(page, "permission-hidden")).to_have_count(0)  # nothing hidden: no warning
    by_id(page, "permission-deny").click()
    expect(box).to_have_text('echo "⟨U+202E⟩"; touch /tmp/elsewhere/PWNED; echo "⟨U+202C⟩ done"')
    card = page.locator(".permission.state-pending")
    expect(card.locator(".perm-field")).to_have_text(["timeout: ⟨U+2066⟩600⟨U+2069⟩"])
    expect(by_id(card, "permission-hidden")).to_contain_text("invisible characters")
    by_id(page, "permission-deny").click()
    card = page.locator(".permission.state-pending")
    expect(by_id(card, "diff")).to_contain_text("+a = 1⟨U+200B⟩")
    expect(by_id(card, "permission-hidden")).to_be_visible()
    by_id(page, "permission-deny").click()
    relay.wait_idle(cid)
    pages.assert_clean()


PHONE_QUESTIONS = {
    "questions": [
        {
            "question": "Which store?",
            "header": "Store",
            "options": [
                {"label": "PostgreSQL", "description": "A server, with pgvector for the search"},
                {"label": "Qdrant", "description": "A vector database beside the relational one"},
                {"label": "Long", "description": "word " * 5000},
            ],
            "multiSelect": False,
        }
    ]
}


def test_the_agent_s_question_reads_on_a_phone(pages: Pages, relay: LiveRelay) -> None:
    # A hostile review: on a phone the descriptions squeezed the labels to a few letters a
    # line ("Q/dr/an/t"), and a long option made the form 66,668 px tall.
    use_script(relay, asking(("q1", "AskUserQuestion", PHONE_QUESTIONS)))
    page, cid = open_new(pages, relay, **PHONE)
    send_text(page, "ask me")
    labels = page.locator(".question-label")
    expect(labels).to_have_count(3)
    for label in labels.all():
        box = label.bounding_box()
        assert box is not None and box["height"] < 30, box  # one line: "Qdrant" unbroken
    longest = page.locator(".question-option-text").nth(2).bounding_box()
    assert longest is not None and longest["height"] < 300, longest
    page.get_by_label("Qdrant").check()
    by_id(page, "question-submit").click()
    expect(by_id(page, "permission-answer")).to_have_text("Answered")
    relay.wait_idle(cid)
    pages.assert_clean()


BACKGROUND = {
    "command": "./serve.sh",
    "description": "Start the server",
    "run_in_background": True,
    "dangerouslyDisableSandbox": True,
}
REPLACE_ALL = EDIT_INPUT | {"replace_all": True}
SAVE = {"file_path": "/work/notes.md", "content": "the notes"}  # no diff: its content is a row


def test_a_permission_shows_every_field_it_approves(pages: Pages, relay: LiveRelay) -> None:
    # A hostile review: the card showed the command alone, so Allow also approved what it did
    # not show (a run in the background, outside the sandbox; an edit of every occurrence).
    use_script(
        relay,
        asking(
            ("b1", "Bash", BACKGROUND),
            ("e1", "Edit", REPLACE_ALL),
            ("e2", "Edit", EDIT_INPUT | {"replace_all": False}),
            ("s1", "mcp__notes__save", SAVE),
        ),
    )
    page, cid = open_new(pages, relay)
    send_text(page, "serve please")
    card = page.locator(".permission.state-pending")
    expect(card.locator(".perm-input")).to_have_text("./serve.sh")
    expect(card.locator(".perm-field")).to_have_text(
        ["run_in_background: true", "dangerouslyDisableSandbox: true"]
    )
    by_id(page, "permission-deny").click()
    card = page.locator(".permission.state-pending")
    expect(card).to_contain_text("Edit wants to edit:")
    expect(card.locator(".perm-field")).to_have_text(["replace_all: true"])
    by_id(page, "permission-deny").click()
    card = page.locator(".permission.state-pending")
    expect(card).to_contain_text("Edit wants to edit:")
    expect(card.locator(".diff")).to_be_visible()
    expect(card.locator(".perm-field")).to_have_count(0)  # an option left off is no row (a review)
    by_id(page, "permission-deny").click()
    card = page.locator(".permission.state-pending")
    expect(card.locator(".perm-input")).to_have_text("/work/notes.md")
    expect(card.locator(".perm-field")).to_have_text(["content: the notes"])
    by_id(page, "permission-deny").click()
    relay.wait_idle(cid)
    pages.assert_clean()


def test_edit_and_write_permissions_show_diffs_above_their_tool_rows(
    pages: Pages, relay: LiveRelay
) -> None:
    use_script(relay, _edit_then_write)
    for context in ({}, PHONE):
        page, cid = open_new(pages, relay, **context)
        send_text(page, "edit please")
        card = page.locator(".permission.state-pending")
        expect(card).to_contain_text("Edit wants to edit:")
        expect(card.locator(".perm-input")).to_have_text("/work/app.py")
        expect(card.locator(".diff-line.del")).to_have_text(["-    return 41"])
        expect(card.locator(".diff-line.add")).to_have_text(["+    return 42"])
        expect(card.locator(".diff")).to_be_visible()
        # The question comes first, then the row of the tool it asks about.
        kinds = page.locator("#entries > .entry").evaluate_all(
            "els => els.map(e => e.classList.contains('permission') ? 'ask' : e.tagName)"
        )
        assert kinds[-2:] == ["ask", "DETAILS"], kinds
        by_id(page, "permission-allow").click()
        card = page.locator(".permission.state-pending")
        expect(card).to_contain_text("Write wants to write:")
        expect(card.locator(".diff-line.add")).to_have_text(["+first line", "+second line"])
        by_id(page, "permission-allow").click()
        agent_done = page.locator('[data-testid="entry-agent"][data-state="done"]')
        expect(agent_done).to_have_text("Edited.")
        order = page.locator("#entries > .entry").evaluate_all(
            "els => els.map(e => e.classList.contains('permission') ? 'ask' : e.dataset.kind)"
        )
        assert order == ["user", "ask", "activity", "ask", "activity", "agent"], order
        # The finished edit's row shows its diff too.
        row = page.locator("details.tool").first
        row.locator("summary").click()
        expect(row.locator(".diff-line.add")).to_have_text(["+    return 42"])
        relay.wait_idle(cid)
    pages.assert_clean()


# ---- 6. Esc stops a running turn and keeps the draft -------------------------------------------


def test_escape_stops_the_turn_and_keeps_the_draft(pages: Pages, relay: LiveRelay) -> None:
    page, cid = open_new(pages, relay)
    send_text(page, "slow please")
    expect(page.locator('[data-testid="entry-agent"][data-state="streaming"]')).to_be_visible()
    box = by_id(page, "message-input")
    box.fill("/")  # Esc first closes the command menu, and only that
    expect(by_id(page, "command-menu")).to_be_visible()
    box.press("Escape")
    expect(by_id(page, "command-menu")).to_be_hidden()
    expect(by_id(page, "stop-button")).to_be_visible()
    box.fill("my next question")
    box.press("Escape")
    expect(line(page, "Interrupted by the user.")).to_be_visible()
    expect(by_id(page, "entry-agent")).not_to_contain_text("word200")  # cut short
    expect(box).to_have_value("my next question")
    expect(by_id(page, "stop-button")).to_be_hidden()
    assert relay.wait_idle(cid)["turn"]["state"] == "idle"
    pages.assert_clean()


def test_while_a_turn_runs_esc_in_the_archive_search_clears_it_and_only_compact_gets_its_hint(
    pages: Pages, relay: LiveRelay
) -> None:
    # Found by a review: Esc in the archive search stopped the turn (and the box kept its
    # text), and the "/compact" hint showed for any text beginning with a slash.
    page, cid = open_new(pages, relay)
    send_text(page, "slow please")
    expect(page.locator('[data-testid="entry-agent"][data-state="streaming"]')).to_be_visible()
    archive = by_id(page, "archive-search")
    archive.fill("Watch")
    archive.press("Escape")
    expect(archive).to_have_value("")
    box, hint = by_id(page, "message-input"), by_id(page, "compact-hint")
    box.fill("/comp")
    expect(hint).to_have_text("Send /compact when the agent is idle.")
    expect(hint).to_be_visible()
    box.fill("/handoff")
    page.wait_for_timeout(300)  # (expect would pass on any moment it is hidden)
    assert hint.is_hidden()
    box.fill(" /compact ")
    expect(hint).to_be_visible()
    expect(by_id(page, "stop-button")).to_be_visible()  # the turn still runs
    expect(line(page, "Interrupted by the user.")).to_have_count(0)
    by_id(page, "stop-button").click()
    expect(line(page, "Interrupted by the user.")).to_be_visible()
    expect(hint).to_be_hidden()  # idle: /compact may go
    relay.wait_idle(cid)
    pages.assert_clean()


# ---- 9. a reconnection clears what the disconnection showed -------------------------------------


def _overlap(a: dict[str, float] | None, b: dict[str, float] | None) -> bool:
    assert a is not None and b is not None
    return not (
        a["x"] + a["width"] <= b["x"]
        or b["x"] + b["width"] <= a["x"]
        or a["y"] + a["height"] <= b["y"]
        or b["y"] + b["height"] <= a["y"]
    )


def test_reconnecting_hides_the_unreachable_error_and_never_covers_the_title(
    pages: Pages, tmp_path: Path
) -> None:
    relay = own_relay(tmp_path)
    try:
        cid = relay.create(title="A title long enough to reach the middle of the header bar")["id"]
        desktop = pages.open(relay, f"/c/{cid}")
        phone = pages.open(relay, f"/c/{cid}", **PHONE)
        for page in (desktop, phone):
            expect(by_id(page, "title")).to_contain_text("A title")
        relay.stop()
        for page in (desktop, phone):
            status = by_id(page, "connection-status")
            expect(status).to_be_visible()
            assert not _overlap(status.bounding_box(), by_id(page, "title").bounding_box())
        send_text(desktop, "hello while offline")
        error = by_id(desktop, "composer-error")
        expect(error).to_contain_text("The relay cannot be reached")
        relay = LiveRelay(relay.settings).start()  # same port, same data: the socket retries
        for page in (desktop, phone):
            expect(by_id(page, "connection-status")).to_be_hidden(timeout=20_000)
        expect(error).to_be_hidden()
        expect(by_id(desktop, "message-input")).to_have_value("hello while offline")
    finally:
        relay.stop()
    # The relay went away: refused, reset on a kept-alive connection it closed while stopping, or
    # "not connected" when Chromium reused a pooled socket the relay had just closed (seen in CI).
    # (allowed by assert_clean itself: a console error can still arrive while it asks the pages)
    pages.assert_clean("ERR_CONNECTION_REFUSED", "ERR_CONNECTION_RESET", "ERR_SOCKET_NOT_CONNECTED")


# ---- 7. the 🧠 button and modal say the same, and say only what is true ----------------------


def test_context_modal_on_a_fresh_compacted_conversation(pages: Pages, relay: LiveRelay) -> None:
    cid = relay.create(title="Before")["id"]
    relay.send(cid, "hello")
    relay.wait_idle(cid)
    new = relay.send(cid, "/compact").json()["compacted_into"]["id"]
    page = pages.open(relay, f"/c/{new}")
    button = by_id(page, "context-button")
    expect(button).to_have_text("🧠 Context — / 200k")  # a word for fonts without the emoji
    button.click()
    expect(by_id(page, "context-used")).to_have_text("— used of 200k")  # not "0 used"
    marker = page.locator("#context-marker")
    expect(marker).to_have_attribute("data-threshold", "167000")
    # Nothing changed and no session yet: no word of a restart, nothing to save.
    expect(by_id(page, "window-note")).to_be_hidden()
    expect(by_id(page, "window-save")).to_be_hidden()
    left = marker.evaluate("m => m.style.left")
    slider = by_id(page, "window-slider")
    slider.focus()
    slider.press("ArrowRight")
    expect(by_id(page, "window-label")).to_have_text("100k")
    expect(marker).to_have_attribute("data-threshold", "67000")  # the marker follows the slider
    assert marker.evaluate("m => m.style.left") != left
    expect(by_id(page, "window-note")).to_have_text("Applies on the next message.")
    expect(by_id(page, "window-save")).to_have_text("Saved when you close this dialog.")
    slider.press("ArrowLeft")
    expect(marker).to_have_attribute("data-threshold", "167000")
    expect(by_id(page, "window-note")).to_be_hidden()
    expect(by_id(page, "window-save")).to_be_hidden()
    by_id(page, "context-close").click()
    assert relay.get(new)["auto_compact_window"] is None
    pages.assert_clean()


# ---- 8. a compacted conversation on a phone ---------------------------------------------------

LONG_TITLE = "A rather long conversation title that cannot fit on a phone"


def test_phone_header_keeps_badge_and_compacted_and_banner_names_the_source(
    pages: Pages, relay: LiveRelay
) -> None:
    cid = relay.create(title=LONG_TITLE)["id"]
    relay.send(cid, "hello")
    relay.wait_idle(cid)
    new = relay.send(cid, "/compact").json()["compacted_into"]["id"]
    page = pages.open(relay, f"/c/{new}", **PHONE)
    title = by_id(page, "title")
    expect(title).to_have_text(f"{LONG_TITLE} (compacted)")
    expect(by_id(page, "provider-badge")).to_be_visible()
    expect(by_id(page, "provider-badge")).to_have_text("Demo (offline)")
    suffix = title.locator(".title-suffix")
    expect(suffix).to_be_visible()
    box, inner = title.bounding_box(), suffix.bounding_box()
    assert box is not None and inner is not None
    assert inner["x"] + inner["width"] <= box["x"] + box["width"] + 0.5  # not cut off
    assert title.locator(".title-main").evaluate("e => e.scrollWidth > e.clientWidth")  # cut
    banner = by_id(page, "compacted-from-link")
    expect(banner).to_have_text(f"Compacted from “{LONG_TITLE}”")
    expect(banner).to_have_attribute("href", f"/c/{cid}")
    expect(banner).to_be_in_viewport()
    for n in range(6):  # enough to scroll: the banner goes with the first messages
        relay.send(new, f"message number {n}")
        relay.wait_idle(new)
    expect(page.locator('[data-testid="entry-agent"][data-state="done"]')).to_have_count(6)
    page.get_by_test_id("timeline").evaluate("t => { t.scrollTop = t.scrollHeight }")
    expect(banner).not_to_be_in_viewport()
    pages.assert_clean()


# ---- 10. the new-conversation dialog ------------------------------------------------------------


def test_new_dialog_shows_plain_reasons_and_the_real_default_directory(
    pages: Pages, tmp_path: Path
) -> None:
    relay = own_relay(tmp_path, copilot_cli=str(tmp_path / "no-copilot"))
    try:
        page = pages.open(relay)
        by_id(page, "new-conversation").click()
        expect(by_id(page, "new-dialog")).to_be_visible()
        copilot = by_id(page, "new-provider").locator('option[value="copilot"]')
        expect(copilot).to_be_disabled()
        expect(copilot).to_contain_text("Install the Copilot CLI with “make copilot-cli”")
        for text in by_id(page, "new-provider").locator("option").all_text_contents():
            assert "`" not in text, text
        cwd = str(relay.settings.cwd_default)
        expect(by_id(page, "new-cwd")).to_have_attribute("placeholder", cwd)
        by_id(page, "new-title").fill("Placeholder")
        by_id(page, "new-create").click()  # left empty: the directory shown is the one used
        expect(by_id(page, "cwd")).to_have_text(cwd)
    finally:
        relay.stop()
    pages.assert_clean()


# ---- 4. API retries: one line that counts the attempts ------------------------------------------


def _retry_text(attempt: int) -> str:
    return f"API error 529 (overloaded), retrying (attempt {attempt} of 10)"


async def _retries(agent: ScriptAgent, _prompt: str) -> AsyncIterator[AgentEvent]:
    """Four attempts a little apart, then the answer."""
    for attempt in range(1, 5):
        data = {"type": "api_retry", "status": 529, "attempt": attempt, "max_retries": 10}
        yield Notice(_retry_text(attempt), level="warning", data=data)
        await asyncio.sleep(0.4)
    yield MessageDone("m1", "Answered at last.")
    yield TurnDone()


def test_api_retries_show_as_one_line_updated_in_place(pages: Pages, relay: LiveRelay) -> None:
    use_script(relay, _retries)
    page, cid = open_new(pages, relay)
    send_text(page, "go")
    lines = by_id(page, "entry-line")
    expect(lines).to_have_text([_retry_text(1)])
    expect(lines).to_have_text([_retry_text(4)])  # the same line, now at attempt 4
    expect(page.locator('[data-testid="entry-agent"][data-state="done"]')).to_have_text(
        "Answered at last."
    )
    expect(lines).to_have_count(1)
    page.reload()  # as stored
    expect(by_id(page, "entry-line")).to_have_text([_retry_text(4)])
    relay.wait_idle(cid)
    pages.assert_clean()


# ---- 5. the compaction pill: findable, labelled, a touch target ---------------------------------


async def _compact_then_talk(agent: ScriptAgent, prompt: str) -> AsyncIterator[AgentEvent]:
    """The first turn compacts; every turn answers with a long reply."""
    if prompt == "compact":
        yield CompactionStarted(trigger="auto")
        yield CompactionFinished(trigger="auto", pre_tokens=150_046, post_tokens=3_012)
    yield MessageDone(f"m-{prompt}", "\n\n".join(f"Paragraph {n} of {prompt}." for n in range(12)))
    yield TurnDone()


HITS_SQUARE = """pill => {
  const r = pill.getBoundingClientRect();
  const x = r.left + r.width / 2, y = r.top + r.height / 2;
  const d = 11; // 22 px checked: a point at the window's last half pixel rounds out of it
  const points = [[x - d, y - d], [x + d, y - d], [x - d, y + d], [x + d, y + d]];
  return points.every(([px, py]) => document.elementFromPoint(px, py)?.closest('button') === pill);
}"""


def test_compaction_pill_is_labelled_and_a_touch_target(pages: Pages, relay: LiveRelay) -> None:
    use_script(relay, _compact_then_talk)
    cid = relay.create(title="Pills")["id"]
    for text in ("compact", "one", "two", "three"):
        relay.send(cid, text)
        relay.wait_idle(cid)
    desktop = pages.open(relay, f"/c/{cid}", viewport={"width": 1100, "height": 600})
    phone = pages.open(relay, f"/c/{cid}", **PHONE)
    for page in (desktop, phone):
        line_text = by_id(page, "compaction-line")
        expect(line_text).to_contain_text("150k → 3k")
        pill = by_id(page, "compaction-pill")
        expect(pill).to_have_attribute("aria-label", re.compile(r"^Go to: .*150k → 3k.*150,046"))
        # A tap or click anywhere in a 22 px square around its centre lands on it.
        assert pill.evaluate(HITS_SQUARE), pill.bounding_box()
        expect(line_text).not_to_be_in_viewport()  # the reply pushed it up
    box = by_id(phone, "compaction-pill").bounding_box()
    assert box is not None and min(box["width"], box["height"]) >= 24  # drawn at touch size
    pill = by_id(desktop, "compaction-pill")
    pill.hover()
    label = by_id(desktop, "compaction-pill-label")
    expect(label).to_be_visible()
    expect(label).to_have_text(by_id(desktop, "compaction-line").inner_text())
    by_id(phone, "compaction-pill").tap()
    expect(by_id(phone, "compaction-line")).to_be_in_viewport()
    pages.assert_clean()


def test_pills_of_close_compactions_do_not_cover_each_other(pages: Pages, relay: LiveRelay) -> None:
    # A review: seven auto-compactions on a phone with its keyboard up (390x480): the pills of
    # close lines, and those pushed to the rail's end, were drawn over each other.
    use_script(relay, _compact_then_talk)
    cid = relay.create(title="Close pills")["id"]
    # A long history, then five compactions a reply apart: near each other on a short rail.
    for text in [f"talk {n}" for n in range(20)] + ["compact"] * 5:
        relay.send(cid, text)
        relay.wait_idle(cid)
    page = pages.open(relay, f"/c/{cid}", **{**PHONE, "viewport": {"width": 390, "height": 480}})
    pills = by_id(page, "compaction-pill")
    expect(pills).to_have_count(5)
    boxes = [pills.nth(n).bounding_box() for n in range(5)]
    tops = sorted((b["y"], b["y"] + b["height"]) for b in boxes if b is not None)
    assert len(tops) == 5
    assert all(below[0] >= above[1] for above, below in pairwise(tops)), tops
    for n in range(5):
        assert pills.nth(n).evaluate(HITS_SQUARE), n  # each still a whole touch target
    pages.assert_clean()


@contextmanager
def claude_relay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveRelay]:
    """A relay whose Claude Code conversations run the real CLI against the fake API."""
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
            yield relay
        finally:
            relay.stop()


def test_allowing_a_write_keeps_the_timeline_following_its_end(
    pages: Pages, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a review (3 of 3 with a Write): after Allow, "↓ New messages" showed and the
    # reply's end was cut off below, though the user never scrolled: a scroll event the
    # card's change caused read as the user scrolling away.
    with claude_relay(tmp_path, monkeypatch) as relay:
        cid = relay.create(provider="claude", title="Follow")["id"]
        for n in range(4):  # enough to scroll
            relay.send(cid, f"message number {n} " + "with some words " * 30)
            relay.wait_idle(cid, timeout=60)
        page = pages.open(relay, f"/c/{cid}", viewport={"width": 900, "height": 600})
        for n in range(3):
            target = Path(relay.get(cid)["cwd"]) / f"w{n}.py"
            send_text(page, f"[[WRITE:{target}|a = {n}\nb = 2\n]]")
            allow = by_id(page, "permission-allow")
            expect(allow).to_be_visible(timeout=30_000)
            allow.click()
            replies = by_id(page, "entry-agent").filter(has_text="The tool returned:")
            expect(replies).to_have_count(n + 1, timeout=30_000)
            relay.wait_idle(cid, timeout=60)
            page.wait_for_timeout(300)  # every frame drawn
            gap = by_id(page, "timeline").evaluate(
                "t => t.scrollHeight - t.scrollTop - t.clientHeight"
            )
            assert gap < 2, f"write {n}: {gap} px below the end"
            assert by_id(page, "new-messages").is_hidden()
        pages.assert_clean()


def test_claude_write_permission_shows_the_content_above_its_tool_row(
    pages: Pages, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with claude_relay(tmp_path, monkeypatch) as relay:
        cid = relay.create(provider="claude", title="Real CLI")["id"]
        target = Path(relay.get(cid)["cwd"]) / "notes.txt"
        page = pages.open(relay, f"/c/{cid}")
        send_text(page, f"[[WRITE:{target}|first line\nsecond line]]")
        allow = by_id(page, "permission-allow")
        expect(allow).to_be_visible(timeout=30_000)
        card = page.locator(".permission").filter(has=allow)
        expect(card).to_contain_text("Write wants to write:")
        expect(card.locator(".perm-input")).to_have_text(str(target))
        expect(card.locator(".diff-line.add")).to_have_text(["+first line", "+second line"])
        # The CLI announced the call before asking: the question is shown first all the same.
        expect(page.locator("#entries > details.tool")).to_have_count(1)
        kinds = page.locator("#entries > .entry").evaluate_all(
            "els => els.map(e => e.classList.contains('permission') ? 'ask' : e.dataset.kind)"
        )
        assert kinds == ["user", "agent", "ask", "activity"], kinds
        allow.click()
        expect(by_id(page, "permission-answer")).to_have_text("Allowed")
        expect(by_id(page, "entry-agent").filter(has_text="The tool returned:")).to_have_count(
            1, timeout=30_000
        )
        row = page.locator("details.tool")
        row.locator("summary").click()
        expect(row.locator(".diff-line.add")).to_have_text(["+first line", "+second line"])
        relay.wait_idle(cid)
        assert target.read_text() == "first line\nsecond line"
        # Written over: the card says so and shows what goes (a dogfood run: it looked new).
        send_text(page, f"[[WRITE:{target}|first line\nnew second line]]")
        card = page.locator(".permission.state-pending")
        expect(card).to_contain_text("Write wants to overwrite:", timeout=30_000)
        expect(card.locator(".diff-line.del")).to_have_text(["-second line"])
        expect(card.locator(".diff-line.add")).to_have_text(["+new second line"])
        by_id(page, "permission-allow").click()
        relay.wait_idle(cid)
        assert target.read_text() == "first line\nnew second line"
        pages.assert_clean()


def test_a_tool_call_the_agent_never_finished_stops_spinning(
    pages: Pages, relay: LiveRelay
) -> None:
    """The agent dies while its tool runs: the call shows it got no result (a spinner and
    "Running…" stayed for good before, and after a relay crash too)."""
    calling = threading.Event()

    async def script(_agent: ScriptAgent, _prompt: str) -> AsyncIterator[AgentEvent]:
        yield Activity("t1", "Bash", "call", "make test")
        calling.set()
        await asyncio.sleep(0.5)
        raise RuntimeError("the agent process died")

    use_script(relay, script)
    cid = relay.create(title="Cut")["id"]
    page = pages.open(relay, f"/c/{cid}")
    send_text(page, "run the tests")
    tool = page.locator('details[data-testid="entry-activity"]')
    expect(tool.get_by_role("img", name="running")).to_be_visible()
    assert calling.wait(10)
    expect(tool.get_by_role("img", name="interrupted")).to_have_text("–")
    expect(tool.get_by_role("img", name="running")).to_have_count(0)
    tool.locator("summary").click()
    expect(tool.locator(".tool-output")).to_have_text("(no result: the turn ended first)")
    expect(line(page, "The agent stopped unexpectedly")).to_be_visible()
    pages.assert_clean()


def test_a_turn_still_running_in_an_archived_conversation_can_be_stopped(
    pages: Pages, relay: LiveRelay
) -> None:
    # Found by a hostile review: /compact during a turn archives the conversation while its
    # turn runs on (SPEC §2), and the archived view hid Stop, so only the API could stop it.
    cid = relay.create(title="Asking")["id"]
    relay.send(cid, "ask permission")
    relay.wait_for(cid, lambda v: any(e["state"] == "pending" for e in v["timeline"]))
    assert relay.send(cid, "/compact").status_code == 201
    page = pages.open(relay, f"/c/{cid}")
    expect(by_id(page, "archived-notice")).to_be_visible()
    stop = by_id(page, "stop-button")
    expect(stop).to_be_visible()
    stop.click()
    expect(stop).to_be_hidden()
    assert relay.wait_idle(cid)["turn"]["state"] == "idle"
    pages.assert_clean()
