"""Crash safety, measured: a seeded workload while the relay is killed with SIGKILL, N times.

Several senders post at once. After each restart: every acknowledged message is
stored exactly once and in each sender's order, no conversation is
half-compacted, and the database's integrity check passes (SQLite's
integrity_check; PostgreSQL's amcheck on the tables and their indexes). At the end, once the
queues are drained, every acknowledged message is either answered exactly once
(some of them after the relay delivered them again) or its turn was cut by a
kill and a line in the timeline says so. Prints one line of figures; exits 1
when a message was lost, stored twice, misordered, still queued, answered twice,
or left with neither an answer nor a cut line.

    python -m bench.reliability --kills 100 --seed 1
    python -m bench.reliability --kills 10 --provider claude
    python -m bench.reliability --database-url postgresql+psycopg://me@127.0.0.1/scratch
    python -m bench.reliability --kills 20 --cluster 3

With --cluster N, N nodes share a throwaway PostgreSQL and Redis (the tests' servers); each
sender's requests go to a node picked at random, a random node is killed and restarted each
round while the others keep taking messages, and the same checks run across the cluster.

With --provider claude the conversations run the real Claude Code CLI against
tests/fake_anthropic.py; its transcript lets the relay deliver again a message
the CLI never received. The demo agent keeps no record, so with it a cut turn is
always shown cut (with Resend), never delivered again.
"""

from __future__ import annotations

import argparse
import json
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
from typing import Any

import httpx
from sqlalchemy import create_engine
from sqlalchemy import text as sql
from sqlalchemy.engine import Connection

TOKEN = "reliability-token"
MAX_ACTIVE = 3
SENDERS = 3  # threads posting at the same time
SLOW = {"demo": " slow", "claude": " [[LONG:40]]"}  # a long reply, so other messages queue
# Seconds of work before each kill: the CLI takes a second or two to start.
WORK = {"demo": (0.05, 1.2), "claude": (0.5, 6.0)}


@dataclass
class Tally:
    """What was acknowledged, and what the checks found."""

    acked: dict[str, int] = field(default_factory=dict)  # message text -> conversation id
    # (conversation, sender) -> the texts that sender had acknowledged there, in order
    order: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    compactions: int = 0
    kills: int = 0
    answered_once: int = 0  # one finished reply
    redelivered: int = 0  # of those: delivered again by the relay after a kill
    cut_with_line: int = 0  # no finished reply, and a line says a restart cut its turn
    # Of those, the ones whose line offers Resend: the relay could not tell whether the agent
    # got it, or it was missed again after being delivered again once.
    cut_unknown: int = 0
    missed_twice: int = 0
    lost: int = 0
    duplicated: int = 0
    misordered: int = 0
    half_compacted: int = 0
    undelivered: int = 0  # still queued once the queues should have drained
    unanswered: int = 0  # neither answered nor cut with a line: a silent loss
    answered_twice: int = 0
    integrity_failures: int = 0
    api_twice: int | None = None  # claude only: prompts the Messages API got twice (informative)
    refused: Counter[int] = field(default_factory=Counter)  # message POSTs answered 4xx/5xx
    lock: threading.Lock = field(default_factory=threading.Lock)

    def line(self) -> str:
        """The one line of figures."""
        return (
            f"kills={self.kills} senders={SENDERS} acked={len(self.acked)} "
            f"compactions={self.compactions} answered_once={self.answered_once} "
            f"redelivered={self.redelivered} cut_with_line={self.cut_with_line} "
            f"cut_unknown={self.cut_unknown} missed_twice={self.missed_twice} "
            f"lost={self.lost} duplicated={self.duplicated} misordered={self.misordered} "
            f"half_compacted={self.half_compacted} undelivered={self.undelivered} "
            f"unanswered={self.unanswered} answered_twice={self.answered_twice} "
            f"integrity_failures={self.integrity_failures}"
            + ("" if self.api_twice is None else f" api_twice={self.api_twice}")
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
            + self.unanswered
            + self.answered_twice
            + self.integrity_failures
        )


