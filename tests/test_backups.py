"""Backups at thresholds, the pure parts: rails, file names, the Markdown (SPEC §6)."""

from __future__ import annotations

import os
import stat
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.backup_files import BackupFiles, error_text
from app.backups import (
    Item,
    Rails,
    Source,
    carry_over,
    decide,
    file_name,
    first_message,
    free_percent,
    header,
    number_of,
    ordinal,
    remaining_text,
    render,
    tool_facts,
)
from app.summary import compose_first_message


def run(figures: list[int], window: int | None, rails: Rails | None = None) -> list[str | None]:
    """The trigger of each figure in turn (None: no backup)."""
    rails = rails or Rails()
    fired = []
    for used in figures:
        trigger, rails = decide(used, window, rails)
        fired.append(trigger)
    return fired


# the rails -------------------------------------------------------------------------------------


def test_free_percent_takes_off_the_33k_buffer() -> None:
    assert free_percent(0, 200_000) == 83.5  # the buffer is 16.5 % of a 200k window
    assert free_percent(0, 1_000_000) == 96.7  # and 3.3 % of a 1M window
    assert free_percent(100_000, 200_000) == 33.5
    assert free_percent(190_000, 200_000) == 0.0  # never below zero


def test_1m_window_token_rail_fires_first_at_5_percent_used() -> None:
    figures = [20_000, 49_999, 50_000, 55_000, 59_999, 61_234, 65_000, 71_233, 71_234]
    assert run(figures, 1_000_000) == [
        None,
        None,
        "tokens_50k",  # 5 % of the window used, free is still 91.7 %
        None,
        None,
        "tokens_60k_update",
        None,
        None,
        "tokens_70k_update",  # 10,000 over the last backup's 61,234
    ]


def test_1m_window_free_rail_never_names_a_backup_of_a_steady_climb() -> None:
    fired = run([n * 10_000 for n in range(1, 71)], 1_000_000)  # 10k, 20k, ... 700k
    assert fired[:4] == [None, None, None, None]
    # 30 % free means 670k+ burnt: the token rail is there first, so it names every backup.
    assert fired[4:] == ["tokens_50k"] + [f"tokens_{n}0k_update" for n in range(6, 71)]
    _, rails = decide(690_000, 1_000_000, Rails(last_used=680_000, tokens_started=True))
    assert rails.crossed == frozenset({30})  # crossed all the same, with the token backup


def test_200k_window_rails_overlap() -> None:
    figures = [50_000, 59_999, 60_000, 100_000, 108_000, 110_000, 118_000, 140_000, 160_000]
    assert run(figures, 200_000) == [
        "tokens_50k",
        None,
        "tokens_60k_update",
        "tokens_100k_update",
        "free_30pct",  # 29.5 % free: the safety net, between two token backups
        None,  # the next token backup is 10,000 over 108,000
        "tokens_110k_update",
        "tokens_140k_update",  # free_15pct crosses with it: one backup, the token rail's name
        "tokens_160k_update",  # and free_5pct here
    ]


def test_200k_window_first_figure_past_everything_writes_one_backup() -> None:
    trigger, rails = decide(150_000, 200_000, Rails())  # a session opening with a big prompt
    assert trigger == "tokens_50k"
    assert rails == Rails(last_used=150_000, tokens_started=True, crossed=frozenset({30, 15}))
    assert run([158_000, 168_000], 200_000, rails) == ["free_5pct", "tokens_160k_update"]


def test_small_window_free_rail_fires_before_50k() -> None:
    figures = [40_000, 45_000, 50_000, 52_000, 53_000, 61_999, 63_000]
    assert run(figures, 100_000) == [
        "free_30pct",  # 27 % free
        None,
        "tokens_50k",  # the first token backup still comes at 50k
        None,  # exactly 15.0 % free: not below
        "free_15pct",
        None,  # 5.001 % free, and not yet 10,000 over 53,000
        "tokens_60k_update",  # free_5pct crosses with it
    ]


