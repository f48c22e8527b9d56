"""Loop stall: /healthz and WebSocket ping while another process holds SQLite's write lock.

    python -m bench stall

A relay in a child process (the no-op bench agent, SQLite in WAL mode). Another process
takes the database's write lock (BEGIN IMMEDIATE, as a backup tool or a shell would) and
holds it for 3 s, while 4 senders keep POSTing messages (each write waits for the lock: a
503 after the relay's busy timeout, or a 202). Meanwhile one client GETs /healthz and one
tab sends a WebSocket ping, each as soon as the previous one was answered; the row is the
p99 latency of each, counted over the 3 s the lock was held. A relay that waited for the
database on its event loop would stall both for as long as each write waits.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from websockets.sync.client import connect

from bench.common import Http, Relay, Row, at_most, percentile

COMMAND = "python -m bench stall"
HOLD_SECONDS = 3.0
SENDERS = 4
LIMIT_MS = 50.0

HOLDER = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("ROLLBACK")
print("released", flush=True)
"""


def run() -> list[Row]:
    """Measure and return the table's row."""
    with (
        tempfile.TemporaryDirectory(prefix="oarlock-stall-") as tmp,
        Relay(Path(tmp) / "data", "noop") as relay,
    ):
        conversations = [relay.create(title=f"sender {n}") for n in range(SENDERS)]
        pings, healths = measure(relay, conversations)
    ping, health = percentile(pings, 0.99), percentile(healths, 0.99)
    print(f"stall: {len(pings)} pings, {len(healths)} /healthz", file=sys.stderr)
    worst = max(ping, health) * 1000
    return [
        at_most(
            "Loop stall: /healthz and WebSocket ping p99 while another process holds "
            f"the SQLite write lock for {HOLD_SECONDS:g} s (ms)",
            worst,
            LIMIT_MS,
            f"ping p99 {ping * 1000:.1f} ms ({len(pings)} pings), /healthz p99 "
            f"{health * 1000:.1f} ms ({len(healths)} requests), {SENDERS} senders writing",
            COMMAND,
        )
    ]


def measure(relay: Relay, conversations: list[int]) -> tuple[list[float], list[float]]:
    """Ping and /healthz latencies (seconds) while the lock is held."""
    locked, done = threading.Event(), threading.Event()
    pings: list[float] = []
    healths: list[float] = []

    def ping() -> None:
        with connect(relay.ws_url, additional_headers=relay.ws_headers()) as ws:
            assert json.loads(ws.recv())["type"] == "hello"
            locked.wait()
            while not done.is_set():
                start = time.perf_counter()
                ws.send('{"type":"ping"}')
                while json.loads(ws.recv()) != {"type": "pong"}:
                    pass
                if not done.is_set():
                    pings.append(time.perf_counter() - start)

    def health() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=60)
        locked.wait()
        while not done.is_set():
            start = time.perf_counter()
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            if not done.is_set():
                healths.append(time.perf_counter() - start)
        connection.close()

    def send(conversation_id: int) -> None:
        client = Http(relay.port)
        locked.wait()
        while not done.is_set():
            client.request("POST", f"/api/conversations/{conversation_id}/messages", {"text": "hi"})
        client.close()

    threads = [threading.Thread(target=ping), threading.Thread(target=health)]
    threads += [threading.Thread(target=send, args=(c,)) for c in conversations]
    for thread in threads:
        thread.start()
    database = relay.data_dir / "oarlock.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(database), str(HOLD_SECONDS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    locked.set()
    assert holder.stdout.readline() == "released\n"
    done.set()
    holder.wait()
    for thread in threads:
        thread.join(60)
    for conversation_id in conversations:
        relay.wait_idle(conversation_id)
    return pings, healths
