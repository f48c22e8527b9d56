"""Fan-out: one streaming turn of 10,000 deltas to 1, 10 and 100 WebSocket clients.

    python -m bench fanout [--repeat 3]

The relay runs in a child process with the stream bench agent (bench/servers.py), which
yields 10,000 TextDelta events as fast as the loop lets it, each carrying its emission
time. Before them the message's first delta comes alone ("first <time>", not counted):
the relay stores the message's entry when its first delta arrives, and the counted deltas
follow once that one is published, as a model's next tokens come long after the relay
stored the entry. (Until session 5 the 10,000 came at once: those emitted during that
database write, 8-113 ms in three runs, waited for it, 78-1,810 of them over 5 ms, which
made the 1-client p99; the first delta's delay is printed apart, `first`.) The baseline
sends a first delta too, then pauses 1 ms (the least the relay's agent waits).

The baseline, in its own child process, is a minimal `websockets` server that
produces 10,000 small JSON messages of the same shape, one per loop turn, and batches as
the relay does (app/hub.py, app/routes/ws.py): each event is encoded once and queued for
every client; the clients' senders are woken once per burst (while each loop turn brings
a new event, up to 0.3 ms or as long as the last sending took, the hub's HOLD rule); a
woken sender sends what waits (at most 256 events) as one frame, a lone event as an
object, several as a JSON array. (A baseline sending one frame per event per client
pays a frame and a syscall per event per client and flattered the relay 3-20x.) Both
servers run on uvloop. The baseline encodes with the relay's encoder (`app.hub.encode`:
`json.dumps` with options builds an encoder per call, ~1.7 µs more per event) and takes a
lagging client's oldest 256 messages without copying the rest into a new list each frame.
It queues each message for every client (a minimal server's way); the relay appends each
event once to its conversation's stream, and tabs at the same place share one frame.

The clients are real `websockets` asyncio clients, all in this process, away from the
servers': on two cores, clients sharing the server's process (and its GIL) would measure
their own work as much as the server's. They do not offer permessage-deflate: one process
inflating every frame of 100 clients would be the bottleneck for both servers alike.
Figures per case: events/s (10,000 over the time from the first emission to the last
client's receipt of the last delta) and the p50/p99 delay from an event's emission to a
client's receipt (all clients' events pooled). Each case runs relay then baseline,
`repeat` times; the table takes medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import uvloop
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve

from app.hub import HOLD, encode
from bench.common import (
    ROOT,
    Relay,
    Row,
    at_least,
    at_most,
    free_port,
    median,
    percentile,
)

COMMAND = "python -m bench fanout"
CLIENTS = (1, 10, 100)
DELTAS = 10_000
BATCH = 256  # events in one frame at most, as app/routes/ws.py's MAX_BATCH
TIMEOUT = 600.0
DELTA_TEXT = re.compile(rb'"text":"(\d+\.\d+)"')  # only deltas carry a bare number as text
DELTA = b'"type":"delta"'
FIRST = re.compile(rb'"text":"first (\d+\.\d+)"')  # a message's first delta, not counted
FIRST_WAIT = 0.001  # the baseline's pause after the first delta (the relay's agent's least)
RENDERED = b'"text":"","html":'  # a delta carrying the rendering (html) of the text so far, no text
RESYNC = b'"type":"resync"'


Frames = list[tuple[float, bytes]]  # what one client received: (receipt time, raw frame)


class FellBehind(Exception):
    """A client was told to resync: it did not get every event."""


@dataclass(frozen=True)
class Result:
    """One fan-out run."""

    events_per_second: float
    p50: float
    p99: float
    first: float = 0.0  # the delay of the message's first delta (uncounted), the slowest client's


async def _collect(ws: ClientConnection, count: int) -> Frames:
    """Receive frames until they held `count` deltas; keep each with its receipt time.

    One Python process plays every client, so the receiving loop does the least that still
    timestamps every event: it keeps the raw frame and counts the deltas in it. The
    emission times are read out of the frames once every client is done (_result).
    """
    frames: Frames = []
    seen = 0
    while seen < count:
        raw = await ws.recv(decode=False)
        frames.append((time.perf_counter(), raw))
        # Neither the relay's rendering deltas (html, empty text) nor the first delta (it
        # comes alone, see bench/servers.py's StreamAgent) are among the `count`.
        seen += raw.count(DELTA) - raw.count(RENDERED) - raw.count(b'"text":"first ')
        if RESYNC in raw:
            raise FellBehind(raw.decode())
    return frames


def _result(clients: list[Frames], count: int) -> Result:
    """Events/s and delays of one run, every client's events pooled."""
    delays: list[float] = []
    first, last, first_delay = float("inf"), 0.0, 0.0
    for frames in clients:
        for received, raw in frames:
            if found := FIRST.search(raw):
                first_delay = max(first_delay, received - float(found[1]))
            stamps = [float(stamp) for stamp in DELTA_TEXT.findall(raw)]
            if stamps:
                first = min(first, stamps[0])
                last = max(last, received)
                delays += [received - stamp for stamp in stamps]
    assert len(delays) == count * len(clients), (len(delays), count * len(clients))
    return Result(
        count / (last - first), percentile(delays, 0.5), percentile(delays, 0.99), first_delay
    )


