"""The header's Changes view in Chromium: the files git sees changed, and their diffs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import Page, Route, expect

from tests.browser import Pages, by_id, own_relay, send_text
from tests.relay import LiveRelay
from tests.test_changes import change, git, repo

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def opened(pages: Pages, relay: LiveRelay, cwd: Path, title: str) -> Page:
    """A conversation in cwd, its Changes view opened."""
    cid = relay.create(cwd=str(cwd), title=title)["id"]
    page = pages.open(relay, f"/c/{cid}")
    expect(by_id(page, "title")).to_have_text(title)
    by_id(page, "changes-button").click()
    return page


def test_the_changes_since_the_last_commit_and_a_file_s_diff(
    pages: Pages, relay: LiveRelay
) -> None:
    root = repo(relay.settings.roots[0] / "work" / "project")
    change(root)
    odd = '<img src=x onerror="document.title=1">.txt'  # a name is text, never markup
    (root / odd).write_text("a\n")
    page = opened(pages, relay, root, "Changed")
    dialog = by_id(page, "changes-dialog")
    expect(dialog).to_be_visible()
    expect(by_id(page, "changes-meta")).to_have_text("On branch main · 8 files changed · +7 −2")
    expect(by_id(page, "changes-root")).to_have_text(str(root.resolve()))
    paths = by_id(page, "change-path")
    expect(paths).to_have_text(
        [
            "a.txt",
            "gone.txt",
            "logo.bin",
            "new.py",
            "old.txt → renamed.txt",
            ".gitignore",
            odd,
            "notes/todo.md",
        ]
    )
    expect(by_id(page, "change-status")).to_have_text(["M", "D", "M", "A", "R", "?", "?", "?"])
    expect(by_id(page, "change-counts")).to_have_text(
        ["+2 −1", "+0 −1", "binary", "+1 −0", "+0 −0", "+1", "+1", "+2"]
    )
    assert page.evaluate("() => document.title") != "1"
    first = by_id(page, "change-toggle").first
    first.click()  # a.txt's diff, each line coloured by its kind
    expect(first).to_have_attribute("aria-expanded", "true")
    lines = by_id(page, "change-diff").first.locator(".diff-line")
    expect(lines).to_have_text(["@@ -1,3 +1,4 @@", "one", "-two", "+2", "three", "+four"])
    expect(lines.nth(2)).to_have_class(re.compile(r"\bdel\b"))
    expect(lines.nth(3)).to_have_class(re.compile(r"\badd\b"))
    by_id(page, "change-toggle").nth(2).click()
    expect(by_id(page, "change-diff").nth(2)).to_have_text("A binary file: no lines to show.")
    by_id(page, "change-toggle").nth(4).click()
    expect(by_id(page, "change-diff").nth(4)).to_have_text("Moved, no line changed.")

    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(by_id(page, "changes-button")).to_be_focused()  # focus goes back


def test_an_empty_file_that_came_or_went_says_so(pages: Pages, relay: LiveRelay) -> None:
    # A dogfood run: an empty new file read "No line changed (its mode or type did)".
    came = repo(relay.settings.roots[0] / "work" / "came")
    (came / "staged.txt").write_text("")
    git(came, "add", "staged.txt")
    (came / "untracked.txt").write_text("")
    went = repo(relay.settings.roots[0] / "work" / "went")
    (went / "empty.txt").write_text("")
    git(went, "add", "empty.txt")
    git(went, "commit", "-q", "-m", "an empty file")
    (went / "empty.txt").unlink()  # (beside the new ones, git would call it a rename)
    for root, said in [
        (came, ["A new, empty file.", "A new, empty file."]),
        (went, ["An empty file, deleted."]),
    ]:
        page = opened(pages, relay, root, root.name)
        expect(by_id(page, "change-path")).to_have_count(len(said))
        for n in range(len(said)):
            by_id(page, "change-toggle").nth(n).click()
        expect(by_id(page, "change-diff")).to_have_text(said)
    pages.assert_clean()


def test_a_turn_that_ends_refreshes_the_open_view(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path, demo_delay=0.05)  # "slow" streams 200 words: about 10 s
    try:
        root = repo(relay.settings.roots[0] / "work" / "project")
        (root / "a.txt").write_text("one\n")
        cid = relay.create(cwd=str(root), title="Working")["id"]
        page = pages.open(relay, f"/c/{cid}")
        expect(by_id(page, "title")).to_have_text("Working")
        send_text(page, "slow please")
        expect(by_id(page, "stop-button")).to_be_visible()  # the turn runs
        by_id(page, "changes-button").click()
        expect(by_id(page, "change-path")).to_have_text(["a.txt"])
        by_id(page, "change-toggle").click()
        expect(by_id(page, "change-diff").locator(".diff-line")).to_have_count(4)
        (root / "later.txt").write_text("new\n")  # what the agent writes meanwhile
        (root / "a.txt").write_text("ONE\n")
        stopped = relay.http.post(f"/api/conversations/{cid}/interrupt", json={})
        assert stopped.status_code == 202, stopped.text  # the turn ends now
        expect(by_id(page, "change-path")).to_have_text(["a.txt", "later.txt"])
        expect(by_id(page, "stop-button")).to_be_hidden()
        # The open diff stays open, read again.
        expect(by_id(page, "change-diff").first.locator(".diff-line")).to_have_text(
            ["@@ -1,3 +1 @@", "-one", "-two", "-three", "+ONE"]
        )
    finally:
        relay.stop()


def test_outside_a_repository_and_after_the_directory_went(pages: Pages, relay: LiveRelay) -> None:
    plain = relay.settings.roots[0] / "work" / "plain"
    plain.mkdir(parents=True)
    page = opened(pages, relay, plain, "Plain")
    expect(by_id(page, "changes-meta")).to_have_text(
        "The working directory is not in a git repository."
    )
    expect(by_id(page, "change-item")).to_have_count(0)
    shutil.rmtree(plain)
    by_id(page, "changes-refresh").click()
    expect(by_id(page, "changes-error")).to_have_text(
        f"The working directory {plain} does not exist."
    )


def test_a_clean_work_tree(pages: Pages, relay: LiveRelay) -> None:
    root = repo(relay.settings.roots[0] / "work" / "clean")
    page = opened(pages, relay, root, "Clean")
    expect(by_id(page, "changes-meta")).to_have_text(
        "On branch main · No changes since the last commit."
    )


def test_another_conversation_s_list_is_never_shown(pages: Pages, relay: LiveRelay) -> None:
    """Found by a review: opened for a second conversation, the view showed the first one's
    files until the new list came (and an error under them when it failed)."""
    first = repo(relay.settings.roots[0] / "work" / "first")
    (first / "a.txt").write_text("changed\n")
    second = repo(relay.settings.roots[0] / "work" / "second")
    (second / "sub").mkdir()
    git(second / "sub", "init", "-q")  # a repository of its own inside: a folder
    (second / "\u202egpj.exe").write_text("x\n")  # bidi controls are shown, not obeyed
    one = relay.create(cwd=str(first), title="First")["id"]
    two = relay.create(cwd=str(second), title="Second")["id"]
    page = pages.open(relay, f"/c/{one}")
    expect(by_id(page, "title")).to_have_text("First")
    by_id(page, "changes-button").click()
    expect(by_id(page, "change-path")).to_have_text(["a.txt"])
    shutil.rmtree(first)
    by_id(page, "changes-refresh").click()
    gone = f"The working directory {first} does not exist."
    expect(by_id(page, "changes-error")).to_have_text(gone)
    page.keyboard.press("Escape")
    held: list[Route] = []
    page.route(re.compile(rf"/api/conversations/{two}/changes$"), lambda r: held.append(r))
    page.get_by_test_id("conversation-item").filter(has_text="Second").click()
    expect(by_id(page, "title")).to_have_text("Second")
    by_id(page, "changes-button").click()
    expect(by_id(page, "changes-meta")).to_have_text("Loading…")
    expect(by_id(page, "changes-error")).to_be_hidden()  # the first one's
    expect(by_id(page, "change-item")).to_have_count(0)
    expect(by_id(page, "changes-root")).to_have_text("")
    while not held:
        page.wait_for_timeout(20)
    held[0].continue_()
    expect(by_id(page, "change-path")).to_have_text(["sub/", "⟨U+202E⟩gpj.exe"])
    expect(by_id(page, "change-counts")).to_have_text(["folder", "+1"])
    by_id(page, "change-toggle").first.click()
    expect(by_id(page, "change-diff").first).to_contain_text("a repository of its own")


def test_on_a_phone_the_button_is_small_and_gives_way_to_stop(pages: Pages, tmp_path: Path) -> None:
    relay = own_relay(tmp_path, demo_delay=0.05)  # "slow" streams 200 words: about 10 s
    try:
        cid = relay.create(title="On a phone")["id"]
        phone = {"viewport": {"width": 360, "height": 640}, "is_mobile": True, "has_touch": True}
        page = pages.open(relay, f"/c/{cid}", **phone)
        button = by_id(page, "changes-button")
        expect(button).to_be_visible()
        assert button.bounding_box()["width"] < 48  # the ± alone (the word for screen readers)
        expect(button).to_have_accessible_name("Changes")
        send_text(page, "slow please")
        expect(by_id(page, "stop-button")).to_be_visible()
        expect(button).to_be_hidden()  # the title keeps its room
        stopped = relay.http.post(f"/api/conversations/{cid}/interrupt", json={})
        assert stopped.status_code == 202, stopped.text
        expect(by_id(page, "stop-button")).to_be_hidden()
        expect(button).to_be_visible()
    finally:
        relay.stop()
