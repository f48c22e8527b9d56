"""Backups at thresholds through the whole relay (SPEC §6).

The real Claude Code CLI against the fake Messages API (its usage is what the CLI believes of
its context), the SDK engine against the fake OpenAI server, and the demo agent. Assertions are
on the files the relay wrote and on what its API and timeline say about them.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backups import first_message
from tests import test_claude_relay as claude_relay
from tests.fake_anthropic import FakeAnthropic
from tests.fake_openai import FakeOpenAI
from tests.relay import LiveRelay, make_settings
from tests.test_claude_relay import StartRelay, is_summary_request

# The real CLI's fixtures: the fake Messages API, a fresh HOME, relays on tmp_path.
start = claude_relay.start

TIMEOUT = 60


def backups(live: LiveRelay, cid: int) -> list[dict[str, Any]]:
    response = live.http.get(f"/api/conversations/{cid}/backups")
    assert response.status_code == 200, response.text
    return list(response.json()["backups"])


def wait_backups(live: LiveRelay, cid: int, count: int) -> list[dict[str, Any]]:
    """Poll until the conversation has count backups (they are written off the turn's path)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        found = backups(live, cid)
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"backups never reached {count}: {json.dumps(found)}")
        time.sleep(0.05)


def markdown(live: LiveRelay, cid: int, name: str) -> str:
    response = live.http.get(f"/api/conversations/{cid}/backups/{name}")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/markdown; charset=utf-8"
    return response.text


def section(text: str, title: str) -> list[str]:
    """The lines of one `## title` section of a backup."""
    return text.split(f"## {title}\n\n")[1].split("\n\n")[0].splitlines()


def turn(live: LiveRelay, cid: int, text: str) -> dict[str, Any]:
    assert live.send(cid, text).status_code == 202
    return live.wait_idle(cid, timeout=TIMEOUT)


def test_claude_cli_backups_at_50k_60k_and_before_its_compaction(
    start: StartRelay, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000")  # compacts from 67k
    live = start()
    workspace = live.settings.cwd_default
    cid = live.create(provider="claude", title="Backups", permission_mode="acceptEdits")["id"]
    notes = workspace / "notes.txt"
    fake.input_tokens = 50_000
    turn(live, cid, f"write the notes [[WRITE:{notes}|first draft]]")
    assert notes.read_text() == "first draft"  # the CLI really wrote it
    wait_backups(live, cid, 1)
    fake.input_tokens = 60_000
    turn(live, cid, "turn 2")
    wait_backups(live, cid, 2)
    fake.input_tokens = 70_000
    turn(live, cid, "turn 3")
    wait_backups(live, cid, 3)
    fake.input_tokens = 20_000  # what the context is after the compaction
    view = turn(live, cid, "turn 4")  # the CLI compacts first: 70k is past 67k
    assert any(is_summary_request(body) for body in fake.message_bodies())
    found = wait_backups(live, cid, 4)
    assert [b["trigger"] for b in reversed(found)] == [
        "tokens_50k",
        "tokens_60k_update",
        "tokens_70k_update",
        "precompact_auto",
    ]
    assert [b["n"] for b in found] == [4, 3, 2, 1]
    assert [b["context_remaining"] for b in reversed(found)] == ["50.0%", "40.0%", "30.0%", "30.0%"]
    names = [b["name"] for b in reversed(found)]
    assert all(name.startswith(f"{n}-backup-") for n, name in enumerate(names, 1))

    # The compaction line links the backup written for it, from the timeline before it.
    (line,) = [e for e in view["timeline"] if e["data"].get("type") == "compaction"]
    assert line["text"].startswith("Context compacted · 70k → ")
    assert line["data"]["backup"] == names[3]
    before = markdown(live, cid, names[3])
    assert "**Conversation:** Backups (#1)\n" in before
    assert f"**Session ID:** {view['session_id']}\n" in before
    assert section(before, "User Requests") == [
        f"- write the notes [[WRITE:{notes}|first draft]]",
        "- turn 2",
        "- turn 3",
        "- turn 4",
    ]
    assert section(before, "Files Modified") == [f"- {notes}"]  # the real Write tool call
    replies = section(before, "Key Replies")
    assert replies[1].startswith(f"- The tool returned: File created successfully at: {notes}")
    assert replies[:1] + replies[2:] == [
        "- I will write the file.",
        "- You said: turn 2",
        "- You said: turn 3",
    ]  # not the reply of turn 4: it came after the compaction
    assert view["backup"] == names[3]  # the header's link
    # A threshold's backup holds the reply whose figure fired it (a review: it stopped one
    # reply short, the newest, the one the seed keeps backups for).
    assert section(markdown(live, cid, names[1]), "Key Replies")[-1] == "- You said: turn 2"

    # Both rails start over after the compaction: the next backup is tokens_50k again.
    fake.input_tokens = 55_000
    turn(live, cid, "turn 5")
    newest = wait_backups(live, cid, 5)[0]
    assert (newest["n"], newest["trigger"]) == (5, "tokens_50k")

    folder = live.settings.resolved_data_dir / "backups" / str(cid)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(folder / b["name"]).st_mode) for b in found} == {0o600}


