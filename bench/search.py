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
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from bench.common import Relay, Row, alternate, at_most, median, ms, seed

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


def run(repeat: int = 300, few: int = FEW, many: int = MANY) -> list[Row]:
    """Measure and return the table's row (sizes smaller for a smoke test)."""
    with tempfile.TemporaryDirectory(prefix="oarlock-search-") as tmp:
        root = Path(tmp)
        for name, count in (("few", few), ("many", many)):
            (root / name).mkdir()
            per = min(PER_CONVERSATION, count)
            seed(root / name / "oarlock.db", count // per, per)
            plant(root / name / "oarlock.db")
        with Relay(root / "few", "noop") as small_relay, Relay(root / "many", "noop") as large:
            for relay in (small_relay, large):
                for _ in range(5):
                    searcher(relay)()
            times = alternate({"few": searcher(small_relay), "many": searcher(large)}, repeat)
    small, big = median(times["few"]), median(times["many"])
    row = at_most(
        f"Search (GET /api/search, a word of {HITS} messages): {many:,} ÷ {few} entries",
        big / small,
        1.5,
        f"{many:,} entries {ms(big)}, {few} entries {ms(small)} (medians of {repeat})",
        COMMAND,
    )
    print(f"search: {row.figures}", file=sys.stderr)
    return [row]
