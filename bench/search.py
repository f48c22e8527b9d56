"""Search: a search for a word of a few messages with 100,000 entries vs 100.

    python -m bench search [--repeat 300]

Two databases seeded with SQL (conversations of 100 entries: user messages, Markdown agent
replies, tool calls, notices; the FTS5 index filled by its triggers), the same 5 messages in
each holding the word searched for; each served by its own relay in a child process.
GET /api/search?q=flush kestr (as the search box asks while the user types: a word of half
the messages, and the last word as a prefix, 20 hits at most) alternates between them; the
figure is the ratio of the medians.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from bench.common import Relay, Row, few_against_many, growth_row, seed

COMMAND = "python -m bench search"
FEW, MANY = 100, 100_000
PER_CONVERSATION = 100
HITS = 5
WORD = "kestrel"
QUERY = "flush kestr"  # a common word and a rare one being typed: the rare one decides


def plant(path: Path) -> None:
    """Put the searched word in the first HITS user messages (the triggers index them)."""
    db = sqlite3.connect(path)
    with db:
        ids = [
            row[0]
            for row in db.execute(
                "SELECT id FROM entry WHERE kind = 'user' ORDER BY id LIMIT ?", (HITS,)
            )
        ]
        db.executemany(
            "UPDATE entry SET text = text || ' The " + WORD + " flush.' WHERE id = ?",
            [(i,) for i in ids],
        )
    db.close()


def searcher(relay: Relay, query: str = QUERY) -> Callable[[], None]:
    """GET /api/search for the query."""

    def search() -> None:
        status, body = relay.http.request("GET", f"/api/search?q={quote(query)}&limit=20")
        assert status == 200 and len(body["hits"]) == HITS, (status, body)

    return search


def prepared(path: Path, count: int) -> None:
    """Seed `count` entries in conversations of PER_CONVERSATION and plant the word."""
    per = min(PER_CONVERSATION, count)
    seed(path, count // per, per)
    plant(path)


def run(repeat: int = 300, few: int = FEW, many: int = MANY) -> list[Row]:
    """Measure and return the table's row (sizes smaller for a smoke test)."""
    times = few_against_many(
        "oarlock-search-", (few, many), prepared, lambda relay, _count: searcher(relay), repeat
    )
    measure = f"Search (GET /api/search, a word of {HITS} messages)"
    return [growth_row(measure, (few, many), "entries", times, repeat, COMMAND)]
