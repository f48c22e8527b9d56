"""Sessions started in a terminal (issue #17) in Chromium: the real `claude` CLI makes a session
in a workspace; the new-conversation dialog lists it, importing opens it with its history, the
next message resumes it, and the 🧠 modal shows the `claude --resume` line to go back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser import Pages, agent_reply, by_id, conv_id, line, send_text, user_bubble
from tests.fake_anthropic import FakeAnthropic
from tests.relay import LiveRelay, make_settings
from tests.terminal import terminal

FIRST = "my name is <b>Bob</b> [[BASH:echo hi]]"


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path) -> Iterator[LiveRelay]:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude-config"))
    with LiveRelay(make_settings(tmp_path / "data")) as relay:
        yield relay


def test_import_a_terminal_session_and_resume_it(
    pages: Pages, live: LiveRelay, tmp_path: Path, fake: FakeAnthropic
) -> None:
    workspace = tmp_path / "data" / "work" / "it's here"
    terminal(workspace, FIRST, "--allowedTools", "Bash")
    (transcript,) = (tmp_path / "claude-config" / "projects").glob("*/*.jsonl")
    session_id = transcript.stem

    page = pages.open(live, permissions=["clipboard-read", "clipboard-write"])
    by_id(page, "new-conversation").click()
    expect(by_id(page, "new-dialog")).to_be_visible()
    expect(by_id(page, "import-list")).to_be_hidden()
    by_id(page, "import-toggle").click()
    item = by_id(page, "import-item")
    expect(item).to_have_count(1)
    # The prompt is text: its markup is shown, never made into elements.
    expect(item.get_by_test_id("import-title")).to_have_js_property("textContent", FIRST)
    expect(item.locator("b")).to_have_count(0)
    expect(item).to_contain_text(str(workspace))
    by_id(page, "new-permission").select_option("acceptEdits")  # applies to the import too
    item.get_by_test_id("import-button").click()

    # The imported conversation opens with the terminal's history.
    expect(by_id(page, "new-dialog")).to_be_hidden()
    expect(page).to_have_url(f"{live.base}/c/1")
    expect(line(page, f"Imported from the Claude Code session {session_id}")).to_have_count(1)
    expect(user_bubble(page, "my name is")).to_have_count(1)
    expect(user_bubble(page, "my name is").locator("b")).to_have_count(0)
    expect(by_id(page, "entry-agent").filter(has_text="I will run the command.")).to_have_count(1)
    tool = by_id(page, "entry-activity").filter(has_text="echo hi")
    expect(tool).to_contain_text("Bash")
    expect(by_id(page, "entry-agent").filter(has_text="The tool returned: hi")).to_have_count(1)
    expect(by_id(page, "cwd")).to_have_text(str(workspace))
    assert live.get(1)["permission_mode"] == "acceptEdits"

    # The next message resumes the session with the real CLI: the model got the earlier turns.
    send_text(page, "what is my name?")
    expect(by_id(page, "entry-agent").filter(has_text="You said: what is my name?")).to_have_count(
        1
    )
    assert "my name is <b>Bob</b>" in str(fake.message_bodies()[-1]["messages"])

    # Back to the terminal: the 🧠 modal shows the command, with a working Copy button.
    by_id(page, "context-button").click()
    expect(by_id(page, "resume-section")).to_be_visible()
    command = "cd '" + str(workspace).replace("'", "'\\''") + f"' && claude --resume {session_id}"
    expect(by_id(page, "resume-command")).to_have_text(command)
    expect(by_id(page, "resume-cwd")).to_have_text(str(workspace))
    by_id(page, "resume-copy").click()
    expect(by_id(page, "resume-copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == command
    by_id(page, "context-close").click()

    # Listed no more: the dialog says it is already in oarlock.
    by_id(page, "new-conversation").click()
    by_id(page, "import-toggle").click()
    expect(by_id(page, "import-status")).to_have_text(
        f"No Claude Code sessions to import from {tmp_path / 'claude-config'} (only those in "
        "the workspace roots are listed). 1 already in oarlock is not listed."
    )
    expect(by_id(page, "import-item")).to_have_count(0)
    assert conv_id(page) == 1
    pages.assert_clean()


def test_a_session_in_a_folder_with_its_own_settings_is_imported_once_trusted(
    pages: Pages, live: LiveRelay, tmp_path: Path, fake: FakeAnthropic
) -> None:
    # A dogfood run: the refusal said to tick "Trust this folder's settings", and the import
    # had no such box (the Create form's stays hidden, and Import never sent it).
    workspace = tmp_path / "data" / "work" / "configured"
    (workspace / ".claude").mkdir(parents=True)
    (workspace / ".claude" / "settings.json").write_text('{"env": {"FOO": "1"}}')
    terminal(workspace, "hello from a configured folder")
    page = pages.open(live)
    by_id(page, "new-conversation").click()
    by_id(page, "import-toggle").click()
    item = by_id(page, "import-item")
    trust = item.get_by_test_id("import-trust")
    expect(trust).to_be_hidden()
    item.get_by_test_id("import-button").click()
    expect(item.get_by_role("alert")).to_contain_text("This folder has Claude Code settings")
    trust.check()
    item.get_by_test_id("import-button").click()
    expect(page).to_have_url(f"{live.base}/c/1")
    expect(user_bubble(page, "hello from a configured folder")).to_have_count(1)
    pages.assert_clean("409")


def test_the_resume_line_is_only_for_claude_code(pages: Pages, live: LiveRelay) -> None:
    cid = live.create(title="Demo")["id"]
    page = pages.open(live, f"/c/{cid}")
    send_text(page, "hello")
    expect(agent_reply(page, "hello")).to_have_count(1)
    by_id(page, "context-button").click()
    expect(by_id(page, "context-modal")).to_be_visible()
    expect(by_id(page, "resume-section")).to_have_count(1)
    expect(by_id(page, "resume-section")).to_be_hidden()
    pages.assert_clean()
