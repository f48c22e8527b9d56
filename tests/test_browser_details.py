"""What each compaction did, in Chromium: a compaction line opens to its details.

The real Claude Code CLI compacts against the fake Messages API, whose summary looks like
HTML: the details show it as text.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from app.supervisor.runner import READ_ONLY
from tests import test_claude_relay as claude_relay
from tests.browser import Pages, by_id, context_categories, line, send_text, shown_categories
from tests.fake_anthropic import FakeAnthropic
from tests.relay import LiveRelay
from tests.test_claude_relay import StartRelay

# The real CLI's fixtures: the fake Messages API, a fresh HOME, relays on tmp_path.
start = claude_relay.start

PHONE = {"viewport": {"width": 390, "height": 780}, "is_mobile": True, "has_touch": True}
HOSTILE = '<img src=x onerror="window.__pwned = 1"> <b>not bold</b> & <script>x</script>'


def compaction_data(live: LiveRelay, cid: int, *keys: str) -> dict[str, Any]:
    """Poll until the compaction line holds these data keys (summary and backup come later)."""
    deadline = time.monotonic() + 60
    while True:
        lines = [
            e
            for e in live.get(cid)["timeline"]
            if e["kind"] == "line" and e["data"].get("type") == "compaction"
        ]
        if lines and all(key in lines[0]["data"] for key in keys):
            return dict(lines[0]["data"])
        if time.monotonic() > deadline:
            raise TimeoutError(f"the compaction line never held {keys}: {lines}")
        time.sleep(0.1)


def test_compaction_line_opens_to_its_details_with_the_summary_as_text(
    pages: Pages, start: StartRelay, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000")
    fake.input_tokens = 70_000
    fake.summary_text = HOSTILE
    live = start()
    cid = live.create(provider="claude", title="Details")["id"]
    for text in ("turn 1", "turn 2"):
        live.send(cid, text)
        live.wait_idle(cid, timeout=60)

    page = pages.open(live, f"/c/{cid}")
    fake.summary_delay = 2.0  # long enough to open the line while it runs
    send_text(page, "turn 3")
    line = by_id(page, "compaction-line")
    details = by_id(page, "compaction-details")
    expect(line).to_have_text("Compacting context…")
    expect(details).to_be_hidden()
    expect(line).to_have_attribute("aria-expanded", "false")
    line.click()
    expect(details).to_be_visible()
    expect(line).to_have_attribute("aria-expanded", "true")
    expect(by_id(page, "compaction-took")).to_have_text("still running…")

    # It ends, the backup and the summary arrive: the open details follow, still open.
    data = compaction_data(live, cid, "summary", "backup")
    expect(line).to_have_text(re.compile(r"^Context compacted · 70k → "))
    expect(details).to_be_visible()
    expect(by_id(page, "compaction-before")).to_have_text(f"{data['pre_tokens']:,}")
    expect(by_id(page, "compaction-after")).to_have_text(f"{data['post_tokens']:,}")
    expect(by_id(page, "compaction-took")).to_have_text(f"{data['duration_ms'] / 1000:.1f} s")
    assert data["duration_ms"] >= 2000
    summary = by_id(page, "compaction-summary")
    expect(summary).to_contain_text(f"Summary:\n{HOSTILE}\n")
    expect(summary).to_have_text(data["summary"])
    expect(summary.locator("img, b, script")).to_have_count(0)
    assert page.evaluate("window.__pwned") is None

    # The backup written just before it opens from the details.
    link = by_id(page, "compaction-details-backup").get_by_role("link")
    expect(link).to_have_text(data["backup"])
    link.click()
    expect(by_id(page, "backup-title")).to_have_text(data["backup"])
    by_id(page, "backup-close").click()

    # A fresh page (from the snapshot), by keyboard: Enter opens and closes the details.
    fresh = pages.open(live, f"/c/{cid}")
    line = by_id(fresh, "compaction-line")
    details = by_id(fresh, "compaction-details")
    expect(details).to_be_hidden()
    box = line.bounding_box()
    assert box is not None and box["height"] >= 24, box  # a real target on a desktop too
    line.focus()
    fresh.keyboard.press("Enter")
    expect(details).to_be_visible()
    expect(by_id(fresh, "compaction-summary")).to_have_text(data["summary"])
    expect(by_id(fresh, "compaction-summary").locator("img, b, script")).to_have_count(0)
    fresh.keyboard.press("Enter")
    expect(details).to_be_hidden()
    expect(line).to_have_attribute("aria-expanded", "false")
    assert fresh.evaluate("window.__pwned") is None

    # A touch target on a phone: a tap opens it.
    phone = pages.open(live, f"/c/{cid}", **PHONE)
    line = by_id(phone, "compaction-line")
    box = line.bounding_box()
    assert box is not None and box["height"] >= 24, box
    line.tap()
    expect(by_id(phone, "compaction-details")).to_be_visible()
    expect(by_id(phone, "compaction-summary")).to_have_text(data["summary"])
    pages.assert_clean()


def test_the_context_modal_shows_what_fills_claude_codes_window(
    pages: Pages, start: StartRelay, fake: FakeAnthropic
) -> None:
    """After a turn, the 🧠 modal lists the live CLI's own breakdown of its window."""
    live = start()
    cid = live.create(provider="claude", title="What fills it")["id"]
    live.send(cid, "hello")
    live.wait_idle(cid, timeout=60)
    categories = context_categories(live.http, cid)
    page = pages.open(live, f"/c/{cid}")
    by_id(page, "context-button").click()
    expect(by_id(page, "context-categories").locator("li")).to_have_text(
        shown_categories(categories)
    )
    pages.assert_clean()


