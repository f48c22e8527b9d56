"""Transcripts a hostile review wrote by hand (session 22): each once froze the relay, failed
the import list for every session, or imported a conversation that could not be opened."""

# ruff: noqa: F811 - the fixtures config and live come from test_import (imported below)

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.agents.transcript import project_slug
from app.imports import _tag, _without_tag, user_drafts
from tests.relay import LiveRelay
from tests.test_import import config, import_session, live, sessions  # noqa: F401 - fixtures


def user(text: Any) -> dict[str, Any]:
    return {"type": "user", "message": {"role": "user", "content": text}}


def assistant(message_id: str, *blocks: dict[str, Any], **usage: Any) -> dict[str, Any]:
    message = {"id": message_id, "role": "assistant", "model": "claude-test", "content": blocks}
    if usage:
        message["usage"] = usage
    return {"type": "assistant", "message": message}


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


def write(config: Path, cwd: Path, *records: dict[str, Any], raw: str = "") -> str:
    """A transcript as the CLI would leave it (each record stamped with cwd and ids); raw: a
    line written as is, first."""
    cwd.mkdir(parents=True, exist_ok=True)
    session_id = str(uuid.uuid4())
    folder = config / "projects" / project_slug(str(cwd))
    folder.mkdir(parents=True, exist_ok=True)
    lines = [raw] if raw else []
    for record in records:
        stamp = {"cwd": str(cwd), "sessionId": session_id, "uuid": str(uuid.uuid4())}
        lines.append(json.dumps(stamp | record))  # a lone surrogate goes out as "\udc80"
    (folder / f"{session_id}.jsonl").write_text("\n".join(lines) + "\n")
    return session_id


def imported(live: LiveRelay, session_id: str) -> dict[str, Any]:
    response = import_session(live, session_id)
    assert response.status_code == 201, response.text
    view = live.http.get(f"/api/conversations/{response.json()['id']}")
    assert view.status_code == 200, view.text
    return view.json()


def test_half_an_emoji_is_stored_as_a_replacement_and_the_conversation_opens(
    live: LiveRelay, config: Path, home: Path
) -> None:
    # Before: imported (201), then every GET of it a 500 and every subscribe a dropped socket.
    cwd = Path(live.settings.data_dir) / "work"
    session_id = write(
        config,
        cwd,
        {"type": "custom-title", "customTitle": "half \ud800 title"},
        user("cut \udc80 here"),
        assistant(
            "a1",
            text("run it"),
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "echo \ud83d"}},
        ),
        user([{"type": "tool_result", "tool_use_id": "t1", "content": "bad \udc80 out"}]),
        assistant("a2", text("whole: \ud83d\ude00")),
    )
    view = imported(live, session_id)
    assert view["title"] == "half \ufffd title"
    timeline = [(e["kind"], e["text"]) for e in view["timeline"] if e["kind"] != "line"]
    assert timeline == [
        ("user", "cut \ufffd here"),
        ("agent", "run it"),
        ("activity", "echo \ufffd"),
        ("agent", "whole: 😀"),
    ]
    assert view["timeline"][3]["data"]["output"] == "bad \ufffd out"
    with live.socket() as ws:
        ws.send(json.dumps({"type": "subscribe", "conversation_id": view["id"]}))
        assert json.loads(ws.recv(timeout=10))["type"] in ("hello", "snapshot", "subscribed")


def test_one_bad_transcript_leaves_the_list_of_the_others(
    live: LiveRelay, config: Path, home: Path
) -> None:
    root = Path(live.settings.data_dir)
    good = write(config, root / "good", user("a good session"))
    nul_cwd = write(config, root / "nul", user("x"))
    path = next((config / "projects").glob(f"*/{nul_cwd}.jsonl"))
    path.write_text(path.read_text().replace('/nul"', '/nul\\u0000x"'))
    write(config, root / "nested", user("y"), raw="[" * 50_000 + "]" * 50_000)
    surrogate = write(config, root / "half", user("half \udc80 a prompt"))
    invisible = write(config, root / "invisible", {"type": "custom-title", "customTitle": "\u200b"})
    fifo = str(uuid.uuid4())
    os.mkfifo(next((config / "projects").glob(f"*/{good}.jsonl")).parent / f"{fifo}.jsonl")
    # Before: a 500 for the NUL (the cwd read), then for the half emoji (the answer's encoding).
    listed = {s["session_id"]: s["title"] for s in sessions(live)["sessions"]}
    assert listed[good] == "a good session"
    assert listed[surrogate] == "half \ufffd a prompt"
    assert listed[invisible] == "(no prompt)"
    assert nul_cwd not in listed
    # Before: the list's read of a FIFO never ended; nor did an import's.
    assert fifo not in listed
    assert import_session(live, fifo).status_code == 404