class Relay:
    """The relay as a child process, started and killed like a real one."""

    def __init__(
        self,
        workdir: Path,
        demo_delay: float = 0.01,
        provider: str = "demo",
        env: dict[str, str] | None = None,
        database_url: str | None = None,
        data: Path | None = None,
    ) -> None:
        self.workdir = workdir  # the workspace root (shared by a cluster's nodes)
        self.demo_delay = demo_delay
        self.provider = provider
        self.env = env if env is not None else dict(os.environ)
        self.database_url = database_url  # an empty PostgreSQL database; default SQLite
        self.data = data or workdir / "data"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> httpx.Client:
        """Start the relay and wait until it answers."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = {
            **self.env,
            "OARLOCK_TOKEN": TOKEN,
            "OARLOCK_WORKSPACE_ROOTS": str(self.workdir),
            "OARLOCK_DEMO_DELAY": str(self.demo_delay),
            "OARLOCK_LOG_LEVEL": "warning",
            "OARLOCK_DEFAULT_PROVIDER": self.provider,
            "OARLOCK_AGENT_IDLE_TIMEOUT": "10",  # CLIs of drained conversations exit
        }
        if self.database_url:
            env["OARLOCK_DATABASE_URL"] = self.database_url
        command = [sys.executable, "-m", "app", "serve", "--port", str(self.port)]
        with (self.workdir / "relay.log").open("ab") as log:  # warnings, for a failed run
            self.process = subprocess.Popen(
                [*command, "--data-dir", str(self.data)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
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
    client: httpx.Client | Spread,
    rng: random.Random,
    tally: Tally,
    round_: int,
    sender: int,
    stop: threading.Event,
    provider: str = "demo",
    keep_on: bool = False,
) -> None:
    """One sender: create conversations, send messages (some slow), compact now and then.

    keep_on: a failed request does not end the sender (a cluster: another node answers).
    """
    sent = 0
    while not stop.is_set():
        try:
            active = client.get("/api/conversations", params={"status": "active"}).json()[
                "conversations"
            ]
            if len(active) < MAX_ACTIVE:
                client.post(
                    "/api/conversations", json={"provider": provider, "title": f"r{round_}"}
                )
                continue
            target = rng.choice(active)["id"]
            if rng.random() < 0.05:
                response = client.post(
                    f"/api/conversations/{target}/messages", json={"text": "/compact"}
                )
                if response.status_code == 201:
                    with tally.lock:
                        tally.compactions += 1
                continue
            sent += 1
            text = f"m{round_}-{sender}-{sent}" + (SLOW[provider] if rng.random() < 0.1 else "")
            response = client.post(f"/api/conversations/{target}/messages", json={"text": text})
            with tally.lock:
                if response.status_code == 202:
                    tally.acked[text] = target
                    tally.order.setdefault((target, sender), []).append(text)
                else:
                    tally.refused[response.status_code] += 1
        except (httpx.TransportError, ValueError, KeyError):
            if not keep_on:
                return  # the relay was killed under us
            time.sleep(0.01)  # that node was killed under us: the next request picks another


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


def _data(raw: object) -> dict[str, Any]:
    """An entry's data column: JSON text (SQLite) or already decoded (PostgreSQL)."""
    data = json.loads(raw) if isinstance(raw, str) else raw
    return data if isinstance(data, dict) else {}


