"""Sessions started in a terminal (issue #17): the real `claude` CLI, run as a terminal user
would in a workspace with its own CLAUDE_CONFIG_DIR, against the fake Messages API; then the
relay lists the session, imports it, and resumes it on the next message.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app import imports
from app.agents.claude_code import RESUME_FAILED
from app.agents.transcript import project_slug
from app.imports import NO_RESULT, HistoryBuilder, read_history, user_drafts
from tests.fake_anthropic import FakeAnthropic
from tests.relay import LiveRelay, make_settings
from tests.terminal import CLI, terminal

TIMEOUT = 60
FIRST = "my name is Bob [[BASH:echo hi]]"


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    """The user's environment, which the relay passes on: the fake API, a CLAUDE_CONFIG_DIR."""
    config = tmp_path / "claude-config"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    return config


@pytest.fixture
def live(tmp_path: Path, config: Path) -> Iterator[LiveRelay]:
    with LiveRelay(make_settings(tmp_path / "data")) as relay:
        yield relay


def sessions(live: LiveRelay) -> dict[str, Any]:
    response = live.http.get("/api/claude-sessions")
    assert response.status_code == 200, response.text
    return response.json()


def only_session(live: LiveRelay, cwd: Path) -> dict[str, Any]:
    (found,) = [s for s in sessions(live)["sessions"] if s["cwd"] == str(cwd)]
    return found


def import_session(live: LiveRelay, session_id: str) -> Any:
    return live.http.post(f"/api/claude-sessions/{session_id}/import")


def shape(view: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(e["kind"], e["state"], e["text"]) for e in view["timeline"]]


# The whole round trip ---------------------------------------------------------------------------


def test_terminal_session_is_listed_imported_and_resumed(
    live: LiveRelay, config: Path, fake: FakeAnthropic, tmp_path: Path
) -> None:
    workspace = tmp_path / "data" / "work" / "my proj.v2"
    out = terminal(workspace, FIRST, "--allowedTools", "Bash")
    assert out.stdout.strip() == "The tool returned: hi"
    # The CLI's own directory name: every character but ASCII letters and digits is "-".
    (transcript,) = (config / "projects").glob("*/*.jsonl")
    assert transcript.parent.name == project_slug(str(workspace))
    assert transcript.parent.name.endswith("-data-work-my-proj-v2")

    listing = sessions(live)
    assert listing["config_dir"] == str(config)
    found = only_session(live, workspace)
    assert found["session_id"] == transcript.stem
    assert found["title"] == FIRST
    assert found["conversation_id"] is None
    # In UTC with a Z, as every time the API gives (it ended in "+00:00" here)
    assert found["updated_at"].endswith("Z") and "+" not in found["updated_at"]

    response = import_session(live, found["session_id"])
    assert response.status_code == 201, response.text
    conversation = response.json()
    cid = conversation["id"]
    assert conversation["provider"] == "claude"
    assert conversation["session_id"] == found["session_id"]
    assert conversation["cwd"] == str(workspace)
    assert conversation["title"] == FIRST
    assert conversation["context_tokens"] == 1000  # the session's last reported usage

    view = live.get(cid)
    assert shape(view) == [
        (
            "line",
            "done",
            f"Imported from the Claude Code session {found['session_id']} "
            f"(started in a terminal in {workspace}).",
        ),
        ("user", "sent", FIRST),
        ("agent", "done", "I will run the command."),
        ("activity", "done", "echo hi"),
        ("agent", "done", "The tool returned: hi"),
    ]
    tool = view["timeline"][3]["data"]
    assert (tool["tool"], tool["output"], tool["is_error"]) == ("Bash", "hi", False)
    assert view["timeline"][2]["html"] == "<p>I will run the command.</p>\n"

    # Marked as imported in the list; a second import is refused and stores nothing.
    assert only_session(live, workspace)["conversation_id"] == cid
    again = import_session(live, found["session_id"])
    assert again.status_code == 409
    assert again.json() == {"detail": f"This session is already conversation {cid}."}
    listed = live.http.get("/api/conversations").json()["conversations"]
    assert [c["id"] for c in listed] == [cid]

    # The next message resumes the session: the model gets the terminal's turns.
    before = len(fake.message_bodies())
    assert live.send(cid, "what is my name?").status_code == 202
    view = live.wait_idle(cid, timeout=TIMEOUT)
    assert view["timeline"][-1]["text"] == "You said: what is my name?"
    assert view["session_id"] == found["session_id"]
    assert RESUME_FAILED not in [e["text"] for e in view["timeline"]]
    body = fake.message_bodies()[before]
    sent = json.dumps(body["messages"])
    assert FIRST in sent
    assert "The tool returned: hi" in sent
    assert fake.user_texts_sent()[-1] == "what is my name?"

    # ... and back to the terminal: `claude --resume <id>` there sees the relay's turn too.
    before = len(fake.message_bodies())
    back = terminal(workspace, "and now?", "--resume", found["session_id"])
    assert back.stdout.strip() == "You said: and now?"
    sent = json.dumps(fake.message_bodies()[before]["messages"])
    assert "what is my name?" in sent and FIRST in sent

    # ... and once the relay's agent has stopped, its next resume has the terminal's turn.
    live.stop()
    again = LiveRelay(live.settings).start()
    try:
        before = len(fake.message_bodies())
        assert again.send(cid, "one more").status_code == 202
        view = again.wait_idle(cid, timeout=TIMEOUT)
        assert view["timeline"][-1]["text"] == "You said: one more"
        sent = json.dumps(fake.message_bodies()[before]["messages"])
        assert "and now?" in sent and "what is my name?" in sent and FIRST in sent
    finally:
        again.stop()