def test_unknown_window_runs_the_token_rail_only() -> None:
    assert run([30_000, 50_000, 150_000], None) == [None, "tokens_50k", "tokens_150k_update"]


def test_rails_start_over_after_a_compaction() -> None:
    _, rails = decide(120_000, 200_000, Rails())
    assert decide(121_000, 200_000, rails)[0] is None
    assert decide(51_000, 200_000, Rails())[0] == "tokens_50k"  # a compaction resets to Rails()


def test_rails_json_round_trip_and_bad_data() -> None:
    rails = Rails(last_used=61_234, tokens_started=True, crossed=frozenset({30, 15}))
    assert rails.as_dict() == {"last_used": 61_234, "tokens_started": True, "crossed": [30, 15]}
    assert Rails.from_dict(rails.as_dict()) == rails
    assert Rails.from_dict({"last_used": "61k"}) == Rails()
    assert Rails.from_dict({"crossed": [30, 7, "x"], "tokens_started": 1}) == Rails(
        crossed=frozenset({30})
    )


# file names ------------------------------------------------------------------------------------


def test_file_name_of_the_seed() -> None:
    assert file_name(3, datetime(2026, 2, 18, 14, 15)) == "3-backup-18th-Feb-2026-2-15pm.md"
    assert file_name(1, datetime(2026, 1, 26, 16, 30)) == "1-backup-26th-Jan-2026-4-30pm.md"
    assert file_name(2, datetime(2026, 1, 26, 17, 15)) == "2-backup-26th-Jan-2026-5-15pm.md"
    assert file_name(3, datetime(2026, 1, 26, 17, 45)) == "3-backup-26th-Jan-2026-5-45pm.md"


def test_file_name_am_pm_edges() -> None:
    assert file_name(1, datetime(2026, 3, 1, 0, 5)) == "1-backup-1st-Mar-2026-12-05am.md"
    assert file_name(2, datetime(2026, 3, 1, 11, 59)) == "2-backup-1st-Mar-2026-11-59am.md"
    assert file_name(3, datetime(2026, 3, 1, 12, 0)) == "3-backup-1st-Mar-2026-12-00pm.md"
    assert file_name(4, datetime(2026, 3, 1, 13, 7)) == "4-backup-1st-Mar-2026-1-07pm.md"
    assert file_name(12, datetime(2026, 3, 1, 23, 59)) == "12-backup-1st-Mar-2026-11-59pm.md"


def test_file_name_months() -> None:
    names = [file_name(1, datetime(2027, month, 9, 9, 0)) for month in range(1, 13)]
    assert [name.split("-")[3] for name in names] == [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"
    ]  # fmt: skip
    assert names[11] == "1-backup-9th-Dec-2027-9-00am.md"


def test_ordinals() -> None:
    days = [1, 2, 3, 4, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 30, 31]
    assert [ordinal(d) for d in days] == [
        "1st", "2nd", "3rd", "4th", "10th", "11th", "12th", "13th", "14th",
        "20th", "21st", "22nd", "23rd", "24th", "30th", "31st",
    ]  # fmt: skip


def test_number_of_accepts_only_backup_names() -> None:
    assert number_of("3-backup-18th-Feb-2026-2-15pm.md") == 3
    assert number_of("120-backup-1st-Mar-2026-12-05am.md") == 120
    assert number_of("rails.json") is None
    assert number_of("../3-backup-18th-Feb-2026-2-15pm.md") is None
    assert number_of("0-backup-18th-Feb-2026-2-15pm.md") is None
    assert number_of("3-backup-18th-Feb-2026-2-15pm.md.tmp") is None


# the Markdown ----------------------------------------------------------------------------------


