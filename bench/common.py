"""What the benchmarks share: result rows, statistics, seeded databases, relays in child processes.

Every figure is a ratio of two things measured side by side in the same run, so that the
noise of a shared two-core machine cancels out instead of landing in the table.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from app.migrate import upgrade
from tests.claude_env import CLEARED  # what the tests clear, the benches clear too

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token-0123456789"
STAMP = "2026-11-30 12:00:00.000000"  # SQLAlchemy's SQLite datetime format
IDLE_RECONNECT = 3.0  # seconds: reconnect rather than reuse a connection uvicorn may drop


@dataclass(frozen=True)
class Row:
    """One line of the table: a ratio, what it is made of, its target and the command."""

    measure: str
    ratio: float | None  # None: a figure recorded without a target
    figures: str
    target: str
    passed: bool | None
    command: str

    def cells(self) -> list[str]:
        """The row's cells, in the table's column order."""
        result = {True: "pass", False: "**FAIL**", None: "—"}[self.passed]
        ratio = "—" if self.ratio is None else f"{self.ratio:.2f}"
        return [self.measure, ratio, self.figures, self.target, result, f"`{self.command}`"]


def at_most(measure: str, ratio: float, limit: float, figures: str, command: str) -> Row:
    """A row whose ratio must not exceed limit."""
    return Row(measure, ratio, figures, f"≤ {limit:g}", ratio <= limit, command)


def at_least(measure: str, ratio: float, limit: float, figures: str, command: str) -> Row:
    """A row whose ratio must reach limit."""
    return Row(measure, ratio, figures, f"≥ {limit:g}", ratio >= limit, command)


def table(rows: Iterable[Row]) -> str:
    """The rows as one markdown table."""
    head = ["measure", "ratio", "figures (same run)", "target", "result", "command"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def median(values: Iterable[float]) -> float:
    """The median."""
    return statistics.median(values)


def percentile(values: list[float], fraction: float) -> float:
    """The value below which `fraction` of the values lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def ms(seconds: float) -> str:
    """Seconds as milliseconds, for the figures column."""
    return f"{seconds * 1000:.2f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"


def timed(call: Callable[[], Any]) -> float:
    """How long one call took, in seconds."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def alternate(calls: dict[str, Callable[[], Any]], repeat: int) -> dict[str, list[float]]:
    """Time each call `repeat` times, taking turns (A B A B …) so drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            times[name].append(timed(call))
    return times


def few_against_many(
    prefix: str,
    sizes: tuple[int, int],
    prepare: Callable[[Path, int], None],
    probe: Callable[[Relay, int], Callable[[], None]],
    repeat: int,
) -> tuple[float, float]:
    """Median seconds of one request to two relays, on databases prepared for each size.

    Each size gets its own database and relay (no-op agent); after five unmeasured calls
    each, the calls alternate between them.
    """
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        for count in sizes:
            (root / str(count)).mkdir()
            prepare(root / str(count) / "oarlock.db", count)
        with (
            Relay(root / str(sizes[0]), "noop") as few,
            Relay(root / str(sizes[1]), "noop") as many,
        ):
            calls = {"few": probe(few, sizes[0]), "many": probe(many, sizes[1])}
            for call in calls.values():
                for _ in range(5):
                    call()
            times = alternate(calls, repeat)
    return median(times["few"]), median(times["many"])


def growth_row(
    measure: str,
    sizes: tuple[int, int],
    unit: str,
    times: tuple[float, float],
    repeat: int,
    command: str,
) -> Row:
    """The row of a request that must not grow with the data: larger ÷ smaller at most 1.5."""
    (few, many), (small, big) = sizes, times
    figures = f"{many:,} {unit} {ms(big)}, {few} {unit} {ms(small)} (medians of {repeat})"
    row = at_most(f"{measure}: {many:,} ÷ {few} {unit}", big / small, 1.5, figures, command)
    print(f"{command.split()[-1]}: {row.figures}", file=sys.stderr)
    return row


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    """A process's resident set size (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"no VmRSS for {pid}")


def children(pid: int) -> list[int]:
    """The direct children of a process."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def load_average() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]