def check_database(url: str, tally: Tally) -> None:
    """Every acknowledged message stored once, in order; compaction whole; integrity ok."""
    with reading(url) as db:
        if not intact(db):
            tally.integrity_failures += 1
        records = db.execute(
            sql("SELECT conversation_id, text, state, seq, data FROM entry WHERE kind = 'user'")
        ).all()
        rows = [(c, text, state, seq) for c, text, state, seq, _d in records]
        # A message delivered again after a restart comes after what was delivered while it was
        # lost (it may have moved on with /compact): it is counted (redelivered), not ordered.
        again = {text for _c, text, _s, _q, raw in records if "redelivered" in _data(raw)}
        counts = Counter(text for _c, text, _s, _q in rows)
        for text in tally.acked:
            tally.lost += counts[text] == 0
            tally.duplicated += counts[text] > 1
        conversations = {
            row[0]: tuple(row[1:])
            for row in db.execute(
                sql("SELECT id, status, compacted_from_id, compacted_into_id FROM conversation")
            )
        }

        def parked(conversation_id: int, state: str) -> bool:
            return state == "queued" and conversations[conversation_id][0] == "archived"

        for (conversation_id, _sender), texts in tally.order.items():
            # /compact moves queued messages into the successor: follow the chain, in order.
            chain = [conversation_id]
            while (into := conversations.get(chain[-1], ("", None, None))[2]) is not None:
                chain.append(into)
            # A message a node stored while another node compacted (a cluster) waits, queued,
            # in the archived conversation until it is handed on to the end of the successor:
            # it counts there. The final check, once everything drained, sees where it went.
            stored = sorted(
                (
                    len(chain) if parked(c, state) else chain.index(c),
                    state == "queued",
                    seq,
                    text,
                )
                for c, text, state, seq in rows
                if c in chain
            )
            acked = set(texts) - again
            if [text for _i, _q, _s, text in stored if text in acked] != [
                text for text in texts if text in acked
            ]:
                tally.misordered += 1
                print(
                    f"misordered in {chain}: acked {[t for t in texts if t in acked]}, "
                    f"stored {[(c, q, s, t) for c, q, s, t in stored if t in acked]}",
                    file=sys.stderr,
                )
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
    """After the queues drain: each acknowledged message answered once, or cut with a line."""
    # /compact moves queued messages into the successor, so a chain's backlog drains through
    # one runner: wait as long as the queues keep shrinking, up to 120 s without progress.
    stalled_at, left = time.monotonic() + 120, -1
    while time.monotonic() < stalled_at:
        turns = [
            client.get(f"/api/conversations/{c['id']}", params={"limit": 1}).json()["turn"]
            for status in ("active", "archived")
            for c in client.get(
                "/api/conversations", params={"status": status, "limit": 500}
            ).json()["conversations"]
        ]
        if all(turn == {"state": "idle", "queued": 0} for turn in turns):
            break
        queued = sum(turn["queued"] for turn in turns)
        if left < 0 or queued < left:
            stalled_at, left = time.monotonic() + 120, queued
        time.sleep(0.5)
    with reading(url) as db:
        rows = db.execute(
            sql(
                "SELECT id, conversation_id, kind, text, state, data FROM entry"
                " ORDER BY conversation_id, seq"
            )
        ).all()
    users: dict[str, tuple[int, str, dict[str, Any]]] = {}  # text -> id, state, data
    replies: Counter[int] = Counter()  # user entry id -> finished agent messages of its turn
    cut: dict[int, bool | None] = {}  # user entry id a cut line names -> data.received
    turn_of: dict[int, int] = {}  # conversation -> the user message whose turn runs
    for entry_id, conversation_id, kind, text, state, raw in rows:
        data = _data(raw)
        if kind == "user" and state == "sent":  # turns run one at a time, in seq order
            turn_of[conversation_id] = entry_id
        if kind == "user":
            users[text] = (entry_id, state, data)
        elif kind == "agent" and state == "done" and conversation_id in turn_of:
            replies[turn_of[conversation_id]] += 1
        elif kind == "line" and data.get("type") == "cut":
            cut[int(data.get("entry_id") or 0)] = data.get("received")
    for text in tally.acked:
        entry_id, state, data = users.get(text, (0, "", {}))
        if state != "sent":
            tally.undelivered += 1
        elif replies[entry_id] == 1:
            tally.answered_once += 1
            tally.redelivered += bool(data.get("redelivered"))
        elif replies[entry_id] > 1:
            tally.answered_twice += 1
        elif entry_id in cut:
            tally.cut_with_line += 1
            tally.cut_unknown += cut[entry_id] is None
            tally.missed_twice += cut[entry_id] is False
        else:
            tally.unanswered += 1
            _explain(rows, entry_id)


def _explain(rows: list[Any], entry_id: int) -> None:
    """Print, on stderr, the timeline around an unanswered message (to tell what happened)."""
    conversation = next(c for i, c, *_rest in rows if i == entry_id)
    print(f"unanswered: entry {entry_id} of conversation {conversation}:", file=sys.stderr)
    for i, c, kind, text, state, raw in rows:
        if c == conversation:
            mark = ">" if i == entry_id else " "
            print(f" {mark}{i} {kind} {state} {text[:40]!r} {_data(raw)}", file=sys.stderr)


def run(
    kills: int,
    seed: int,
    workdir: Path,
    provider: str = "demo",
    database_url: str | None = None,
) -> Tally:
    """The whole experiment: kills rounds of work, kill, restart, check.

    database_url: an empty PostgreSQL database to use; default: SQLite in workdir.
    """
    if provider == "claude":
        return _with_claude(kills, seed, workdir, database_url)
    return _run(kills, seed, Relay(workdir, database_url=database_url))


def _with_claude(kills: int, seed: int, workdir: Path, database_url: str | None) -> Tally:
    """The experiment with the real Claude Code CLI against the fake Messages API."""
    from bench.common import claude_env
    from tests.fake_anthropic import FakeAnthropic, last_user_text

    home = workdir / "home"
    with FakeAnthropic() as fake:
        fake.long_word_delay = 0.05
        relay = Relay(
            workdir, provider="claude", env=claude_env(home, fake), database_url=database_url
        )  # type: ignore[arg-type]
        try:
            tally = _run(kills, seed, relay)
        finally:
            _reap_clis(home)
        sent = Counter(last_user_text(body) for body in fake.message_bodies())
        tally.api_twice = sum(sent[text] > 1 for text in tally.acked)
    return tally


