"""Many conversations: the conversation list's first page with 10,000 conversations vs 100.

    python -m bench conversations [--repeat 300]

Two databases seeded with SQL (each conversation with 4 entries), each served by its own
relay in a child process; GET /api/conversations (the first page, 100 conversations, as the
UI asks) alternates between them; the figure is the ratio of the medians.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.common import Relay, Row, alternate, at_most, median, ms, seed

COMMAND = "python -m bench conversations"
FEW, MANY = 100, 10_000
ENTRIES = 4


def lister(relay: Relay) -> Callable[[], None]:
    """GET the first page of the conversation list."""

    def list_page() -> None:
        status, page = relay.http.request("GET", "/api/conversations?status=active&limit=100")
        assert status == 200 and len(page["conversations"]) == 100, status

    return list_page


def run(repeat: int = 300) -> list[Row]:
    """Measure and return the table's row."""
    with tempfile.TemporaryDirectory(prefix="oarlock-conversations-") as tmp:
        root = Path(tmp)
        for name, count in (("few", FEW), ("many", MANY)):
            (root / name).mkdir()
            seed(root / name / "oarlock.db", count, ENTRIES)
        with Relay(root / "few", "noop") as few, Relay(root / "many", "noop") as many:
            for relay in (few, many):
                for _ in range(5):
                    lister(relay)()
            times = alternate({"few": lister(few), "many": lister(many)}, repeat)
    small, large = median(times["few"]), median(times["many"])
    row = at_most(
        f"List conversations (GET, first page of 100): {MANY:,} ÷ {FEW} conversations",
        large / small,
        1.5,
        f"{MANY:,} conversations {ms(large)}, {FEW} conversations {ms(small)} "
        f"(medians of {repeat})",
        COMMAND,
    )
    print(f"conversations: {row.figures}", file=sys.stderr)
    return [row]