def test_odd_figures_and_numbers_that_are_not_json_import(
    live: LiveRelay, config: Path, home: Path
) -> None:
    cwd = Path(live.settings.data_dir) / "odd"
    boundary = {"type": "system", "subtype": "compact_boundary"}
    session_id = write(
        config,
        cwd,
        user("hello"),
        assistant("a1", text("huge"), input_tokens=10**30, output_tokens=1),
        assistant("a2", text("odd model"), input_tokens=5, output_tokens=1) | {},
        boundary | {"compactMetadata": {"trigger": float("nan"), "preTokens": 5}},
    )
    path = next((config / "projects").glob(f"*/{session_id}.jsonl"))
    path.write_text(path.read_text().replace('"claude-test"', '{"a": 1}', 1))
    view = imported(live, session_id)  # before: 500 (an int SQLite cannot hold; a dict model)
    assert view["context_tokens"] == 5  # the figure a column takes (the huge one left out)
    export = live.http.get(f"/api/conversations/{view['id']}/export", params={"format": "jsonl"})

    def refuse(constant: str) -> Any:
        raise AssertionError(f"not JSON: {constant}")

    # Before: the NaN went out as NaN, which no JSON parser takes.
    lines = [json.loads(line, parse_constant=refuse) for line in export.text.splitlines()]
    (compaction,) = [
        e for e in lines if e["type"] == "entry" and e["data"].get("type") == "compaction"
    ]
    assert compaction.get("trigger") is None, compaction


def test_an_imported_conversation_counts_its_messages(
    live: LiveRelay, config: Path, home: Path
) -> None:
    records = []
    for n in range(15):
        records += [user(f"question {n}"), assistant(f"a{n}", text(f"answer {n}"))]
    view = imported(live, write(config, Path(live.settings.data_dir) / "long", *records))
    preview = live.http.get(f"/api/conversations/{view['id']}/compact").json()
    # 30 messages: the last 24 read, 16 carried, the newest 8 and the 6 before the 24 left out.
    # Before: "Left out: the 8 newest messages." (the stored count was 0).
    assert preview["left_out"]["older"] == 6
    assert preview["left_out"]["text"] == "Left out: the 8 newest messages and 6 older ones."


def test_messages_without_a_prompt_between_them_keep_their_order(
    live: LiveRelay, config: Path, home: Path
) -> None:
    call = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "echo c"}}
    session_id = write(
        config,
        Path(live.settings.data_dir) / "order",
        user("go"),
        assistant("A", text("A")),
        assistant("B", text("B")),
        assistant("C", text("C"), call),
        assistant("D", text("D")),
        user([{"type": "tool_result", "tool_use_id": "t1", "content": "c"}]),
    )
    view = imported(live, session_id)
    # Before: B, C, A, D (each start was taken before the message before it went in).
    assert [e["text"] for e in view["timeline"] if e["kind"] != "line"] == [
        "go",
        "A",
        "B",
        "C",
        "echo c",
        "D",
    ]


# The tags: found in one pass, as the regular expressions they replaced found them ---------------

PIECES = ["<a>", "</a>", "<b>", "</b>", "x", "<", ">", "/", "a", "\n"]


@given(st.lists(st.sampled_from(PIECES), max_size=30).map("".join))
def test_tags_are_found_as_the_regular_expressions_found_them(text: str) -> None:
    found = re.search(r"<a>(.*?)</a>", text, re.DOTALL)
    assert _tag("a", text) == (found[1] if found else None)
    assert _without_tag("a", text) == re.sub(r"<a>.*?</a>", "", text, flags=re.DOTALL)


@pytest.mark.parametrize("name", ["system-reminder", "command-name", "bash-input"])
def test_a_prompt_of_many_unclosed_tags_is_read_in_one_pass(name: str) -> None:
    # Before: 8,000 unclosed tags took 13 s (quadratic), holding the GIL: the relay stood still.
    # 100,000 would have taken over half an hour (quadratic, extrapolated); one pass, a moment.
    prompt = f"<{name}>" * 100_000 + "end"
    answer: list[Any] = []
    reader = threading.Thread(target=lambda: answer.append(user_drafts(prompt)), daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "still reading after 60 s"
    assert [(d.kind, d.text) for d in answer[0]] == [("user", prompt)]