def _reap_clis(home: Path) -> None:
    """Stop the CLIs still running (killed relays leave theirs to finish their turn)."""
    for path in home.glob(".claude/sessions/*.json"):
        try:
            os.kill(int(json.loads(path.read_text())["pid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            continue


def _run(kills: int, seed: int, relay: Relay) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    database = relay.database_url or f"sqlite:///{relay.data / 'oarlock.db'}"
    for round_ in range(kills):
        client = relay.start()
        stop = threading.Event()
        workers = [
            threading.Thread(
                target=workload,
                args=(
                    client,
                    random.Random(rng.random()),
                    tally,
                    round_,
                    sender,
                    stop,
                    relay.provider,
                ),
            )
            for sender in range(SENDERS)
        ]
        for worker in workers:
            worker.start()
        time.sleep(rng.uniform(*WORK[relay.provider]))
        relay.kill()
        tally.kills += 1
        stop.set()
        for worker in workers:
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


LEASE_SECONDS = 5  # cluster mode: a killed node's conversations move after at most this


class Spread:
    """Requests to a node picked at random among the running ones (no proxy, no stickiness)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.live: dict[int, httpx.Client] = {}
        self.lock = threading.Lock()

    def pick(self) -> httpx.Client:
        """A running node's client."""
        with self.lock:
            return self.rng.choice(list(self.live.values()))

    def get(self, path: str, **options: Any) -> httpx.Response:
        """GET on a random node."""
        return self.pick().get(path, **options)

    def post(self, path: str, **options: Any) -> httpx.Response:
        """POST on a random node."""
        return self.pick().post(path, **options)


def run_cluster(kills: int, seed: int, workdir: Path, count: int) -> Tally:
    """The experiment on count nodes sharing a throwaway PostgreSQL and Redis; kill -9 at random.

    The servers are the tests' (tests/postgres.py, tests/redis.py): Debian's binaries in temp
    directories on loopback ports, stopped at the end.
    """
    from app.migrate import upgrade
    from tests.postgres import Cluster
    from tests.redis import RedisServer

    postgres = Cluster().start()
    try:
        engine = RedisServer().start()
        try:
            url = postgres.create_database()
            upgrade(url)
            env = {
                **os.environ,
                "OARLOCK_REDIS_URL": engine.url,
                "OARLOCK_LEASE_SECONDS": str(LEASE_SECONDS),
            }
            relays = [
                Relay(workdir, env=env, database_url=url, data=workdir / f"node{number}")
                for number in range(1, count + 1)
            ]
            return _run_cluster(kills, seed, relays, url)
        finally:
            engine.stop()
    finally:
        postgres.stop()


def _run_cluster(kills: int, seed: int, relays: list[Relay], database: str) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    clients = [relay.start() for relay in relays]
    try:
        for round_ in range(kills):
            spreads = [Spread(random.Random(rng.random())) for _ in range(SENDERS)]
            for spread in spreads:
                spread.live = dict(enumerate(clients))
            stop = threading.Event()
            workers = [
                threading.Thread(
                    target=workload,
                    args=(spread, random.Random(rng.random()), tally, round_, sender, stop),
                    kwargs={"keep_on": True},
                )
                for sender, spread in enumerate(spreads)
            ]
            for worker in workers:
                worker.start()
            time.sleep(rng.uniform(*WORK["demo"]))
            victim = rng.randrange(len(relays))
            for spread in spreads:
                with spread.lock:
                    del spread.live[victim]
            relays[victim].kill()
            tally.kills += 1
            # The other nodes keep taking messages, some for the dead node's conversations.
            time.sleep(rng.uniform(0.2, 1.0))
            stop.set()
            for worker in workers:
                worker.join()
            clients[victim].close()
            check_database(database, tally)
            clients[victim] = relays[victim].start()
        check_delivery(clients[0], database, tally)
        check_database(database, tally)
    finally:
        for client, relay in zip(clients, relays, strict=True):
            client.close()
            if relay.process is not None and relay.process.poll() is None:
                relay.process.terminate()
                relay.process.wait(timeout=30)
    return tally


def main() -> None:
    """Command line: --kills N --seed S."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--provider", choices=["demo", "claude"], default="demo")
    parser.add_argument(
        "--database-url", default=None, help="an empty PostgreSQL database (default: SQLite)"
    )
    parser.add_argument(
        "--cluster",
        type=int,
        default=0,
        metavar="NODES",
        help="NODES relay nodes on a throwaway PostgreSQL and Redis, a random one killed each time",
    )
    args = parser.parse_args()
    if args.cluster and (args.provider != "demo" or args.database_url):
        parser.error("--cluster runs the demo agent on a PostgreSQL of its own")
    with tempfile.TemporaryDirectory(prefix="oarlock-reliability-") as workdir:
        if args.cluster:
            tally = run_cluster(args.kills, args.seed, Path(workdir), args.cluster)
        else:
            tally = run(args.kills, args.seed, Path(workdir), args.provider, args.database_url)
    if tally.refused:  # informative: refused messages were not acknowledged, nor counted
        print(f"refused message posts by status: {dict(tally.refused)}", file=sys.stderr)
    print(tally.line())
    sys.exit(1 if tally.failures else 0)


if __name__ == "__main__":
    main()