def test_only_sessions_inside_the_roots_are_listed(
    live: LiveRelay, config: Path, tmp_path: Path
) -> None:
    inside = tmp_path / "data" / "work"
    outside = tmp_path / "elsewhere"
    terminal(inside, "inside the roots")
    terminal(outside, "outside the roots")
    assert len(list((config / "projects").glob("*/*.jsonl"))) == 2
    listed = sessions(live)["sessions"]
    assert [(s["cwd"], s["title"]) for s in listed] == [(str(inside), "inside the roots")]
    (transcript,) = (config / "projects" / project_slug(str(outside))).glob("*.jsonl")
    refused = import_session(live, transcript.stem)
    assert refused.status_code == 400
    assert "must be inside" in refused.json()["detail"]
    assert live.http.get("/api/conversations").json()["conversations"] == []


def test_sessions_already_held_do_not_fill_the_list(
    live: LiveRelay, config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a hostile review: the 100 newest sessions were listed, held or not; once
    # conversations held 100 newer ones (every Claude Code conversation does), an older
    # terminal session could not be reached from the dialog.
    monkeypatch.setattr(imports, "MAX_LISTED", 2)
    terminal(tmp_path / "data" / "work", "the terminal's own")
    (older,) = (config / "projects").glob("*/*.jsonl")
    newer = [older.with_name(f"{uuid.uuid4()}.jsonl") for _ in range(3)]
    for n, path in enumerate(newer, start=1):
        shutil.copyfile(older, path)
        os.utime(path, (older.stat().st_mtime + n, older.stat().st_mtime + n))
        assert import_session(live, path.stem).status_code == 201
    listed = sessions(live)
    held = [s["session_id"] for s in listed["sessions"] if s["conversation_id"] is not None]
    fresh = [s["session_id"] for s in listed["sessions"] if s["conversation_id"] is None]
    assert held == [path.stem for path in reversed(newer)]  # newest first, marked held
    assert fresh == [older.stem]
    assert listed["more"] is False


def test_a_killed_cli_s_record_does_not_hold_its_session_once_its_pid_is_reused(
    live: LiveRelay, config: Path, tmp_path: Path
) -> None:
    # Found by a hostile review: a CLI killed with SIGKILL leaves sessions/<pid>.json; once
    # another program had that pid, the session could never be imported ("still open").
    terminal(tmp_path / "data" / "work", "killed later")
    (transcript,) = (config / "projects").glob("*/*.jsonl")
    init = Path("/proc/1/stat").read_text().rsplit(")", 1)[-1].split()[19]  # pid 1's start
    record = config / "sessions" / "1.json"
    record.parent.mkdir(exist_ok=True)
    stale = {"pid": 1, "sessionId": transcript.stem, "cwd": str(tmp_path), "kind": "interactive"}
    record.write_text(json.dumps(stale | {"procStart": init}))  # pid 1 itself: it runs
    refused = import_session(live, transcript.stem)
    assert refused.status_code == 409, refused.text
    assert "still open in a terminal (process 1)" in refused.json()["detail"]
    record.write_text(json.dumps(stale | {"procStart": str(int(init) + 12345)}))  # another
    assert import_session(live, transcript.stem).status_code == 201


def test_bad_or_unknown_session_ids(live: LiveRelay) -> None:
    assert import_session(live, "not-a-session").status_code == 422
    assert import_session(live, "..%2F..%2Fetc").status_code in (404, 422)
    missing = "00000000-0000-4000-8000-000000000000"
    response = import_session(live, missing)
    assert response.status_code == 404
    assert missing in response.json()["detail"]


def test_a_session_still_open_in_a_terminal_is_not_imported(
    live: LiveRelay, config: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "data" / "work"
    # Through a shell, as from a terminal: the CLI is not a child of this (the relay's) process.
    process = subprocess.Popen(
        ["sh", "-c", '"$0" -p "[[SLOW:20]] take your time"; :', str(CLI)],
        cwd=workspace,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (
            list((config / "projects").glob("*/*.jsonl")) and list(config.glob("sessions/*.json"))
        ):
            assert time.monotonic() < deadline, "the CLI wrote no transcript"
            time.sleep(0.1)
        (transcript,) = (config / "projects").glob("*/*.jsonl")
        (record,) = config.glob("sessions/*.json")
        pid = json.loads(record.read_text())["pid"]
        assert pid != process.pid
        response = import_session(live, transcript.stem)
        assert response.status_code == 409, response.text
        assert f"still open in a terminal (process {pid})" in response.json()["detail"]
        assert live.http.get("/api/conversations").json()["conversations"] == []
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# Reading a transcript: malformed lines, huge ones, bounds (pure, on a real transcript) -----------


@pytest.fixture
def real_transcript(config: Path, tmp_path: Path) -> Path:
    terminal(tmp_path / "work", FIRST, "--allowedTools", "Bash")
    (path,) = (config / "projects").glob("*/*.jsonl")
    return path


def texts(path: Path, **bounds: Any) -> list[tuple[str, str]]:
    return [(d.kind, d.text) for d in read_history(path, **bounds).entries]


EXPECTED = [
    ("user", FIRST),
    ("agent", "I will run the command."),
    ("activity", "echo hi"),
    ("agent", "The tool returned: hi"),
]


def test_malformed_and_oversized_lines_are_skipped(real_transcript: Path) -> None:
    assert texts(real_transcript) == EXPECTED
    lines = real_transcript.read_bytes().splitlines(keepends=True)
    garbage = [
        b"not json at all\n",
        b'{"type":"user","message":"not an object"}\n',
        b'{"type":"assistant"}\n',
        b"[1, 2, 3]\n",
        b'{"type":"user","message":{"content":"' + b"x" * 5_000_000 + b'"}}\n',
        b"\xff\xfe broken utf-8\n",
    ]
    mixed = lines[:3] + garbage + lines[3:] + [b'{"type":"user","message":{"content":"cut off']
    real_transcript.write_bytes(b"".join(mixed))
    history = read_history(real_transcript)
    assert [(d.kind, d.text) for d in history.entries] == EXPECTED
    assert history.skipped_lines == len(garbage) + 1


def test_a_huge_transcript_is_read_from_its_end(real_transcript: Path) -> None:
    full = real_transcript.read_bytes()
    second = full.replace(b"my name is Bob", b"second prompt").replace(b"msg_fake_", b"msg_two_")
    real_transcript.write_bytes(full + second)
    both = texts(real_transcript)
    assert [t for k, t in both if k == "user"] == [
        FIRST,
        FIRST.replace("my name is Bob", "second prompt"),
    ]
    # Only the last len(second) bytes: the first copy is left out, the second is whole.
    history = read_history(real_transcript, max_bytes=len(second))
    assert [d.text for d in history.entries if d.kind == "user"] == [
        "second prompt [[BASH:echo hi]]"
    ]
    assert history.bytes_left_out == len(full)
    # At most max_entries, the latest.
    history = read_history(real_transcript, max_entries=2)
    assert [d.text for d in history.entries] == ["echo hi", "The tool returned: hi"]
    assert history.entries_left_out == len(both) - 2


def test_a_long_transcript_is_read_in_one_pass(real_transcript: Path) -> None:
    # Found by a hostile review: placing each message walked every message before it (a
    # 32 MiB session took 93 s, the relay stalling): a placed message is forgotten now.
    lines = real_transcript.read_text().splitlines()
    builder = HistoryBuilder()
    for n in range(200):  # the same exchange 200 times, its messages' and calls' ids each new
        for line in lines:
            builder.feed(json.loads(line.replace("msg_", f"msg{n}_").replace("toolu_", f"t{n}_")))
    entries = builder.finish()
    assert [(d.kind, d.text) for d in entries[:4]] == EXPECTED
    assert len(entries) == 200 * len(EXPECTED)
    assert builder.starts == {}  # every message placed, none kept


def test_only_the_latest_entries_are_held_while_reading(real_transcript: Path) -> None:
    # Found by a hostile review: 32 MiB of tiny records made ~727,000 entries, all but 2,000
    # then thrown away (200 MiB more, 5 s). Older ones are dropped as it reads; the result and
    # what it says was left out are the same.
    lines = real_transcript.read_text().splitlines()
    exchanges = [
        line.replace("msg_", f"msg{n}_").replace("toolu_", f"t{n}_").replace("Bob", f"Bob {n}")
        for n in range(60)
        for line in lines
    ]
    real_transcript.write_text("\n".join(exchanges) + "\n")
    history = read_history(real_transcript, max_entries=10)
    shown = [(d.kind, d.text) for d in history.entries]
    assert shown == [(d.kind, d.text) for d in read_history(real_transcript).entries][-10:]
    assert shown[-4:] == [(kind, text.replace("Bob", "Bob 59")) for kind, text in EXPECTED]
    assert history.entries_left_out == 60 * len(EXPECTED) - 10
    # The last message is not placed until the next record: what is dropped comes before it.
    whole, dropping = HistoryBuilder(), HistoryBuilder()
    for line in exchanges[: len(lines) * 7]:
        whole.feed(json.loads(line))
        dropping.feed(json.loads(line))
    assert dropping.drop_oldest(keep=10) == 7 * len(EXPECTED) - 1 - 10
    assert dropping.finish() == whole.finish()[-11:]
    # A call dropped before its result came: the result is not shown alone either.
    (result,) = [line for line in exchanges[: len(lines)] if '"tool_result"' in line]
    builder = HistoryBuilder()
    for line in exchanges[: len(lines)]:
        if line is not result:
            builder.feed(json.loads(line))
    assert "t0_" in str(list(builder.tools))  # the call waits for its result
    for line in exchanges[len(lines) : len(lines) * 7]:
        builder.feed(json.loads(line))
    builder.drop_oldest(keep=10)
    assert builder.tools == {}  # the dropped call's draft is not held (memory)
    assert [tool_id[:3] for tool_id in builder.dropped_calls] == ["t0_"]
    builder.feed(json.loads(result))
    assert [(d.kind, d.text) for d in builder.finish()][-4:] == [
        (kind, text.replace("Bob", "Bob 6")) for kind, text in EXPECTED
    ]
    assert builder.tools == {} and builder.dropped_calls == set()


def test_a_message_the_mapper_never_opens_holds_no_place(real_transcript: Path) -> None:
    # Found by a hostile review: its place stayed taken, so nothing could be dropped past it
    # (one bad line first, and a 32 MiB import peaked at 290 MB again).
    builder = HistoryBuilder()
    malformed = {"type": "assistant", "message": {"id": "bad", "content": 7}}
    with pytest.raises(Exception):  # noqa: B017 - whatever the mapper raises: read_history skips it
        builder.feed(malformed)
    subagents = {
        "type": "assistant",
        "parent_tool_use_id": "toolu_x",
        "message": {
            "id": "sub",
            "role": "assistant",
            "model": "m",
            "content": [{"type": "text", "text": "hi"}],
        },
    }
    builder.feed(subagents)
    assert builder.starts == {}
    lines = real_transcript.read_text().splitlines()
    for n in range(5):
        for line in lines:
            builder.feed(json.loads(line.replace("msg_", f"msg{n}_").replace("toolu_", f"t{n}_")))
    assert builder.drop_oldest(keep=4) == 5 * len(EXPECTED) - 1 - 4  # (the last is not placed)


def test_a_transcript_written_meanwhile_is_read_as_it_was(real_transcript: Path) -> None:
    # Found by a hostile review: the import read to the end of a file that kept growing (the
    # relay reached 24 GB and the kernel killed it). It reads what the file held when it began.
    first = real_transcript.read_bytes()
    stop = threading.Event()

    def grow() -> None:
        with real_transcript.open("ab") as file:
            while not stop.is_set() and file.tell() < 2 << 30:
                file.write(first)
                file.flush()

    writer = threading.Thread(target=grow, daemon=True)
    writer.start()
    try:
        while real_transcript.stat().st_size < 4 * len(first):
            time.sleep(0.001)
        history = read_history(real_transcript)
        growing = writer.is_alive()  # it never stopped by itself: the import did not wait
    finally:
        stop.set()
        writer.join()
    assert growing
    assert 4 <= len([d for d in history.entries if d.kind == "user"]) < 1 << 20


def test_a_tool_call_without_its_result_is_shown_ended(real_transcript: Path) -> None:
    lines = real_transcript.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if b'"tool_result"' not in line]
    real_transcript.write_bytes(b"".join(kept))
    (tool,) = [d for d in read_history(real_transcript).entries if d.kind == "activity"]
    assert (tool.state, tool.data["output"]) == ("done", NO_RESULT)


def test_a_renamed_session_is_listed_by_its_name(
    live: LiveRelay, config: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "data" / "work"
    terminal(workspace, "first prompt")
    (transcript,) = (config / "projects").glob("*/*.jsonl")
    with transcript.open("a") as file:  # what /rename appends in an interactive session
        record = {
            "type": "custom-title",
            "customTitle": "Renamed <i>here</i>",
            "sessionId": transcript.stem,
        }
        file.write(json.dumps(record) + "\n")
    assert only_session(live, workspace)["title"] == "Renamed <i>here</i>"
    bad = live.http.post(
        f"/api/claude-sessions/{transcript.stem}/import", json={"permission_mode": "yolo"}
    )
    assert bad.status_code == 422
    assert live.http.get("/api/conversations").json()["conversations"] == []
    response = live.http.post(
        f"/api/claude-sessions/{transcript.stem}/import", json={"permission_mode": "acceptEdits"}
    )
    assert response.status_code == 201, response.text
    conversation = response.json()
    assert conversation["title"] == "Renamed <i>here</i>"
    assert conversation["permission_mode"] == "acceptEdits"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain <b>text</b>", [("user", "plain <b>text</b>")]),
        ("<system-reminder>x</system-reminder>\nhi", [("user", "hi")]),
        ("<system-reminder>only a reminder</system-reminder>", []),
        ("[Request interrupted by user for tool use]", [("line", "Interrupted by the user.")]),
        (
            "<command-name>/model</command-name>\n<command-message>model</command-message>\n"
            "<command-args>opus</command-args>",
            [("user", "/model opus")],
        ),
        ("<bash-input>ls -l</bash-input>", [("user", "! ls -l")]),
        ("<bash-stdout>a.txt</bash-stdout><bash-stderr></bash-stderr>", [("line", "a.txt")]),
        ("<local-command-stdout></local-command-stdout>", []),
    ],
)
def test_what_a_user_record_shows_as(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(d.kind, d.text) for d in user_drafts(text)] == expected


def test_a_compacted_session_shows_its_compaction(
    live: LiveRelay, config: Path, fake: FakeAnthropic, tmp_path: Path
) -> None:
    workspace = tmp_path / "data" / "work"
    terminal(workspace, "remember the word kumquat")
    (transcript,) = (config / "projects").glob("*/*.jsonl")
    terminal(workspace, "/compact", "--resume", transcript.stem)
    response = import_session(live, transcript.stem)
    assert response.status_code == 201, response.text
    view = live.get(response.json()["id"])
    kinds = [(e["kind"], e["text"]) for e in view["timeline"][1:]]
    assert kinds[:2] == [
        ("user", "remember the word kumquat"),
        ("agent", "You said: remember the word kumquat"),
    ]
    (compaction,) = [e for e in view["timeline"] if e["data"].get("type") == "compaction"]
    assert compaction["kind"] == "line"
    assert compaction["text"].startswith("Context compacted · ")
    assert compaction["data"]["trigger"] == "manual"
    # Its details as a live line's (found by a review: "Took —", "The agent reported no
    # summary"): the CLI's own summary, word for word, and how long it took.
    records = [json.loads(line) for line in transcript.read_text().splitlines()]
    (summary,) = [r for r in records if r.get("isCompactSummary")]
    (boundary,) = [r for r in records if r.get("subtype") == "compact_boundary"]
    assert compaction["data"]["summary"] == summary["message"]["content"]
    assert "FAKE SUMMARY" in compaction["data"]["summary"]
    assert compaction["data"]["duration_ms"] == boundary["compactMetadata"]["durationMs"]
    # The CLI's summary message is not shown as the user's; the command is.
    assert not any("continued from a previous conversation" in t for _, t in kinds)
    # In the terminal's order (a review: the line came first, then the command, then the
    # CLI's "Compacted (ctrl+o to see full summary)"): the command, then its line.
    at = kinds.index(("user", "/compact"))
    assert kinds[at + 1] == ("line", compaction["text"]), kinds
    assert not any(t.startswith("Compacted (") for _, t in kinds), kinds
    # Resumed after the compaction: the model gets the summary, not the whole history.
    assert live.send(view["id"], "next").status_code == 202
    live.wait_idle(view["id"], timeout=TIMEOUT)
    sent = json.dumps(fake.message_bodies()[-1]["messages"])
    assert "FAKE SUMMARY" in sent


def test_made_up_replies_are_not_errors_but_api_errors_are(real_transcript: Path) -> None:
    def synthetic(text: str) -> str:
        message = {"id": text, "model": "<synthetic>", "role": "assistant", "type": "message"}
        message["content"] = [{"type": "text", "text": text}]
        return json.dumps({"type": "assistant", "message": message, "uuid": text}) + "\n"

    with real_transcript.open("a") as file:
        file.write(synthetic("No response requested."))
        file.write(synthetic("API Error: 500 the fake broke"))
    history = read_history(real_transcript)
    assert [(d.kind, d.text) for d in history.entries] == [
        *EXPECTED,
        ("line", "API Error: 500 the fake broke"),
    ]
    assert history.entries[-1].data["level"] == "error"
