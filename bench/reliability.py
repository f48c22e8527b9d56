"""Crash safety, measured: a seeded workload while the relay is killed with SIGKILL, N times.

After each restart: every acknowledged message is stored exactly once and in
order, no conversation is half-compacted, and the database's integrity check
passes (SQLite's integrity_check; PostgreSQL's amcheck on the tables and their
indexes). At the end every acknowledged message has been delivered to the agent,
none twice. Prints one line of figures; exits 1 when any of them is not zero.

    python -m bench.reliability --kills 100 --seed 1
    python -m bench.reliability --database-url postgresql+psycopg://me@127.0.0.1/scratch
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import create_engine
from sqlalchemy import text as sql
from sqlalchemy.engine import Connection

TOKEN = "reliability-token"
MAX_ACTIVE = 3


@dataclass
class Tally:
    """What was acknowledged, and what the checks found."""

    acked: dict[str, int] = field(default_factory=dict)  # message text -> conversation id
    order: dict[int, list[str]] = field(default_factory=dict)  # conversation -> acked texts
    compactions: int = 0
    kills: int = 0
    lost: int = 0
    duplicated: int = 0
    misordered: int = 0
    half_compacted: int = 0
    undelivered: int = 0
    delivered_twice: int = 0
    integrity_failures: int = 0

    def line(self) -> str:
        """The one line of figures."""
        return (
            f"kills={self.kills} acked={len(self.acked)} compactions={self.compactions} "
            f"lost={self.lost} duplicated={self.duplicated} misordered={self.misordered} "
            f"half_compacted={self.half_compacted} undelivered={self.undelivered} "
            f"delivered_twice={self.delivered_twice} integrity_failures={self.integrity_failures}"
        )

    @property
    def failures(self) -> int:
        """How many checks failed in all."""
        return (
            self.lost
            + self.duplicated
            + self.misordered
            + self.half_compacted
            + self.undelivered
            + self.delivered_twice
            + self.integrity_failures
        )


class Relay:
    """The relay as a child process, started and killed like a real one."""

    def __init__(
        self, workdir: Path, demo_delay: float = 0.01, database_url: str | None = None
    ) -> None:
        self.workdir = workdir
        self.demo_delay = demo_delay
        self.data = workdir / "data"
        self.database_url = database_url
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> httpx.Client:
        """Start the relay and wait until it answers."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = {
            **os.environ,
            "OARLOCK_TOKEN": TOKEN,
            "OARLOCK_WORKSPACE_ROOTS": str(self.workdir),
            "OARLOCK_DEMO_DELAY": str(self.demo_delay),
            "OARLOCK_LOG_LEVEL": "warning",
            "OARLOCK_DEFAULT_PROVIDER": "demo",
        }
        if self.database_url:
            env["OARLOCK_DATABASE_URL"] = self.database_url
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app",
                "serve",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if client.get("/healthz").status_code == 200:
                    return client
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("the relay did not start")

    def kill(self, signum: int = signal.SIGKILL) -> int:
        """Send a signal (SIGKILL: no shutdown code runs) and wait for the exit status."""
        assert self.process is not None
        self.process.send_signal(signum)
        return self.process.wait(timeout=60)


def workload(
    client: httpx.Client, rng: random.Random, tally: Tally, round_: int, stop: threading.Event
) -> None:
    """Create conversations, send messages (some slow, so others queue), compact now and then."""
    sent = 0
    while not stop.is_set():
        try:
            active = client.get("/api/conversations", params={"status": "active"}).json()[
                "conversations"
            ]
            if len(active) < MAX_ACTIVE:
                client.post("/api/conversations", json={"provider": "demo", "title": f"r{round_}"})
                continue
            target = rng.choice(active)["id"]
            if rng.random() < 0.05:
                response = client.post(
                    f"/api/conversations/{target}/messages", json={"text": "/compact"}
                )
                if response.status_code == 201:
                    tally.compactions += 1
                continue
            sent += 1
            text = f"m{round_}-{sent}" + (" slow" if rng.random() < 0.1 else "")
            response = client.post(f"/api/conversations/{target}/messages", json={"text": text})
            if response.status_code == 202:
                tally.acked[text] = target
                tally.order.setdefault(target, []).append(text)
        except (httpx.TransportError, ValueError, KeyError):
            return  # the relay was killed under us


