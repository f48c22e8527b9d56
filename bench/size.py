"""Size independence: the same three actions on a conversation of 100 and of 100,000 entries.

    python -m bench size [--repeat 300]

Two databases are seeded with SQL (executemany) in the relay's own schema: one conversation
of 100 entries, one of 100,000 (user, agent Markdown, tool call and line entries in turn),
each served by its own relay (no-op bench agent) in a child process. Requests alternate
between the two relays, so drift and noise hit both alike; the figures are medians.

- Opening a conversation: GET /api/conversations/1?limit=100. The first page holds 100
  entries in both (the UI's default page of 200 would hold 100 and 200 entries, measuring
  the page size instead of the conversation's length).
- Building the /compact summary: store.recent_messages + summary.build_summary, in this
  process, on each database.
- Sending a message: POST /api/conversations/1/messages until its 202 (the no-op turn it
  starts is waited for, untimed, before the next one).

When the schema has no index on (conversation_id, state, seq), the two HTTP figures are
also measured with that index added (--extra-index), to show what it changes.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app import store
from app.db import get_session, make_engine
from app.summary import SummaryMessage, build_summary
from bench.common import Relay, Row, alternate, at_most, median, ms, seed

COMMAND = "python -m bench size"
SMALL, LARGE = 100, 100_000
PAGE = 100
STATE_INDEX = ["conversation_id", "state", "seq"]


def has_state_index(path: Path) -> bool:
    """Whether an index of entry starts with (conversation_id, state, seq)."""
    with sqlite3.connect(path) as db:
        names = [row[1] for row in db.execute("PRAGMA index_list(entry)")]
        return any(
            [row[2] for row in db.execute(f"PRAGMA index_info({name})")][:3] == STATE_INDEX
            for name in names
        )


def summary_of(engine: Any) -> Callable[[], str]:
    """What /compact computes from the database: the carry-over summary."""

    def build() -> str:
        with get_session(engine) as session:
            messages = store.recent_messages(session=session, conversation_id=1)
        return build_summary(
            "Conversation 1",
            [SummaryMessage("user" if m.kind == "user" else "agent", m.text) for m in messages],
        )

    return build


def opener(relay: Relay) -> Callable[[], None]:
    """GET the conversation's first page."""

    def open_page() -> None:
        status, view = relay.http.request("GET", f"/api/conversations/1?limit={PAGE}")
        assert status == 200 and len(view["timeline"]) == PAGE, status

    return open_page


def sender(relay: Relay) -> Callable[[], None]:
    """POST a message (timed up to its 202)."""

    def send() -> None:
        assert relay.send(1, "Please carry on with the next file.") == 202

    return send


def measure_http(small: Relay, large: Relay, repeat: int) -> dict[str, dict[str, list[float]]]:
    """GET and POST times on both relays, taking turns."""
    for relay in (small, large):  # warm: first loads, the hub's seq cache, the pool
        for _ in range(5):
            opener(relay)()
    gets = alternate({"small": opener(small), "large": opener(large)}, repeat)
    posts: dict[str, list[float]] = {"small": [], "large": []}
    for _ in range(max(20, repeat // 3)):
        for name, relay in (("small", small), ("large", large)):
            posts[name] += alternate({name: sender(relay)}, 1)[name]
            relay.wait_idle(1)
    return {"get": gets, "post": posts}


def measure(repeat: int) -> tuple[dict[str, dict[str, list[float]]], ...]:
    """Every figure: (as shipped, with the index or None, summary times)."""
    with tempfile.TemporaryDirectory(prefix="oarlock-size-") as tmp:
        root = Path(tmp)
        paths = {}
        for name, entries in (("small", SMALL), ("large", LARGE)):
            (root / name).mkdir()
            paths[name] = root / name / "oarlock.db"
            seed(paths[name], 1, entries)
        indexed = has_state_index(paths["large"])
        engines = {name: make_engine(f"sqlite:///{path}") for name, path in paths.items()}
        summaries = alternate({name: summary_of(e) for name, e in engines.items()}, repeat)
        for engine in engines.values():
            engine.dispose()
        for name in ("small", "large"):  # a pristine copy for the run with the index
            (root / f"{name}-indexed").mkdir()
            shutil.copy(paths[name], root / f"{name}-indexed" / "oarlock.db")
        with Relay(root / "small", "noop") as small, Relay(root / "large", "noop") as large:
            shipped = measure_http(small, large, repeat)
        extra = None
        if not indexed:
            with (
                Relay(root / "small-indexed", "noop", extra_index=True) as small,
                Relay(root / "large-indexed", "noop", extra_index=True) as large,
            ):
                extra = measure_http(small, large, repeat)
    return shipped, extra, {"summary": summaries}


def _row(measure: str, times: dict[str, list[float]]) -> Row:
    small, large = median(times["small"]), median(times["large"])
    return at_most(
        measure,
        large / small,
        1.5,
        f"{LARGE:,} entries {ms(large)}, {SMALL} entries {ms(small)} "
        f"(medians of {len(times['small'])})",
        COMMAND,
    )


def run(repeat: int = 300) -> list[Row]:
    """Measure and return the table's rows."""
    shipped, extra, summary = measure(repeat)
    rows = [
        _row(
            f"Open a conversation (GET, first page of {PAGE}): {LARGE:,} ÷ {SMALL} entries",
            shipped["get"],
        ),
        _row(
            f"/compact summary (recent_messages + build_summary): {LARGE:,} ÷ {SMALL}",
            summary["summary"],
        ),
        _row(f"Send a message (POST → 202): {LARGE:,} ÷ {SMALL} entries", shipped["post"]),
    ]
    if extra is not None:
        index = "with the proposed index (conversation_id, state, seq)"
        rows.insert(1, _row(f"Open a conversation, {index}: {LARGE:,} ÷ {SMALL}", extra["get"]))
        rows.append(_row(f"Send a message, {index}: {LARGE:,} ÷ {SMALL}", extra["post"]))
    for row in rows:
        print(f"size: {row.measure}: {row.figures}", file=sys.stderr)
    return rows