def test_remaining_text() -> None:
    assert remaining_text(60_000, 1_000_000) == "94.0%"
    assert remaining_text(61_234, 200_000) == "69.4%"
    assert remaining_text(None, 200_000) == "—"
    assert remaining_text(1_000, None) == "—"
    # A window chosen below what is used (compacted on the next message): nothing left, not -50%.
    assert remaining_text(150_000, 100_000) == "0.0%"


def test_tool_facts() -> None:
    assert tool_facts("Edit", {"file_path": "/w/a.py", "old_string": "x"}) == {"file": "/w/a.py"}
    assert tool_facts("Write", {"file_path": "/w/b.md", "content": "..."}) == {"file": "/w/b.md"}
    assert tool_facts("NotebookEdit", {"notebook_path": "/w/n.ipynb"}) == {"file": "/w/n.ipynb"}
    assert tool_facts("create", {"path": "/w/c.txt", "file_text": "hi"}) == {"file": "/w/c.txt"}
    assert tool_facts("str_replace_editor", {"command": "view", "path": "/w/c.txt"}) == {}
    assert tool_facts("Bash", {"command": "ls"}) == {}
    assert tool_facts("Edit", "not a dict") == {}
    todos = [{"content": "Write post", "status": "completed", "activeForm": "Writing"}, {"x": 1}]
    assert tool_facts("TodoWrite", {"todos": todos}) == {"todos": [["Write post", "completed"]]}
    assert tool_facts("TaskCreate", {"subject": "Ship it", "description": "d"}) == {
        "task": "Ship it"
    }
    assert tool_facts("TaskUpdate", {"taskId": "7", "status": "completed"}) == {
        "task_id": "7",
        "task_status": "completed",
    }
    assert tool_facts("Skill", {"skill": "content-writer"}) == {"skill": "content-writer"}
    assert tool_facts("skill", {"skill": "pdf"}) == {"skill": "pdf"}


def tool(
    name: str, facts: dict[str, object], *, output: str = "", is_error: bool | None = False
) -> Item:
    """A tool call as the timeline stores it once its result came (is_error None: none yet)."""
    data: dict[str, object] = {"type": "tool", "tool": name, "backup": facts, "output": output}
    if is_error is not None:
        data["is_error"] = is_error
    return Item("activity", "summary", data)


def test_a_message_that_starts_with_a_slash_but_says_more_is_a_request() -> None:
    # A review: "/tmp is full, …" (sent to the model as text) and "/compact keep …" (text,
    # SPEC §2) were left out of User Requests as commands.
    texts = ["/tmp is full, please clean it", "/compact keep the parser notes", "/context"]
    items = [Item("user", text) for text in texts]
    source = Source("T", 1, "s", "tokens_50k", 50_000, 200_000, datetime(2026, 1, 1), items)
    markdown = render(source)
    assert "## User Requests\n\n- /tmp is full, please clean it\n" in markdown
    assert "- /compact keep the parser notes\n\n## Files Modified" in markdown


def test_failed_denied_and_unfinished_calls_change_nothing_a_backup_lists() -> None:
    # A review: a denied Write was under Files Modified, a failed Skill under Skills Loaded,
    # a failed TodoWrite's todos under Tasks.
    items = [
        tool("Write", {"file": "denied.py"}, output="The user doesn't want to", is_error=True),
        tool("Write", {"file": "waiting.py"}, is_error=None),  # its permission question open
        tool("Skill", {"skill": "content-writer"}, output="Unknown skill", is_error=True),
        tool("TodoWrite", {"todos": [["Write sub", "completed"]]}, is_error=True),
        tool("Edit", {"file": "done.py"}),
    ]
    source = Source("T", 1, "s", "tokens_50k", 50_000, 200_000, datetime(2026, 1, 1), items)
    markdown = render(source)
    assert "## Files Modified\n\n- done.py\n\n" in markdown
    assert "### Created\n\n- (none)\n\n### Completed\n\n- (none)\n" in markdown
    assert "## Skills Loaded\n\n- (none)\n" in markdown


