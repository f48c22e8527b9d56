"""Write path: acknowledged user messages per second, with 1 and with 20 concurrent senders.

    python -m bench writes [--messages 300]

A relay in a child process with the no-op bench agent (every turn ends at once, so the
figure is the write path, not an agent's work), SQLite in WAL mode with synchronous=FULL
as the relay sets it. A sender POSTs messages one after the other on its own keep-alive
connection, each only after the previous one's 202; 20 senders do so at once (threads),
each on its own conversation. Beside them, the disk's ceiling: this process inserting a
row and committing (same pragmas, one commit per message) as fast as it can.

The rounds alternate raw SQLite, 1 sender, 20 senders, three times; the table takes the
median rate of each. Each acknowledged message costs the relay three commits (the message,
the turn's start, the turn's end), so a third of the raw commit rate is the ceiling.
"""

from __future__ import annotations

import itertools
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from app.migrate import upgrade
from bench.common import STAMP, Http, Relay, Row, at_least, median

COMMAND = "python -m bench writes"
RAW_SEQ = itertools.count(1)
SENDERS = 20
ROUNDS = 3


def raw_commits_per_second(path: Path, count: int) -> float:
    """What add_entry writes (INSERT entry, UPDATE conversation), one COMMIT per message."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    start = time.perf_counter()
    for _ in range(count):
        seq = next(RAW_SEQ)
        db.execute("BEGIN")
        db.execute(
            "INSERT INTO entry (conversation_id, seq, kind, text, state, data, created_at)"
            " VALUES (1, ?, 'user', 'Please carry on.', 'queued', '{}', ?)",
            (seq, STAMP),
        )
        db.execute(
            "UPDATE conversation SET last_seq = ?, updated_at = ? WHERE id = 1", (seq, STAMP)
        )
        db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return count / elapsed


def acks_per_second(relay: Relay, conversations: list[int], per_sender: int) -> float:
    """Messages acknowledged per second with one sender per conversation, all at once."""
    barrier = threading.Barrier(len(conversations) + 1)
    failures: list[int] = []

    def send(conversation_id: int) -> None:
        http = Http(relay.port)
        path = f"/api/conversations/{conversation_id}/messages"
        barrier.wait()
        for _ in range(per_sender):
            status, _body = http.request("POST", path, {"text": "Please carry on."})
            if status != 202:
                failures.append(status)
        http.close()

    threads = [threading.Thread(target=send, args=(c,)) for c in conversations]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    assert not failures, failures
    for conversation_id in conversations:
        relay.wait_idle(conversation_id)
    return len(conversations) * per_sender / elapsed


def run(messages: int = 300) -> list[Row]:
    """Measure and return the table's rows."""
    rates: dict[str, list[float]] = {"raw": [], "one": [], "many": []}
    with tempfile.TemporaryDirectory(prefix="oarlock-writes-") as tmp:
        root = Path(tmp)
        raw = root / "raw.db"
        upgrade(f"sqlite:///{raw}")
        with sqlite3.connect(raw) as db:
            db.execute(
                "INSERT INTO conversation (id, title, provider, status, cwd, permission_mode,"
                " turn_active, last_seq, created_at, updated_at) VALUES (1, 'raw', 'demo',"
                " 'active', '/', 'default', 0, 0, '2026-11-30', '2026-11-30')"
            )
        with Relay(root / "data", "noop") as relay:
            conversations = [relay.create(title=f"writer {n}") for n in range(SENDERS + 1)]
            relay.send(conversations[0], "warm up")
            relay.wait_idle(conversations[0])
            for _ in range(ROUNDS):
                rates["raw"].append(raw_commits_per_second(raw, messages))
                rates["one"].append(acks_per_second(relay, conversations[:1], messages))
                rates["many"].append(
                    acks_per_second(relay, conversations[1:], max(1, messages // SENDERS))
                )
    raw_rate, one, many = (median(rates[k]) for k in ("raw", "one", "many"))
    print(f"writes: {rates}", file=sys.stderr)
    return [
        Row(
            "Acknowledged messages/s, 1 sender ÷ raw SQLite commits/s (same pragmas)",
            one / raw_rate,
            f"relay {one:,.0f}/s ({1000 / one:.1f} ms each, 3 commits), "
            f"raw INSERT+UPDATE+COMMIT {raw_rate:,.0f}/s",
            "none set (ceiling ⅓)",
            None,
            COMMAND,
        ),
        at_least(
            f"Acknowledged messages/s, {SENDERS} concurrent senders ÷ 1 sender",
            many / one,
            1.0,
            f"{SENDERS} senders {many:,.0f}/s, 1 sender {one:,.0f}/s",
            COMMAND,
        ),
    ]