def test_claude_backups_are_not_fired_again_after_a_relay_restart(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = live.create(provider="claude")["id"]
    fake.input_tokens = 52_000
    turn(live, cid, "turn 1")
    assert [b["trigger"] for b in wait_backups(live, cid, 1)] == ["tokens_50k"]
    live.stop()
    live = start()
    turn(live, cid, "turn 2")  # the same 52k: no new backup, the rails came back from disk
    fake.input_tokens = 62_000
    turn(live, cid, "turn 3")
    found = wait_backups(live, cid, 2)
    assert [b["trigger"] for b in found] == ["tokens_60k_update", "tokens_50k"]


def test_manual_compact_writes_precompact_manual_before_archiving(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live = start()
    cid = live.create(provider="claude", title="Manual")["id"]
    fake.input_tokens = 1_000
    turn(live, cid, "remember 42")
    new = live.send(cid, "/compact").json()["compacted_into"]
    (only,) = wait_backups(live, cid, 1)
    assert only["trigger"] == "precompact_manual"
    assert only["context_remaining"] == "99.9%"  # 1k of the model's 1M window
    assert live.get(cid)["status"] == "archived"
    text = markdown(live, cid, only["name"])
    assert section(text, "User Requests") == ["- remember 42"]
    assert section(text, "Key Replies") == ["- You said: remember 42"]
    assert backups(live, new["id"]) == []


def test_start_fresh_from_a_backup_sends_it_first(start: StartRelay, fake: FakeAnthropic) -> None:
    live = start()
    cid = live.create(provider="claude", title="Fresh")["id"]
    fake.input_tokens = 51_000
    turn(live, cid, "the first request")
    (backup,) = wait_backups(live, cid, 1)
    name = backup["name"]
    text = markdown(live, cid, name)
    response = live.http.post(f"/api/conversations/{cid}/backups/{name}/fresh")
    assert response.status_code == 201, response.text
    new = response.json()["compacted_into"]
    assert (new["title"], new["compacted_from_id"]) == ("Fresh (compacted)", cid)
    old = live.get(cid)
    assert (old["status"], old["compacted_into_id"]) == ("archived", new["id"])
    fake.input_tokens = 1_000
    turn(live, new["id"], "carry on")
    last = [m for m in fake.message_bodies()[-1]["messages"] if m["role"] == "user"][-1]
    content = last["content"]
    texts = [content] if isinstance(content, str) else [b.get("text", "") for b in content]
    assert first_message(name, text, "carry on") in texts
    assert first_message(name, text, "carry on") == (
        f"[Carry-over context from backup {name}]\n{text.rstrip()}\n\n[New user request]\ncarry on"
    )
    assert [e["text"] for e in live.get(new["id"])["timeline"] if e["kind"] == "user"] == [
        "carry on"
    ]
    # An archived conversation cannot start fresh again; an unknown backup is a 404.
    again = live.http.post(f"/api/conversations/{cid}/backups/{name}/fresh")
    assert again.status_code == 409
    missing = live.http.post(
        f"/api/conversations/{new['id']}/backups/1-backup-1st-Jan-2026-1-00am.md/fresh"
    )
    assert missing.status_code == 404
    assert live.get(new["id"])["status"] == "active"


# The demo agent: a failed write is one line, never a failed turn ------------------------------


def test_demo_failed_write_is_one_warning_line(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    (tmp_path / "data" / "backups").write_text("a file where the backups directory goes")
    live = LiveRelay(settings).start()
    try:
        cid = live.create(title="Broken disk")["id"]
        for n in range(1, 5):  # the demo reaches 57k on turn 4: one backup, one failure
            turn(live, cid, f"turn {n}")
        view = live.wait_for(
            cid, lambda v: any(e["kind"] == "line" for e in v["timeline"]), timeout=TIMEOUT
        )
        lines = [e for e in view["timeline"] if e["kind"] == "line"]
        assert len(lines) == 1
        assert lines[0]["data"] == {"level": "warning", "type": "backup", "trigger": "tokens_50k"}
        assert lines[0]["text"].startswith("The backup (tokens_50k) could not be written: ")
        agents = [e for e in view["timeline"] if e["kind"] == "agent"]
        assert [e["state"] for e in agents] == ["done"] * 4  # every turn went through
        assert view["backup"] is None
    finally:
        live.stop()


def test_demo_compaction_links_its_backup(tmp_path: Path) -> None:
    live = LiveRelay(make_settings(tmp_path / "data")).start()
    try:
        cid = live.create(title="Demo")["id"]
        live.http.patch(f"/api/conversations/{cid}", json={"auto_compact_window": 100_000})
        for n in range(1, 7):  # 67k passes on turn 5: turn 6 compacts first
            turn(live, cid, f"turn {n}")
        found = wait_backups(live, cid, 4)
        assert [b["trigger"] for b in reversed(found)] == [
            "free_30pct",  # 45k of a 100k window: 22 % free
            "tokens_50k",
            "tokens_60k_update",
            "precompact_auto",
        ]
        view = live.get(cid)
        (line,) = [e for e in view["timeline"] if e["data"].get("type") == "compaction"]
        assert line["data"]["backup"] == found[0]["name"]
    finally:
        live.stop()


# The SDK engine -------------------------------------------------------------------------------


def compaction_of(view: dict[str, Any]) -> dict[str, Any]:
    """The one compaction entry of a timeline."""
    (entry,) = [e for e in view["timeline"] if e["data"].get("type") == "compaction"]
    return entry


@pytest.fixture
def openai_fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def test_sdk_engine_threshold_compaction_leaves_precompact_auto(
    cli: str,
    openai_fake: FakeOpenAI,
    shared_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", str(shared_home))
    settings = make_settings(
        tmp_path / "data",
        copilot_cli=cli,
        openai_base_url=openai_fake.base_url,
        openai_api_key="sk-test",
        openai_model="gpt-4.1",
    )
    live = LiveRelay(settings).start()
    try:
        cid = live.create(provider="openai", title="Engine", permission_mode="bypassPermissions")[
            "id"
        ]
        target = settings.cwd_default / "engine.txt"
        arguments = json.dumps({"path": str(target), "file_text": "from the engine"})
        turn(live, cid, f"make the file [[TOOL:create {arguments}]]")
        openai_fake.prompt_tokens = 120_000  # of the 128k limit: past the engine's threshold
        for text in ("turn two", "turn three"):
            turn(live, cid, text)
        # The engine counts its context itself (far below the fake's 120k): no threshold
        # backup, but the one written as the engine started compacting.
        (auto,) = wait_backups(live, cid, 1)
        assert auto["trigger"] == "precompact_auto"
        view = live.wait_for(cid, lambda v: compaction_of(v)["data"].get("backup"), TIMEOUT)
        assert compaction_of(view)["data"]["backup"] == auto["name"]
        assert compaction_of(view)["text"].startswith("Context compacted (removed ")
        text = markdown(live, cid, auto["name"])
        assert section(text, "User Requests") == [
            f"- make the file [[TOOL:create {arguments}]]",
            "- turn two",
            "- turn three",
        ]
        assert target.read_text() == "from the engine"  # the engine's create tool ran
        assert section(text, "Files Modified") == [f"- {target}"]
    finally:
        live.stop()


def test_backup_names_outside_the_pattern_are_refused(tmp_path: Path) -> None:
    live = LiveRelay(make_settings(tmp_path / "data")).start()
    try:
        cid = live.create(title="Names")["id"]
        for n in range(1, 5):  # a real backup in the folder (tokens_50k on turn 4)
            turn(live, cid, f"turn {n}")
        (backup,) = wait_backups(live, cid, 1)
        (tmp_path / "data" / "secret.md").write_text("not a backup")
        base = f"/api/conversations/{cid}/backups"
        asked = {
            "..%2F..%2Fsecret.md": live.http.get(f"{base}/..%2F..%2Fsecret.md"),
            "rails.json": live.http.get(f"{base}/rails.json"),
            "unknown": live.http.get(f"{base}/9-backup-1st-Jan-2026-1-00am.md"),
            "other conversation": live.http.get(f"/api/conversations/999/backups/{backup['name']}"),
        }
        assert {name: r.status_code for name, r in asked.items()} == {
            "..%2F..%2Fsecret.md": 404,
            "rails.json": 422,
            "unknown": 404,
            "other conversation": 404,
        }
        assert all("detail" in r.json() for r in asked.values())
        fresh = live.http.post(f"{base}/rails.json/fresh")
        assert fresh.status_code == 422
        assert live.get(cid)["status"] == "active"
    finally:
        live.stop()