@contextmanager
def reading(url: str) -> Iterator[Connection]:
    """A connection to the relay's database (SQLite opened read-only)."""
    if url.startswith("sqlite:///"):
        url = f"sqlite:///file:{url.removeprefix('sqlite:///')}?mode=ro&uri=true"
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def intact(db: Connection) -> bool:
    """The database's own consistency check of the relay's tables."""
    if db.dialect.name == "sqlite":
        return db.execute(sql("PRAGMA integrity_check")).scalar() == "ok"
    # PostgreSQL: amcheck (shipped with the server) checks each table's heap and B-tree index.
    db.execute(sql("CREATE EXTENSION IF NOT EXISTS amcheck"))
    tables = ("conversation", "entry")
    for table in tables:
        if db.execute(sql(f"SELECT count(*) FROM verify_heapam('{table}')")).scalar():
            return False
    db.execute(
        sql(
            "SELECT bt_index_check(i.indexrelid, true) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam "
            "WHERE a.amname = 'btree' AND i.indrelid::regclass::text IN ('conversation', 'entry')"
        )
    ).all()  # raises on a corrupt index
    db.commit()
    return True


def check_database(url: str, tally: Tally) -> None:
    """Every acknowledged message stored once, in order; compaction whole; integrity ok."""
    with reading(url) as db:
        if not intact(db):
            tally.integrity_failures += 1
        rows = db.execute(
            sql("SELECT conversation_id, text, state, seq FROM entry WHERE kind = 'user'")
        ).all()
        counts = Counter(text for _c, text, _s, _q in rows)
        for text in tally.acked:
            tally.lost += counts[text] == 0
            tally.duplicated += counts[text] > 1
        for conversation_id, texts in tally.order.items():
            stored = sorted(
                (
                    (state == "queued", seq, text)
                    for c, text, state, seq in rows
                    if c == conversation_id
                ),
            )
            acked = set(texts)
            if [text for _q, _s, text in stored if text in acked] != texts:
                tally.misordered += 1
        conversations = {
            row[0]: tuple(row[1:])
            for row in db.execute(
                sql("SELECT id, status, compacted_from_id, compacted_into_id FROM conversation")
            )
        }
        for cid, (status, from_id, into_id) in conversations.items():
            if status == "archived" and (
                into_id not in conversations or conversations[into_id][1] != cid
            ):
                tally.half_compacted += 1
            if status == "active" and into_id is not None:
                tally.half_compacted += 1
            if from_id is not None and conversations.get(from_id, ("", None, None))[2] != cid:
                tally.half_compacted += 1


def check_delivery(client: httpx.Client, url: str, tally: Tally) -> None:
    """After the queues drain, every acknowledged message reached the agent exactly once."""
    deadline = time.monotonic() + 120
    for status in ("active", "archived"):
        for conversation in client.get(
            "/api/conversations", params={"status": status, "limit": 500}
        ).json()["conversations"]:
            while time.monotonic() < deadline:
                turn = client.get(
                    f"/api/conversations/{conversation['id']}", params={"limit": 1}
                ).json()["turn"]
                if turn == {"state": "idle", "queued": 0}:
                    break
                time.sleep(0.05)
    with reading(url) as db:
        states = {
            row[0]: row[1]
            for row in db.execute(sql("SELECT text, state FROM entry WHERE kind = 'user'"))
        }
        replies = Counter(
            row[0].split("”")[0].removeprefix("You said: “")
            for row in db.execute(sql("SELECT text FROM entry WHERE kind = 'agent'"))
        )
    for text in tally.acked:
        tally.undelivered += states.get(text) != "sent"
        tally.delivered_twice += replies[text] > 1


def run(kills: int, seed: int, workdir: Path, database_url: str | None = None) -> Tally:
    """The whole experiment: kills rounds of work, kill, restart, check.

    database_url: an empty PostgreSQL database to use; default: SQLite in workdir.
    """
    rng = random.Random(seed)
    tally = Tally()
    relay = Relay(workdir, database_url=database_url)
    database = database_url or f"sqlite:///{relay.data / 'oarlock.db'}"
    for round_ in range(kills):
        client = relay.start()
        stop = threading.Event()
        worker = threading.Thread(target=workload, args=(client, rng, tally, round_, stop))
        worker.start()
        time.sleep(rng.uniform(0.05, 1.2))
        relay.kill()
        tally.kills += 1
        stop.set()
        worker.join()
        client.close()
        check_database(database, tally)
    client = relay.start()
    try:
        check_delivery(client, database, tally)
        check_database(database, tally)
    finally:
        client.close()
        if relay.process is not None:
            relay.process.terminate()
            relay.process.wait(timeout=30)
    return tally


def main() -> None:
    """Command line: --kills N --seed S."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--database-url", default=None, help="an empty PostgreSQL database (default: SQLite)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="oarlock-reliability-") as workdir:
        tally = run(args.kills, args.seed, Path(workdir), args.database_url)
    print(tally.line())
    sys.exit(1 if tally.failures else 0)


if __name__ == "__main__":
    main()
