"""Issue 17's rough edges, the pure parts: rendering of code, links and partial text."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import nh3

from app.edits import MAX_LINES, edit_change, written_path
from app.live_render import RENDER_CHARS_PER_SECOND, RENDER_SECONDS, LiveRender
from app.overwrite import MAX_BYTES as OVERWRITE_MAX
from app.overwrite import existing_text
from app.render import HIGHLIGHT_CLASSES, render_markdown, render_partial
from app.window import apply_note
from tests.relay import CheckedLoop


def test_fenced_code_with_a_language_is_highlighted_with_classes_only() -> None:
    html = render_markdown("```python\ndef f():\n    return '<b>'\n```")
    assert '<span class="k">def</span>' in html
    assert "&lt;b&gt;" in html and "<b>" not in html
    assert "style=" not in html


def test_code_without_a_known_language_stays_plain() -> None:
    assert "<span" not in render_markdown("```\ndef f(): pass\n```")
    assert "<span" not in render_markdown("```no-such-language\ndef f(): pass\n```")


def test_bare_urls_become_links_but_file_names_do_not() -> None:
    html = render_markdown("see https://example.com/x?a=1 and app.py and me@example.com")
    assert '<a href="https://example.com/x?a=1"' in html
    assert html.count("<a ") == 1


def test_only_pygments_class_names_survive_on_spans() -> None:
    assert {"k", "nf", "s1", "c1"} <= HIGHLIGHT_CLASSES
    # The sanitizer itself, as render.py configures it, on hostile spans.
    from app.render import _ATTRIBUTE_VALUES, _ATTRIBUTES, _TAGS

    dirty = '<span class="k" style="color:red" onclick="x()">a</span><span class="evil">b</span>'
    clean = nh3.clean(
        dirty, tags=_TAGS, attributes=_ATTRIBUTES, tag_attribute_values=_ATTRIBUTE_VALUES
    )
    assert clean == '<span class="k">a</span><span>b</span>'


def test_a_partial_message_renders_like_a_whole_one() -> None:
    assert render_partial("I am **demo") == "<p>I am **demo</p>\n"
    assert render_partial("<script>x</script> **b**") == render_markdown("<script>x</script> **b**")


def test_an_edit_is_a_diff_without_snippet_line_numbers() -> None:
    change = edit_change(
        "Edit",
        {"file_path": "a.py", "old_string": "x = 1\ny = 2\n", "new_string": "x = 1\ny = 3\n"},
    )
    assert change == {
        "file": "a.py",
        "kind": "edit",
        "diff": ["@@", " x = 1", "-y = 2", "+y = 3"],
        "more": 0,
    }


def test_a_write_is_its_content_added_and_a_huge_one_is_cut() -> None:
    change = edit_change("Write", {"file_path": "b.txt", "content": "hello\nworld\n"})
    assert change == {"file": "b.txt", "kind": "write", "diff": ["+hello", "+world"], "more": 0}
    big = edit_change("create", {"path": "c.txt", "file_text": "x\n" * (MAX_LINES + 5)})
    assert big is not None and len(big["diff"]) == MAX_LINES and big["more"] == 5


def test_a_write_over_a_file_is_a_diff_from_its_text_now() -> None:
    write = {"file_path": "b.txt", "content": "one\nthree\n"}
    assert edit_change("Write", write, (True, "one\ntwo\n")) == {
        "file": "b.txt",
        "kind": "overwrite",
        "diff": ["@@", " one", "-two", "+three"],
        "more": 0,
    }
    unshown = edit_change("Write", write, (True, None))  # too big or binary: no old lines
    assert unshown is not None and unshown["kind"] == "overwrite"
    assert unshown["diff"] == ["+one", "+three"]
    assert [
        written_path(name, tool_input)
        for name, tool_input in [
            ("Write", write),
            ("create", {"path": "c"}),
            ("str_replace_editor", {"command": "create", "path": "d"}),
            ("str_replace_editor", {"command": "str_replace", "path": "d"}),
            ("Edit", {"file_path": "e"}),
            ("MultiEdit", {"file_path": "f"}),
            ("Write", {"content": "no path"}),
        ]
    ] == ["b.txt", "c", "d", None, None, None, None]


def test_the_text_a_write_replaces_is_read_only_inside_the_working_directory(
    tmp_path: Path,
) -> None:
    cwd, outside = tmp_path / "project", tmp_path / "secret.txt"
    (cwd / "sub").mkdir(parents=True)
    (cwd / "sub" / "a.txt").write_text("old text\n")
    outside.write_text("not for the card\n")
    (cwd / "escape.txt").symlink_to(outside)
    (cwd / "big.txt").write_bytes(b"x" * (OVERWRITE_MAX + 1))
    (cwd / "bin.dat").write_bytes(b"\x00\x01")
    os.mkfifo(cwd / "pipe")  # (opened, it would block)
    assert [
        existing_text(path, str(cwd))
        for path in [
            "sub/a.txt",
            str(cwd / "sub" / "a.txt"),
            str(outside),
            "../secret.txt",
            "escape.txt",
            "big.txt",
            "bin.dat",
            "pipe",
            "sub",
            "new.txt",
        ]
    ] == [
        (True, "old text\n"),
        (True, "old text\n"),
        (False, None),
        (False, None),
        (False, None),
        (True, None),
        (True, None),
        (False, None),
        (False, None),
        (False, None),
    ]


def test_multi_edit_and_copilot_edits_are_diffs_other_tools_are_not() -> None:
    multi = {"file_path": "c", "edits": [{"old_string": "a", "new_string": "b"}, "junk"]}
    assert edit_change("MultiEdit", multi)["diff"] == ["@@", "-a", "+b"]  # type: ignore[index]
    copilot = {"command": "str_replace", "path": "d", "old_str": "p", "new_str": "q"}
    assert edit_change("str_replace_editor", copilot)["diff"] == ["@@", "-p", "+q"]  # type: ignore[index]
    assert edit_change("str_replace_editor", {"command": "view", "path": "d"}) is None
    assert edit_change("Bash", {"command": "ls"}) is None
    assert edit_change("Edit", "not a mapping") is None


def test_before_any_session_a_window_change_restarts_nothing() -> None:
    assert apply_note(turn_running=False, background_work=False, has_session=False) == (
        "Applies on the next message."
    )
    assert apply_note(turn_running=False, background_work=False, has_session=True) == (
        "Applies on the next message (the session restarts once)."
    )


async def test_live_render_renders_off_the_loop_throttled_and_catches_up() -> None:
    parts = ["**a"]
    sent: list[tuple[str, int]] = []
    arrived = asyncio.Event()

    def emit(html: str, upto: int) -> None:
        sent.append((html, upto))
        arrived.set()

    live = LiveRender(lambda: "".join(parts), emit)
    live.poke()
    await asyncio.wait_for(arrived.wait(), 10)
    assert sent == [("<p>**a</p>\n", 3)]
    arrived.clear()
    parts.append("** 😀")  # within the pause: a rendering is scheduled, not started
    live.poke()
    live.poke()
    assert live.timer is not None and not live.busy
    await asyncio.wait_for(arrived.wait(), 10)
    assert sent[1] == ("<p><strong>a</strong> 😀</p>\n", 8)  # the emoji is 2 UTF-16 units
    parts.append(" more")
    live.poke()
    live.close()  # the message is done: nothing more
    assert live.timer is None
    await asyncio.sleep(RENDER_SECONDS * 3)
    assert len(sent) == 2


async def test_live_render_keeps_one_timer_however_many_pokes_come() -> None:
    # Found by a hostile review: pokes queued while a long text waited its turn each set a
    # timer; close() cancelled the last one only, and the others fired after it.
    parts = ["a"]
    arrived = asyncio.Event()
    fired: list[float] = []

    class Counted(LiveRender):
        def _fire(self) -> None:
            fired.append(time.monotonic())
            super()._fire()

    live = Counted(lambda: "".join(parts), lambda _html, _upto: arrived.set())
    live.poke()
    await asyncio.wait_for(arrived.wait(), 10)
    await asyncio.sleep(RENDER_SECONDS * 1.5)  # the pause over: a poke renders or waits
    parts.append("b" * 30_000)  # too long for now: a timer
    fired.clear()
    for _ in range(3):
        live.poke()
    live.close()
    await asyncio.sleep(30_001 / RENDER_CHARS_PER_SECOND + RENDER_SECONDS)
    assert fired == []


async def test_live_render_waits_as_long_as_the_text_it_would_render_needs() -> None:
    """A text that grew fast after a short rendering is not rendered at the shortest pause:
    its HTML would go to every tab as often as a short one's (RENDER_CHARS_PER_SECOND)."""
    parts = ["a"]
    sent: list[tuple[float, int]] = []
    arrived = asyncio.Event()

    def emit(_html: str, upto: int) -> None:
        sent.append((time.monotonic(), upto))
        arrived.set()

    live = LiveRender(lambda: "".join(parts), emit)
    live.poke()
    await asyncio.wait_for(arrived.wait(), 10)
    arrived.clear()
    first = sent[0][0]
    parts.append("b" * 30_000)  # 0.3 s of rendering's pace, 0.1 s after the first
    live.poke()
    await asyncio.sleep(RENDER_SECONDS * 2)
    assert len(sent) == 1  # not due yet: before, rendered after RENDER_SECONDS
    await asyncio.wait_for(arrived.wait(), 10)
    assert sent[1][1] == 30_001
    assert sent[1][0] - first >= 30_001 / RENDER_CHARS_PER_SECOND
    live.close()


def test_a_message_ended_from_the_writer_thread_has_its_timer_cancelled_on_the_loop() -> None:
    """The storage writer ends a streaming message (MessageDone) while its next rendering
    waits on a timer. uvloop's timers are not thread-safe: a timer cancelled from the writer
    thread was the cause found for three CI runs whose test process died with a segfault.
    CheckedLoop (asyncio's) notes a cancel made from another thread."""
    loop = CheckedLoop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        emitted: list[int] = []
        live = LiveRender(lambda: "a" * 30_000, lambda _html, upto: emitted.append(upto))
        loop.call_soon_threadsafe(live.poke)  # too long to render at once: a timer
        deadline = time.monotonic() + 10
        while live.timer is None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert live.timer is not None
        live.close()  # from this thread, as the writer's
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(10)  # the loop went on
        assert loop.wrong == []
        time.sleep(30_001 / RENDER_CHARS_PER_SECOND + RENDER_SECONDS)
        assert emitted == []  # and nothing was rendered after the end
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