async def _until(ws: ClientConnection, kind: str) -> None:
    """Read messages until one of this type (arrays included)."""
    while True:
        data = json.loads(await ws.recv())
        if any(m.get("type") == kind for m in (data if isinstance(data, list) else [data])):
            return


async def run_relay(relay: Relay, clients: int, count: int) -> Result:
    """One streaming turn through the relay to `clients` subscribed sockets."""
    conversation_id = relay.create(title=f"fan-out {clients}")
    sockets = [
        await connect(
            relay.ws_url, additional_headers=relay.ws_headers(), max_size=None, compression=None
        )
        for _ in range(clients)
    ]
    try:
        for ws in sockets:
            await _until(ws, "hello")
            await ws.send(json.dumps({"type": "subscribe", "conversation_id": conversation_id}))
            await _until(ws, "snapshot")
        tasks = [asyncio.create_task(_collect(ws, count)) for ws in sockets]
        status = await asyncio.to_thread(relay.send, conversation_id, f"stream {count}")
        assert status == 202, status
        collected = await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)
    finally:
        for ws in sockets:
            await ws.close()
        await asyncio.to_thread(relay.wait_idle, conversation_id)  # before the next run
    return _result(collected, count)


async def run_baseline(port: int, clients: int, count: int) -> Result:
    """The same fan-out from the minimal broadcast server."""
    url = f"ws://127.0.0.1:{port}/"
    sockets = [await connect(url, max_size=None, compression=None) for _ in range(clients)]
    try:
        for ws in sockets:
            await _until(ws, "hello")
        tasks = [asyncio.create_task(_collect(ws, count)) for ws in sockets]
        await sockets[0].send(f"go {count}")
        collected = await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)
    finally:
        for ws in sockets:
            await ws.close()
    return _result(collected, count)


# -- the baseline server (a child process) ---------------------------------------------------


class _Client:
    """One baseline connection: what waits for it, and the event that wakes its sender."""

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.pending: list[str] = []
        self.ready = asyncio.Event()

    async def send_forever(self) -> None:
        while True:
            await self.ready.wait()
            if len(self.pending) <= BATCH:  # all of it (the usual case), no copy
                batch, self.pending = self.pending, []
                self.ready.clear()
            else:  # behind: the oldest BATCH, the rest moved down in C (not copied to a new list)
                batch = self.pending[:BATCH]
                del self.pending[:BATCH]
            await self.ws.send(batch[0] if len(batch) == 1 else f"[{','.join(batch)}]")


class _Burst:
    """Wake every client's sender once per burst of events (the relay hub's rule)."""

    def __init__(self, clients: set[_Client]) -> None:
        self.clients = clients
        self.published = 0
        self.waking: asyncio.Task[None] | None = None

    def publish(self, text: str) -> None:
        for client in self.clients:
            client.pending.append(text)
        self.published += 1
        if self.waking is None:
            self.waking = asyncio.get_running_loop().create_task(self._wake_after_burst())

    async def _wake_after_burst(self) -> None:
        clock, hold = time.perf_counter, HOLD
        try:
            while True:
                deadline, count = clock() + hold, self.published
                while True:
                    await asyncio.sleep(0)
                    if self.published == count or clock() >= deadline:
                        break
                    count = self.published
                started = clock()
                for client in self.clients:
                    client.ready.set()
                await asyncio.sleep(0)
                if self.published == count:
                    return
                hold = max(HOLD, clock() - started)
        finally:
            self.waking = None


async def _baseline_server(port: int) -> None:
    clients: set[_Client] = set()
    burst = _Burst(clients)

    async def stream(count: int) -> None:
        clock = time.perf_counter
        # The first delta alone, as the relay's agent sends it (bench/servers.py's StreamAgent).
        first = {"type": "delta", "entry_id": 1, "text": f"first {clock():.7f}"}
        burst.publish(encode(first | {"seq": 0, "conversation_id": 1}))
        await asyncio.sleep(FIRST_WAIT)
        for seq in range(1, count + 1):
            event = {"type": "delta", "entry_id": 1, "text": f"{clock():.7f}"}
            event |= {"seq": seq, "conversation_id": 1}
            burst.publish(encode(event))  # encoded once for all, by the relay's own encoder
            await asyncio.sleep(0)

    async def handler(ws: ServerConnection) -> None:
        client = _Client(ws)
        clients.add(client)
        sender = asyncio.get_running_loop().create_task(client.send_forever())
        try:
            await ws.send('{"type":"hello"}')
            async for message in ws:
                if isinstance(message, str) and message.startswith("go "):
                    asyncio.get_running_loop().create_task(stream(int(message[3:])))
        finally:
            clients.discard(client)
            sender.cancel()

    async with serve(handler, "127.0.0.1", port, max_size=None) as server:
        await server.serve_forever()


