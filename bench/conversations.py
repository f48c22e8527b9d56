"""Many conversations: the conversation list's first page with 10,000 conversations vs 100.

    python -m bench conversations [--repeat 300]

Two databases seeded with SQL (each conversation with 4 entries), each served by its own
relay in a child process; GET /api/conversations (the first page, 100 conversations, as the
UI asks) alternates between them; the figure is the ratio of the medians.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.common import Relay, Row, few_against_many, growth_row, seed

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
    times = few_against_many(
        "oarlock-conversations-",
        (FEW, MANY),
        lambda path, count: seed(path, count, ENTRIES),
        lambda relay, _count: lister(relay),
        repeat,
    )
    measure = "List conversations (GET, first page of 100)"
    return [growth_row(measure, (FEW, MANY), "conversations", times, repeat, COMMAND)]