# -- databases -----------------------------------------------------------------------------

AGENT_TEXT = (
    "Here is what I found in `{n}`:\n\n- the *parser* keeps a buffer per line\n"
    "- the writer flushes on **every** call\n\n```python\nwrite(buffer)\n```\n"
    "I will change the writer to flush once per batch."
)


def entry_rows(conversation_id: int, count: int) -> Iterator[tuple[Any, ...]]:
    """count timeline rows of a conversation: user, agent (Markdown), tool call, line, …"""
    tool = json.dumps({"type": "tool", "tool": "Bash", "tool_id": "t", "output": "ok"})
    info = json.dumps({"level": "info"})
    for seq in range(1, count + 1):
        kind = ("user", "agent", "activity", "line")[seq % 4]
        if kind == "user":
            row = ("user", f"Please look at file {seq} and fix the flush.", "sent", "{}")
        elif kind == "agent":
            row = ("agent", AGENT_TEXT.format(n=seq), "done", "{}")
        elif kind == "activity":
            row = ("activity", f"grep -n flush src/file{seq}.py", "done", tool)
        else:
            row = ("line", "API error 529 (overloaded), retrying", "done", info)
        yield (conversation_id, seq, *row, STAMP)


def seed(path: Path, conversations: int, entries: int, *, provider: str = "demo") -> None:
    """A migrated database holding conversations with `entries` timeline rows each."""
    upgrade(f"sqlite:///{path}")
    db = sqlite3.connect(path)
    with db:
        db.executemany(
            "INSERT INTO conversation (id, title, provider, status, cwd, permission_mode,"
            " turn_active, last_seq, created_at, updated_at)"
            " VALUES (?, ?, ?, 'active', ?, 'default', 0, ?, ?, ?)",
            (
                (
                    cid,
                    f"Conversation {cid}",
                    provider,
                    str(path.parent),
                    entries,
                    STAMP,
                    f"2026-11-30 12:{cid // 60 % 60:02d}:{cid % 60:02d}.{cid:06d}",
                )
                for cid in range(1, conversations + 1)
            ),
        )
        for cid in range(1, conversations + 1):
            db.executemany(
                "INSERT INTO entry (conversation_id, seq, kind, text, state, data, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                entry_rows(cid, entries),
            )
    db.close()


# -- a relay in a child process -------------------------------------------------------------