def test_render_the_seed_example() -> None:
    source = Source(
        title="Blog posts",
        conversation_id=12,
        session_id="abc123",
        trigger="tokens_60k_update",
        used=60_000,
        window=1_000_000,
        generated=datetime(2026, 1, 26, 17, 45, tzinfo=UTC),
        items=[
            Item("user", "Create two blog posts about context management"),
            Item("agent", "On it.\nFirst I read the structure."),
            tool("TodoWrite", {"todos": [["Write Post 1: Context Buffer Management", "pending"]]}),
            tool(
                "TodoWrite",
                {
                    "todos": [
                        ["Write Post 1: Context Buffer Management", "completed"],
                        ["Write Post 2: Context Recovery Hook", "completed"],
                    ]
                },
            ),
            tool("Skill", {"skill": "content-writer"}),
            Item("activity", "ls", {"type": "tool", "tool": "Bash", "output": "a\nb"}),
            tool(
                "Write",
                {"file": "apps/web/src/content/blog/guide/mechanics/context-buffer-management.mdx"},
            ),
            tool(
                "Write", {"file": "apps/web/src/content/blog/tools/hooks/context-recovery-hook.mdx"}
            ),
            Item("user", "Add the new post to blog-structure.ts"),
            tool("Edit", {"file": "apps/web/src/content/blog/blog-structure.ts"}),
            Item("user", "k"),  # one character: noise
            Item("user", "/context"),  # a command
            Item("user", "/cost "),  # a command (as sent)
            Item("line", "Context compacted · 120k → 40k tokens", {"type": "compaction"}),
            Item("user", "Fix the internal linking"),
            tool("Edit", {"file": "apps/web/src/content/blog/blog-structure.ts"}),
            Item("agent", ""),  # a message made of tool calls only
            Item("agent", "Done: both posts are linked."),
        ],
    )
    assert render(source) == (
        "# Session Backup\n"
        "\n"
        "**Conversation:** Blog posts (#12)\n"
        "**Session ID:** abc123\n"
        "**Trigger:** tokens_60k_update\n"
        "**Context Remaining:** 94.0%\n"
        "**Generated:** 2026-01-26T17:45:00.000Z\n"
        "\n"
        "## User Requests\n"
        "\n"
        "- Create two blog posts about context management\n"
        "- Add the new post to blog-structure.ts\n"
        "- Fix the internal linking\n"
        "\n"
        "## Files Modified\n"
        "\n"
        "- apps/web/src/content/blog/guide/mechanics/context-buffer-management.mdx\n"
        "- apps/web/src/content/blog/tools/hooks/context-recovery-hook.mdx\n"
        "- apps/web/src/content/blog/blog-structure.ts\n"
        "\n"
        "## Tasks\n"
        "\n"
        "### Created\n"
        "\n"
        "- **Write Post 1: Context Buffer Management**\n"
        "- **Write Post 2: Context Recovery Hook**\n"
        "\n"
        "### Completed\n"
        "\n"
        "- 2 tasks completed\n"
        "\n"
        "## Skills Loaded\n"
        "\n"
        "- content-writer\n"
        "\n"
        "## Key Replies\n"
        "\n"
        "- On it.\n"
        "- Done: both posts are linked.\n"
    )


def test_render_empty_timeline_and_unknowns() -> None:
    source = Source(
        title="Empty  \n title",
        conversation_id=1,
        session_id=None,
        trigger="precompact_manual",
        used=None,
        window=None,
        generated=datetime(2026, 2, 18, 14, 15, 7, 123_999, tzinfo=UTC),
        items=[Item("user", "x"), Item("agent", "?")],
    )
    assert render(source) == (
        "# Session Backup\n\n"
        "**Conversation:** Empty title (#1)\n"
        "**Session ID:** —\n"
        "**Trigger:** precompact_manual\n"
        "**Context Remaining:** —\n"
        "**Generated:** 2026-02-18T14:15:07.123Z\n\n"
        "## User Requests\n\n- (none)\n\n"
        "## Files Modified\n\n- (none)\n\n"
        "## Tasks\n\n### Created\n\n- (none)\n\n### Completed\n\n- (none)\n\n"
        "## Skills Loaded\n\n- (none)\n\n"
        "## Key Replies\n\n- (none)\n"
    )