class Baseline:
    """`python -m bench.fanout baseline --port P` in a child process."""

    def __init__(self) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "bench.fanout", "baseline", "--port", str(self.port)]
        self.process = subprocess.Popen(command, cwd=ROOT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("the baseline server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server."""
        self.process.terminate()
        self.process.wait(timeout=10)


# -- the measurement -------------------------------------------------------------------------


FELL_BEHIND: dict[int, int] = {}  # relay runs per client count whose tabs were told to resync


async def measure(repeat: int, count: int) -> dict[int, dict[str, list[Result]]]:
    """Every case, relay and baseline taking turns; results per client count."""
    results: dict[int, dict[str, list[Result]]] = {}
    FELL_BEHIND.clear()
    with tempfile.TemporaryDirectory(prefix="oarlock-fanout-") as tmp:
        relay = Relay(Path(tmp) / "data", "stream")
        baseline = Baseline()
        try:
            for clients in CLIENTS:
                runs: dict[str, list[Result]] = {"relay": [], "baseline": []}
                for _ in range(repeat):
                    try:
                        runs["relay"].append(await run_relay(relay, clients, count))
                    except FellBehind:  # a failed run, not a crash of the whole bench
                        FELL_BEHIND[clients] = FELL_BEHIND.get(clients, 0) + 1
                        print(f"fanout {clients:>3} clients    relay: fell behind", file=sys.stderr)
                    runs["baseline"].append(await run_baseline(baseline.port, clients, count))
                results[clients] = runs
                for name, found in runs.items():
                    shown = ", ".join(
                        f"{r.events_per_second:,.0f}/s p50 {r.p50 * 1e3:.1f} p99 {r.p99 * 1e3:.1f}"
                        f" first {r.first * 1e3:.1f}"
                        for r in found
                    )
                    print(f"fanout {clients:>3} clients {name:>8}: {shown}", file=sys.stderr)
        finally:
            relay.stop()
            baseline.stop()
    return results


def rows(results: dict[int, dict[str, list[Result]]], count: int) -> list[Row]:
    """Two rows per client count: throughput ratio and p99 ratio."""
    table: list[Row] = []
    for clients, runs in results.items():
        relay, base = runs["relay"], runs["baseline"]
        label = f"{clients} client{'s' if clients > 1 else ''}"
        fell = FELL_BEHIND.get(clients, 0)
        if fell:  # the relay dropped a tab's queue (resync): that case fails, whatever the rest
            done = len(relay)
            figures = f"the relay's tabs fell behind (resync) in {fell} of {fell + done} runs"
            for what in ("events/s", "p99 delay"):
                measure = f"Fan-out {count:,} deltas, {label}: {what}, relay ÷ baseline"
                table.append(Row(measure, None, figures, "no resync", False, COMMAND))
            continue
        rate = median(r.events_per_second for r in relay)
        base_rate = median(r.events_per_second for r in base)
        p50, p99 = median(r.p50 for r in relay), median(r.p99 for r in relay)
        base_p50, base_p99 = median(r.p50 for r in base), median(r.p99 for r in base)
        table.append(
            at_least(
                f"Fan-out {count:,} deltas, {label}: events/s, relay ÷ baseline",
                rate / base_rate,
                0.8,
                f"relay {rate:,.0f}/s, baseline {base_rate:,.0f}/s",
                COMMAND,
            )
        )
        table.append(
            at_most(
                f"Fan-out {count:,} deltas, {label}: p99 delay, relay ÷ baseline",
                p99 / base_p99,
                1.5,
                f"relay p50 {p50 * 1e3:.1f} / p99 {p99 * 1e3:.1f} ms; "
                f"baseline p50 {base_p50 * 1e3:.1f} / p99 {base_p99 * 1e3:.1f} ms",
                COMMAND,
            )
        )
    return table


def run(repeat: int = 3, count: int = DELTAS) -> list[Row]:
    """Measure and return the table's rows."""
    return rows(uvloop.run(measure(repeat, count)), count)


def main(argv: list[str] | None = None) -> None:
    """`baseline --port P` serves the baseline; anything else is handled by bench."""
    parser = argparse.ArgumentParser(prog="python -m bench.fanout")
    parser.add_argument("role", choices=["baseline"])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvloop.run(_baseline_server(args.port))


if __name__ == "__main__":
    main(sys.argv[1:])
