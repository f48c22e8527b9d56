"""The composer's @ completion in Chromium: the files of the conversation's directory."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.browser import Pages, by_id, user_bubble
from tests.relay import LiveRelay


def test_at_completes_a_path_of_the_working_directory(pages: Pages, relay: LiveRelay) -> None:
    cwd = relay.settings.roots[0] / "work" / "mention"
    for name in ("README.md", "src/reader.py", "my notes.txt", "src/main.py"):
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_text("x")
    cid = relay.create(cwd=str(cwd), title="Mentions")["id"]
    page = pages.open(relay, f"/c/{cid}")
    expect(by_id(page, "title")).to_have_text("Mentions")  # loaded: typing is not reset
    box = by_id(page, "message-input")
    files = page.get_by_test_id("file-item")
    box.press_sequentially("look at @rea")
    expect(files).to_have_text(["README.md", "src/reader.py"])  # best first
    expect(by_id(page, "command-menu")).to_have_attribute("aria-label", "Files")
    box.press("ArrowDown")
    box.press("Enter")  # picks, does not send
    expect(files).to_have_count(0)
    expect(box).to_have_value("look at @src/reader.py ")
    box.press_sequentially("and @notes")
    expect(files).to_have_text(["my notes.txt"])
    box.press("Tab")
    expect(box).to_have_value('look at @src/reader.py and @"my notes.txt" ')  # quoted: a space
    box.press_sequentially("@zzz")
    expect(by_id(page, "command-menu")).to_be_hidden()  # nothing matches: no menu
    box.press_sequentially(" please")
    box.press("Enter")
    sent = 'look at @src/reader.py and @"my notes.txt" @zzz please'
    expect(user_bubble(page, sent)).to_have_count(1)
    box.press_sequentially("/com")  # the command menu is still the command menu
    expect(page.get_by_test_id("command-item").first).to_contain_text("/compact")
    expect(by_id(page, "command-menu")).to_have_attribute("aria-label", "Commands")
    pages.assert_clean()