def test_render_cuts_lines_keeps_last_ten_replies_and_counts_tasks() -> None:
    long = "word " * 100  # 500 characters
    items = [Item("user", long), Item("user", "two\n\n  lines")]
    items += [Item("agent", f"reply {n}\nmore") for n in range(1, 13)]
    items += [
        tool("TaskCreate", {"task": "Task A"}),
        tool("TaskCreate", {"task": "Task B"}),
        tool("TaskUpdate", {"task_id": "1", "task_status": "in_progress"}),
        tool("TaskUpdate", {"task_id": "1", "task_status": "completed"}),
        tool("TaskUpdate", {"task_id": "1", "task_status": "completed"}),  # the same task
        tool("create", {"file": "/w/new.txt"}),
    ]
    source = Source(
        "T", 2, "s", "free_5pct", 190_000, 200_000, datetime(2026, 1, 1, tzinfo=UTC), items
    )
    markdown = render(source)
    requests = markdown.split("## User Requests\n\n")[1].split("\n\n")[0].splitlines()
    assert requests == ["- " + ("word " * 52)[:259] + "…", "- two lines"]
    assert len(requests[0]) == 2 + 260
    replies = markdown.split("## Key Replies\n\n")[1].splitlines()
    assert replies == [f"- reply {n}" for n in range(3, 13)]
    assert (
        "### Created\n\n- **Task A**\n- **Task B**\n\n### Completed\n\n- 1 tasks completed\n"
        in markdown
    )
    assert "## Files Modified\n\n- /w/new.txt\n" in markdown
    assert "**Context Remaining:** 5.0%\n" in markdown


def test_header_reads_the_fields_back() -> None:
    source = Source(
        "T", 2, "s", "free_5pct", 190_000, 200_000, datetime(2026, 1, 1, tzinfo=UTC), []
    )
    assert header(render(source)) == {
        "Conversation": "T (#2)",
        "Session ID": "s",
        "Trigger": "free_5pct",
        "Context Remaining": "5.0%",
        "Generated": "2026-01-01T00:00:00.000Z",
    }


def test_first_message_from_a_backup() -> None:
    name = "3-backup-18th-Feb-2026-2-15pm.md"
    markdown = "# Session Backup\n\n**Trigger:** tokens_50k\n"
    expected = (
        "[Carry-over context from backup 3-backup-18th-Feb-2026-2-15pm.md]\n"
        "# Session Backup\n\n**Trigger:** tokens_50k\n"
        "\n"
        "[New user request]\n"
        "go on"
    )
    assert first_message(name, markdown, "go on") == expected
    # The /compact path sends the same thing when the pending summary is a backup's carry-over.
    assert compose_first_message(carry_over(name, markdown), "go on") == expected
    assert compose_first_message("Conversation: T", "go on") == (
        "[Carry-over context from previous compacted conversation]\nConversation: T\n\n"
        "[New user request]\ngo on"
    )


# the files -------------------------------------------------------------------------------------