class Relay:
    """`python -m bench.servers relay`: the real app and uvicorn, with a bench agent."""

    def __init__(
        self,
        data_dir: Path,
        agent: str,
        *,
        env: dict[str, str] | None = None,
        extra_index: bool = False,
        workspace: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"
        command = [sys.executable, "-m", "bench.servers", "relay", str(data_dir)]
        command += ["--port", str(self.port), "--agent", agent]
        if extra_index:
            command.append("--extra-index")
        if workspace is not None:
            command += ["--workspace", str(workspace)]
        self.process = subprocess.Popen(command, cwd=ROOT, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.process.kill()
            self.process.wait()
            raise
        self.http = Http(self.port)

    @property
    def pid(self) -> int:
        """The relay's process id."""
        return self.process.pid

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the bench relay exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the bench relay did not start")

    def stop(self) -> None:
        """Stop the relay as Ctrl-C would (lifespan included) and wait for it."""
        self.http.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ws_headers(self) -> dict[str, str]:
        """What a browser tab's socket sends: a session cookie and the relay's own origin."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request("GET", f"/?token={TOKEN}")  # a login by URL starts a session
            cookie = connection.getresponse().getheader("set-cookie") or ""
        finally:
            connection.close()
        return {"Cookie": cookie.split(";")[0], "Origin": self.base}

    def create(self, provider: str = "demo", title: str = "Bench") -> int:
        """Create a conversation; its id."""
        status, body = self.http.request(
            "POST", "/api/conversations", {"provider": provider, "title": title}
        )
        assert status == 201, body
        return int(body["id"])

    def send(self, conversation_id: int, text: str) -> int:
        """Post a message; the status."""
        path = f"/api/conversations/{conversation_id}/messages"
        status, _body = self.http.request("POST", path, {"text": text})
        return status

    def wait_idle(self, conversation_id: int, timeout: float = 60) -> None:
        """Wait until the conversation has no turn running and nothing queued."""
        deadline = time.monotonic() + timeout
        while True:
            _status, view = self.http.request(
                "GET", f"/api/conversations/{conversation_id}?limit=1"
            )
            if view["turn"] == {"state": "idle", "queued": 0}:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"conversation {conversation_id} still busy: {view['turn']}")
            time.sleep(0.005)


class Http:
    """A keep-alive HTTP/1.1 client with the token: http.client, the least client overhead."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        self.used = time.monotonic()

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request; its status and decoded JSON body."""
        payload = None if body is None else json.dumps(body)
        if time.monotonic() - self.used > IDLE_RECONNECT:
            self.connection.close()  # uvicorn drops keep-alive connections idle for 5 s
        self.used = time.monotonic()
        self.connection.request(method, path, payload, self.headers)
        response = self.connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()


@contextmanager
def relay(data_dir: Path, agent: str, **options: Any) -> Iterator[Relay]:
    """A relay in a child process for the duration of a with block."""
    running = Relay(data_dir, agent, **options)
    try:
        yield running
    finally:
        running.stop()


# -- the real Claude Code CLI against the fake Messages API ----------------------------------


class Fake:
    """tests/fake_anthropic.py in a child process (`python -m bench.servers fake`)."""

    def __init__(self) -> None:
        command = [sys.executable, "-m", "bench.servers", "fake"]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())
        self.base_url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop the fake."""
        self.process.terminate()
        self.process.wait(timeout=10)


def claude_env(home: Path, fake: Fake) -> dict[str, str]:
    """The environment for a relay (and the CLI) talking to the fake: a fresh HOME, no secrets."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(
        HOME=str(home),
        ANTHROPIC_BASE_URL=fake.base_url,
        ANTHROPIC_API_KEY="sk-bench",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CLAUDE_CODE_TMPDIR=str(home / "tmp"),
    )
    return env


def messages(raw: str | bytes) -> list[dict[str, Any]]:
    """The events of one socket frame (one event, or an array of them)."""
    data = json.loads(raw)
    return data if isinstance(data, list) else [data]


class Tab:
    """One conversation followed over a WebSocket, as a browser tab does."""

    def __init__(self, relay: Relay, conversation_id: int) -> None:
        self.relay = relay
        self.conversation_id = conversation_id
        self.ws: ClientConnection | None = None
        self.pending: deque[dict[str, Any]] = deque()  # events read and not yet looked at

    async def open(self) -> None:
        """Connect and subscribe (returns once the snapshot arrived)."""
        self.ws = await connect(self.relay.ws_url, additional_headers=self.relay.ws_headers())
        await self.until(lambda m: m["type"] == "hello")
        await self.ws.send(
            json.dumps({"type": "subscribe", "conversation_id": self.conversation_id})
        )
        await self.until(lambda m: m["type"] == "snapshot")

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], seconds: float = 120
    ) -> None:
        """Read events until one satisfies predicate (the rest of its frame is kept)."""
        assert self.ws is not None
        async with asyncio.timeout(seconds):
            while True:
                if not self.pending:
                    self.pending.extend(messages(await self.ws.recv()))
                # One frame can carry several events (e.g. a delta and the turn's end).
                if predicate(self.pending.popleft()):
                    return
