"""The composer's @ completion in Chromium: the files of the conversation's directory."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Locator, Page, Route, expect

from tests.browser import Pages, by_id, user_bubble
from tests.relay import LiveRelay

FILES = re.compile(r"/api/conversations/\d+/files\?")


def project(relay: LiveRelay, *names: str) -> Path:
    cwd = relay.settings.roots[0] / "work" / "mention"
    for name in names:
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_text("x")
    return cwd


def opened(pages: Pages, relay: LiveRelay, cwd: Path, **context: object) -> Page:
    cid = relay.create(cwd=str(cwd), title="Mentions")["id"]
    page = pages.open(relay, f"/c/{cid}", **context)
    expect(by_id(page, "title")).to_have_text("Mentions")  # loaded: typing is not reset
    return page


def test_at_completes_a_path_of_the_working_directory(pages: Pages, relay: LiveRelay) -> None:
    cwd = project(relay, "README.md", "src/reader.py", "my notes.txt", "src/main.py")
    page = opened(pages, relay, cwd)
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
    with page.expect_response(FILES):  # its answer has come: it holds nothing
        box.press_sequentially("@zzz")
    expect(by_id(page, "command-menu")).to_be_hidden()
    box.press("Enter")  # so Enter sends
    sent = 'look at @src/reader.py and @"my notes.txt" @zzz'
    expect(user_bubble(page, sent)).to_have_count(1)
    box.fill("see @src/maXX.py now")  # the caret inside a path: the whole path is replaced
    box.evaluate("b => b.setSelectionRange(11, 11)")  # after "@src/ma"
    box.press("Backspace")  # "@src/m"
    expect(files).to_have_text(["src/main.py"])
    box.press("Enter")
    expect(box).to_have_value("see @src/main.py  now")
    box.fill("/com")  # the command menu is still the command menu
    box.press("End")
    expect(page.get_by_test_id("command-item").first).to_contain_text("/compact")
    expect(by_id(page, "command-menu")).to_have_attribute("aria-label", "Commands")
    pages.assert_clean()


def test_an_answer_for_text_typed_since_is_never_picked(pages: Pages, relay: LiveRelay) -> None:
    # Found by a hostile review: the answer for "@rea" came after "d" was typed, was shown,
    # and Enter replaced "@rea" only: "look at @README.md d".
    page = opened(pages, relay, project(relay, "README.md", "reader.txt"))
    held: list[Route] = []
    page.route(FILES, lambda route: held.append(route))
    box = by_id(page, "message-input")
    box.press_sequentially("look at @rea")
    while not held:  # the request is on its way
        page.wait_for_timeout(20)
    box.press("d")
    held[0].continue_()  # the old answer comes before the next request goes (80 ms later)
    page.wait_for_timeout(40)
    expect(by_id(page, "command-menu")).to_be_hidden()  # not shown: "@rea" is not typed now
    while len(held) < 2:
        page.wait_for_timeout(20)
    held[1].continue_()
    expect(page.get_by_test_id("file-item")).to_have_text(["README.md", "reader.txt"])
    box.press("Enter")
    expect(box).to_have_value("look at @README.md ")  # "@read" replaced whole
    pages.assert_clean()


def test_the_file_menu_fits_a_phone_with_its_keyboard_up(pages: Pages, relay: LiveRelay) -> None:
    # Found by a hostile review: 12 items at 390 x 360 put the best ones above the screen, and a
    # long path made the whole page scroll sideways.
    deep = "a-very-long-folder-name/" * 6
    names = [f"{deep}file{n:02}.txt" for n in range(12)]
    page = opened(pages, relay, project(relay, *names), viewport={"width": 390, "height": 360})
    box = by_id(page, "message-input")
    box.press_sequentially("@file")
    files = page.get_by_test_id("file-item")
    expect(files).to_have_count(12)
    expect(files.first).to_be_in_viewport(ratio=1)  # the best match in sight
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    expect(files.first).to_contain_text("file00.txt")
    for _ in range(11):
        box.press("ArrowDown")
    expect(files.last).to_be_in_viewport(ratio=1)  # the chosen one scrolled into sight
    pages.assert_clean()


def test_a_name_s_bidi_control_shows_as_its_code(pages: Pages, relay: LiveRelay) -> None:
    # A review: "rtl\u202etxt.exe" read "rtlexe.txt" in the menu (the Changes view shows
    # ⟨U+202E⟩); picked, the real name goes in.
    cwd = project(relay, "rtl\u202etxt.exe")
    page = opened(pages, relay, cwd)
    box = by_id(page, "message-input")
    box.press_sequentially("@rtl")
    expect(page.get_by_test_id("file-item")).to_have_text(["rtl⟨U+202E⟩txt.exe"])
    box.press("Enter")
    expect(box).to_have_value("@rtl\u202etxt.exe ")
    # Sent, the control reverses nothing after the name (it read "esaelp kool" before).
    box.press_sequentially("look please")
    box.press("Enter")
    bubble = page.get_by_test_id("entry-user").last
    expect(bubble).to_contain_text("look please")
    assert left_to_right(bubble, "please")
    pages.assert_clean()


def left_to_right(bubble: Locator, word: str) -> bool:
    """Whether word's first letter shows left of its last (its letters in reading order)."""
    return bubble.evaluate(
        """(el, word) => {
          const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
          while (walker.nextNode()) {
            const at = walker.currentNode.data.indexOf(word);
            if (at < 0) continue;
            const left = (i) => {
              const range = document.createRange();
              range.setStart(walker.currentNode, at + i);
              range.setEnd(walker.currentNode, at + i + 1);
              return range.getBoundingClientRect().left;
            };
            return left(0) < left(word.length - 1);
          }
          throw new Error(`no text node holds ${word}`);
        }""",
        word,
    )