def test_files_are_numbered_never_overwritten_and_private(tmp_path: Path) -> None:
    files = BackupFiles(tmp_path / "backups")
    when = datetime(2026, 2, 18, 14, 15)
    assert files.write(7, "one\n", when) == "1-backup-18th-Feb-2026-2-15pm.md"
    assert files.write(7, "two\n", when) == "2-backup-18th-Feb-2026-2-15pm.md"
    # A file someone left with the next name is skipped over, not overwritten.
    taken = tmp_path / "backups" / "7" / "3-backup-18th-Feb-2026-2-15pm.md"
    taken.write_text("keep me")
    assert files.write(7, "four\n", when) == "4-backup-18th-Feb-2026-2-15pm.md"
    assert taken.read_text() == "keep me"
    assert files.names(7) == [
        "4-backup-18th-Feb-2026-2-15pm.md",
        "3-backup-18th-Feb-2026-2-15pm.md",
        "2-backup-18th-Feb-2026-2-15pm.md",
        "1-backup-18th-Feb-2026-2-15pm.md",
    ]
    assert files.read(7, "2-backup-18th-Feb-2026-2-15pm.md") == "two\n"
    for bad in (
        "rails.json",
        "../7/1-backup-18th-Feb-2026-2-15pm.md",
        "9-backup-1st-Jan-2026-1-00am.md",
    ):
        with pytest.raises(LookupError):
            files.read(7, bad)
    assert stat.S_IMODE(os.stat(tmp_path / "backups").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "backups" / "7").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "backups" / "7" / files.names(7)[0]).st_mode) == 0o600
    # A directory or a FIFO under a backup's name is no backup (a hostile review: the directory
    # gave a 500; a FIFO's read never ends).
    (tmp_path / "backups" / "7" / "8-backup-1st-Jan-2026-1-00am.md").mkdir()
    os.mkfifo(tmp_path / "backups" / "7" / "9-backup-1st-Jan-2026-1-00am.md")
    for odd in ("8-backup-1st-Jan-2026-1-00am.md", "9-backup-1st-Jan-2026-1-00am.md"):
        with pytest.raises(LookupError):
            files.read(7, odd)
    assert files.names(7)[0] == "4-backup-18th-Feb-2026-2-15pm.md"  # the list's read: no FIFO
    os.mkfifo(tmp_path / "backups" / "7" / "rails.json")
    assert files.load_rails(7) == Rails()


def test_a_backup_is_listed_only_once_written_whole(tmp_path: Path) -> None:
    # A CI run listed a backup being written, empty: its trigger unknown (None).
    files = BackupFiles(tmp_path / "backups")
    markdown = "# Session Backup\n\n**Trigger:** precompact_manual\n\n" + "x" * (64 << 20)
    writer = threading.Thread(target=files.write, args=(7, markdown, datetime(2026, 2, 18)))
    seen: list[Any] = []
    writer.start()
    while writer.is_alive() or not seen:
        for name in files.names(7):
            seen.append((files.info(7, name)["trigger"], (files.folder(7) / name).stat().st_size))
    writer.join()
    assert set(seen) == {("precompact_manual", len(markdown))}


def test_rails_survive_in_the_folder(tmp_path: Path) -> None:
    files = BackupFiles(tmp_path / "backups")
    assert files.load_rails(3) == Rails()
    rails = Rails(last_used=61_234, tokens_started=True, crossed=frozenset({30}))
    files.save_rails(3, rails)
    assert files.load_rails(3) == rails
    assert stat.S_IMODE(os.stat(tmp_path / "backups" / "3" / "rails.json").st_mode) == 0o600
    # A save that fails midway (as on a full disk) leaves the saved rails and no litter.
    with pytest.raises(TypeError):
        files.save_rails(3, Rails(last_used=object()))  # type: ignore[arg-type]
    assert files.load_rails(3) == rails
    assert sorted(p.name for p in (tmp_path / "backups" / "3").iterdir()) == ["rails.json"]
    (tmp_path / "backups" / "3" / "rails.json").write_text("{not json")
    assert files.load_rails(3) == Rails()


def test_error_text_is_one_clear_line() -> None:
    error = OSError(28, "No space left on device", "/data/backups/3")
    assert error_text("tokens_50k", error) == (
        "The backup (tokens_50k) could not be written: No space left on device (/data/backups/3)"
    )
    assert error_text("free_5pct", LookupError("the conversation is gone")) == (
        "The backup (free_5pct) could not be written: the conversation is gone"
    )
