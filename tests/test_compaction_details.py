"""The details a compaction line keeps (README: "What each compaction did").

The real `claude` CLI against the fake Messages API compacts on its own; the relay stores on
the line the tokens before and after, how long it took, the backup written just before it,
and the summary the CLI wrote into its session transcript.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.agents.transcript import compaction_summary, config_dir, summary_after
from app.compaction import SUMMARY_LIMIT, clip_summary
from tests.fake_anthropic import FakeAnthropic
from tests.relay import LiveRelay, make_settings

TIMEOUT = 60
HOSTILE = '<img src=x onerror="alert(1)"> <b>bold?</b> & done'


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path) -> Iterator[LiveRelay]:
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000")
    with LiveRelay(make_settings(tmp_path / "data")) as relay:
        yield relay


def compaction_lines(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        e for e in view["timeline"] if e["kind"] == "line" and e["data"].get("type") == "compaction"
    ]


def wait_line(live: LiveRelay, cid: int, *keys: str) -> dict[str, Any]:
    """Poll until the compaction line holds these data keys (the summary and backup come later)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        lines = compaction_lines(live.get(cid))
        if lines and all(key in lines[0]["data"] for key in keys):
            return lines[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"the compaction line never held {keys}: {lines}")
        time.sleep(0.1)


def compact_summary_records(home: Path) -> list[dict[str, Any]]:
    """The summary messages the CLI wrote into its transcripts (isCompactSummary)."""
    found = []
    for path in (config_dir({"HOME": str(home)}) / "projects").glob("*/*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("isCompactSummary"):
                found.append(record)
    return found


def backups(live: LiveRelay, cid: int) -> list[dict[str, Any]]:
    response = live.http.get(f"/api/conversations/{cid}/backups")
    assert response.status_code == 200, response.text
    return list(response.json()["backups"])


def test_claude_auto_compaction_keeps_numbers_time_backup_and_summary(
    live: LiveRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    fake.input_tokens = 70_000
    fake.summary_text = HOSTILE
    fake.summary_delay = 1.0  # the compaction takes at least this long
    cid = live.create(provider="claude")["id"]
    for text in ("turn 1", "turn 2", "turn 3"):  # turn 3 compacts (PROTOCOL.md §2.2)
        assert live.send(cid, text).status_code == 202
        live.wait_idle(cid, timeout=TIMEOUT)

    line = wait_line(live, cid, "summary", "backup")
    data = line["data"]
    assert line["state"] == "done"
    assert 70_000 <= data["pre_tokens"] <= 70_100
    assert 0 < data["post_tokens"] < 10_000
    assert line["text"].startswith("Context compacted · 70k → ")
    # From the first sign (status "compacting") to the boundary, as the relay timed it.
    assert data["duration_ms"] >= 1000
    # The backup written just before it: the newest precompact_auto backup (turn 2's failed
    # attempt wrote one too, and its line vanished with it).
    auto = [b for b in backups(live, cid) if b["trigger"] == "precompact_auto"]
    assert [b["n"] for b in auto] == [3, 2]  # after tokens_50k
    assert data["backup"] == auto[0]["name"]
    # The summary is the CLI's own summary message, word for word from its transcript.
    (record,) = compact_summary_records(tmp_path / "home")
    assert data["summary"] == record["message"]["content"]
    assert f"Summary:\n{HOSTILE}\n" in data["summary"]


def test_summary_is_the_one_after_its_own_boundary(tmp_path: Path) -> None:
    transcript = [
        {"type": "user", "uuid": "u1", "parentUuid": None, "message": {"content": "hi"}},
        {"type": "system", "subtype": "compact_boundary", "uuid": "b1", "parentUuid": None},
        {"type": "attachment", "uuid": "a1", "parentUuid": "b1"},
        {
            "type": "user",
            "uuid": "s1",
            "parentUuid": "a1",
            "isCompactSummary": True,
            "message": {"content": [{"type": "text", "text": "first summary"}]},
        },
        {
            "type": "system",
            "subtype": "compact_boundary",
            "uuid": "b2",
            "parentUuid": None,
            "compactMetadata": {"preservedSegment": {"anchorUuid": "s2"}},
        },
        # Not the anchor the boundary names, though it descends from it: not taken.
        {
            "type": "user",
            "uuid": "x",
            "parentUuid": "b2",
            "isCompactSummary": True,
            "message": {"content": "not this one"},
        },
        {
            "type": "user",
            "uuid": "s2",
            "parentUuid": "zz",
            "isCompactSummary": True,
            "message": {"content": "second summary"},
        },
    ]
    lines = [json.dumps(r) for r in transcript]
    assert summary_after(iter(lines), "b1") == "first summary"
    assert summary_after(iter(lines), "b2") == "second summary"
    assert summary_after(iter(lines), "nope") is None
    assert summary_after(iter(lines[:3]), "b1") is None  # not written yet
    # A boundary followed by the next compaction before any summary: none for it.
    assert summary_after(iter([lines[1], lines[4], lines[6]]), "b1") is None
    # A summary that does not descend from the boundary is not guessed to be its.
    stray = {**transcript[3], "parentUuid": "elsewhere"}
    assert summary_after(iter([lines[1], json.dumps(stray)]), "b1") is None

    env = {"HOME": str(tmp_path)}
    folder = config_dir(env) / "projects" / "-work"
    folder.mkdir(parents=True)
    (folder / "sess.jsonl").write_text("\n".join(["not json", *lines]) + "\n")
    assert compaction_summary(env, "sess", "b2") == "second summary"
    assert compaction_summary(env, "other", "b2") is None


def test_clip_summary_keeps_short_ones_whole() -> None:
    assert clip_summary("short") == "short"
    clipped = clip_summary("x" * (SUMMARY_LIMIT + 5))
    assert len(clipped) == SUMMARY_LIMIT and clipped.endswith("x…")
