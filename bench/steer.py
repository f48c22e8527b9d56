"""Steering: the /compact preview of a 100,000-entry conversation vs a 100-entry one.

    python -m bench steer [--repeat 300]

Two databases seeded with SQL (one conversation each: user messages, Markdown agent replies,
tool calls, notices), three messages pinned in each and the message count set as migration
0006 sets it; each served by its own relay in a child process. GET
/api/conversations/1/compact (the confirmation's preview: the carry-over, the pins, what is
left out) alternates between them; the figure is the ratio of the medians. The preview reads
the last 24 messages, the pins and one stored count: never the whole conversation.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from bench.common import STAMP, Relay, Row, few_against_many, growth_row, seed

COMMAND = "python -m bench steer"
FEW, MANY = 100, 100_000
PINS = 3


def prepare(path: Path) -> None:
    """Count the messages (as migration 0006 does) and pin the first PINS user messages."""
    db = sqlite3.connect(path)
    with db:
        db.execute(
            "UPDATE conversation SET message_count = (SELECT count(*) FROM entry"
            " WHERE entry.conversation_id = conversation.id"
            " AND entry.kind IN ('user', 'agent') AND entry.state != 'queued')"
        )
        rows = db.execute(
            "SELECT id, seq, text FROM entry WHERE conversation_id = 1 AND kind = 'user'"
            " ORDER BY seq LIMIT ?",
            (PINS,),
        ).fetchall()
        db.executemany(
            "INSERT INTO pin (conversation_id, entry_id, source_id, source_seq, role, text,"
            " created_at) VALUES (1, ?, 1, ?, 'user', ?, ?)",
            [(entry_id, seq, text, STAMP) for entry_id, seq, text in rows],
        )
    db.close()


def previewer(relay: Relay, older: int) -> Callable[[], None]:
    """GET the /compact preview and check what it says is left out."""

    def preview() -> None:
        status, body = relay.http.request("GET", "/api/conversations/1/compact")
        assert status == 200 and body["left_out"]["older"] == older, (status, body)
        assert body["summary"].split("\n")[1] == "Pinned:", body["summary"]

    return preview


def prepared(path: Path, count: int) -> None:
    """One conversation of `count` entries, with its pins and message count."""
    seed(path, 1, count)
    prepare(path)


def run(repeat: int = 300, few: int = FEW, many: int = MANY) -> list[Row]:
    """Measure and return the table's row (sizes smaller for a smoke test)."""
    # Half the entries are messages; 24 are in the window, the pinned older ones are carried.
    times = few_against_many(
        "oarlock-steer-",
        (few, many),
        prepared,
        lambda relay, count: previewer(relay, count // 2 - 24 - PINS),
        repeat,
    )
    measure = f"/compact preview (GET /api/conversations/{{id}}/compact, {PINS} pins)"
    return [growth_row(measure, (few, many), "entries", times, repeat, COMMAND)]