def test_the_agent_s_own_turn_shows_without_a_message(
    pages: Pages, start: StartRelay, fake: FakeAnthropic
) -> None:
    # A background shell ends while the user waits: the line, the agent's own turn with Stop
    # and its question come to the page without anything typed.
    live = start()
    cid = live.create(provider="claude", title="Own turn")["id"]
    background = {"command": "sleep 1", "description": "Nap", "run_in_background": True}
    fake.tool_calls.extend([("Bash", background), ("Bash", {"command": "touch own.txt"})])
    page = pages.open(live, f"/c/{cid}")
    send_text(page, "start it in the background")
    expect(line(page, 'Background command "Nap" completed (exit code 0)')).to_be_visible(
        timeout=30_000
    )
    allow = by_id(page, "permission-allow")
    expect(allow).to_be_visible(timeout=30_000)
    expect(by_id(page, "stop-button")).to_be_visible()  # a turn runs: the agent's own
    allow.click()
    expect(by_id(page, "entry-agent").filter(has_text="The tool returned:")).to_have_count(
        2, timeout=30_000
    )
    expect(by_id(page, "stop-button")).to_be_hidden()
    live.wait_idle(cid)
    pages.assert_clean()


def test_the_agent_s_questions_are_a_form_whose_answers_it_gets(
    pages: Pages, start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = live.create(provider="claude", title="Questions")["id"]
    fake.tool_calls.append(("AskUserQuestion", claude_relay.QUESTIONS))
    page = pages.open(live, f"/c/{cid}")
    send_text(page, "set up the project")
    questions = by_id(page, "question")
    expect(questions).to_have_count(2, timeout=30_000)
    first, second = questions.nth(0), questions.nth(1)
    expect(first).to_contain_text("Database")
    expect(first).to_contain_text("Which database should I use?")
    expect(first.get_by_role("radio")).to_have_count(2)
    expect(second.get_by_role("checkbox")).to_have_count(2)
    expect(first).to_contain_text("One file")  # an option's description
    by_id(page, "question-submit").click()  # nothing chosen yet
    expect(page.get_by_role("alert")).to_have_text("Answer every question (or skip them all).")
    own = by_id(second, "question-own")
    own.fill("I would like gre")
    own.press("Escape")  # clears the field: not a Stop (a hostile review lost the turn so)
    expect(own).to_have_value("")
    page.keyboard.press("Escape")  # nor from elsewhere in the form
    first.get_by_label("SQLite").check()
    first.get_by_label("SQLite").press("Escape")
    expect(by_id(page, "stop-button")).to_be_visible()
    second.get_by_label("Unit").check()
    own.fill("a load test")
    by_id(page, "question-submit").click()
    expect(by_id(page, "permission-answer")).to_have_text("Answered")
    expect(by_id(page, "question-answered").nth(1)).to_contain_text("Unit, a load test")
    reply = by_id(page, "entry-agent").filter(has_text="The tool returned:")
    expect(reply).to_contain_text('"Which database should I use?"="SQLite"', timeout=30_000)
    expect(reply).to_contain_text('"Which tests should I write?"="Unit, a load test"')
    live.wait_idle(cid)
    pages.assert_clean()


@pytest.mark.parametrize(("folder", "found"), [("", ".mcp.json"), ("src", "../.mcp.json")])
def test_a_folder_with_its_own_settings_is_created_in_once_trusted(
    pages: Pages, start: StartRelay, fake: FakeAnthropic, tmp_path: Path, folder: str, found: str
) -> None:
    live = start()
    repo = tmp_path / "data" / "repo"
    (repo / folder).mkdir(parents=True, exist_ok=True)
    (repo / ".mcp.json").write_text('{"mcpServers": {}}')  # the folder's, or its parent's
    page = pages.open(live)
    by_id(page, "empty-new-conversation").click()
    expect(by_id(page, "new-trust")).to_be_hidden()  # asked only where it matters
    by_id(page, "new-provider").select_option("claude")
    by_id(page, "new-cwd").fill(str(repo / folder))
    by_id(page, "new-create").click()
    expect(page.get_by_role("alert")).to_contain_text(
        f"This folder has Claude Code settings ({found}) that can run commands"
    )
    trust = by_id(page, "new-trust")
    expect(trust).to_be_visible()
    trust.check()
    by_id(page, "new-create").click()
    expect(page).to_have_url(re.compile(r"/c/\d+$"))
    (conversation,) = live.http.get("/api/conversations").json()["conversations"]
    assert conversation["cwd"] == str(repo / folder)
    pages.assert_clean("409")  # the first Create, refused as intended


def test_settings_that_appear_later_are_trusted_from_the_line_and_the_message_resent(
    pages: Pages, start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    live = start()
    cid = claude_relay.create_claude(live)  # its folder had no settings then
    ran = claude_relay.marking_server(Path(live.get(cid)["cwd"]), tmp_path, "pulled")
    page = pages.open(live, f"/c/{cid}")
    send_text(page, "hello")
    refused = line(page, "The agent could not start: Claude Code settings appeared")
    expect(refused).to_contain_text("(.mcp.json)", timeout=30_000)
    assert not ran.exists() and fake.message_bodies() == []
    refused.get_by_test_id("trust-resend").click()
    expect(by_id(page, "trust-resend-done")).to_have_text("Resent", timeout=30_000)
    expect(by_id(page, "entry-user").filter(has_text="hello")).to_have_count(2)
    expect(page.locator('[data-testid="entry-agent"][data-state="done"]')).to_have_count(
        1, timeout=30_000
    )
    expect(by_id(page, "trust-resend")).to_have_count(0)
    assert ran.exists() and fake.user_texts_sent()[-1] == "hello"
    # Settings written while its agent lives stop it: that line's button only trusts.
    claude_relay.hook_settings(Path(live.get(cid)["cwd"]), "settings.local.json", ran)
    stopped = line(page, "while it runs, so it was stopped")
    expect(stopped).to_contain_text("(.claude/settings.local.json)", timeout=30_000)
    button = stopped.get_by_test_id("trust-resend")
    expect(button).to_have_text("Trust these settings")
    button.click()
    expect(stopped.get_by_test_id("trust-resend-done")).to_have_text("Trusted")
    # An archived conversation's line offers nothing; a click that got there first is told.
    claude_relay.hook_settings(Path(live.get(cid)["cwd"]), "settings.json", tmp_path / "late")
    send_text(page, "once more")
    late = line(page, "(.claude/settings.json)")
    expect(late.get_by_test_id("trust-resend")).to_be_visible(timeout=30_000)
    live.wait_idle(cid)  # the refused start's turn ends after its line (a CI run archived first)
    archived = live.http.post(f"/api/conversations/{cid}/archive")
    assert archived.status_code == 200, archived.text
    expect(late.get_by_test_id("trust-resend")).to_be_hidden()
    late.get_by_test_id("trust-resend").dispatch_event("click")  # (as if clicked just before)
    expect(late.get_by_role("alert")).to_have_text(READ_ONLY)
    pages.assert_clean("409")


def test_a_question_that_comes_with_the_reply_before_it_is_said_too(
    pages: Pages, start: StartRelay
) -> None:
    # A review: the model writes a sentence before its tool call; the question and that
    # sentence's end came in one frame, and the reply's words replaced the question's before a
    # screen reader heard it. And a click on Allow (not a key) moved the focus to the composer
    # (a phone would raise its keyboard).
    live = start()
    cid = live.create(provider="claude", title="Said")["id"]
    page = pages.open(live, f"/c/{cid}")
    send_text(page, "run it [[BASH:touch said.txt]]")
    allow = by_id(page, "permission-allow")
    expect(allow).to_be_visible(timeout=30_000)
    said = by_id(page, "announce")
    expect(said).to_contain_text("Bash waits for your answer.")
    expect(said).to_contain_text("Agent: ")
    allow.click()
    expect(by_id(page, "permission-answer")).to_have_text("Allowed")
    expect(by_id(page, "message-input")).not_to_be_focused()
    live.wait_idle(cid)
    pages.assert_clean()
