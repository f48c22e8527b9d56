"""A turn that writes a backup vs a turn that does not (SPEC §6: backups are off the turn's path).

    python -m bench backups [--turns 30]

One relay in a child process with the `usage` bench agent (it replies at once and reports
the context figure its prompt names, of a 1M window), on a database seeded with two
conversations of ENTRIES timeline entries each (a long conversation: the backup reads every
user message and tool call of it). Conversation A's figures climb 10,000 a turn from
50,000, so every A turn fires the token rail and writes a backup; B's stay at 1,000 and
never do. A turn is timed from the POST to the idle turn event on a subscribed WebSocket.
Turns alternate A, B, A, B …; after each A turn the bench waits (untimed) for its backup
file, so no backup is still being written while a B turn runs. The figure is the ratio of
the medians.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Relay, Row, Tab, at_most, median, ms, seed

COMMAND = "python -m bench backups"
TURNS = 30
WARMUP = 2
ENTRIES = 4_000
IDLE = {"state": "idle", "queued": 0}


class Followed(Tab):
    """A conversation of the relay, followed by one WebSocket."""

    async def turn(self, text: str) -> float:
        """One turn's time: POST until the idle turn event."""
        start = time.perf_counter()
        status = self.relay.send(self.conversation_id, text)
        assert status == 202, status
        await self.until(lambda m: m["type"] == "turn" and m["turn"] == IDLE)
        return time.perf_counter() - start

    def backups(self) -> int:
        """How many backups the conversation has."""
        path = f"/api/conversations/{self.conversation_id}/backups"
        status, body = self.relay.http.request("GET", path)
        assert status == 200, body
        return len(body["backups"])

    async def wait_backups(self, count: int) -> None:
        """Wait (untimed) until the conversation has count backups."""
        deadline = time.monotonic() + 60
        while self.backups() < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"conversation {self.conversation_id}: no backup {count}")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Close the socket."""
        if self.ws is not None:
            await self.ws.close()


async def measure(turns: int) -> dict[str, list[float]]:
    """Alternate backup and plain turns; the timed ones per side."""
    times: dict[str, list[float]] = {"backup": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="oarlock-backups-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        seed(data / "oarlock.db", 2, ENTRIES)
        relay = Relay(data, "usage")
        backing, plain = Followed(relay, 1), Followed(relay, 2)
        try:
            await backing.open()
            await plain.open()
            for n in range(WARMUP + turns):
                backup_time = await backing.turn(f"usage {50_000 + n * 10_000}")
                await backing.wait_backups(n + 1)
                plain_time = await plain.turn("usage 1000")
                if n >= WARMUP:
                    times["backup"].append(backup_time)
                    times["plain"].append(plain_time)
            assert plain.backups() == 0
        finally:
            await backing.close()
            await plain.close()
            relay.stop()
    for name, found in times.items():
        shown = ", ".join(f"{t * 1000:.1f}" for t in found)
        print(f"backups {name:>6} ms: {shown}", file=sys.stderr)
    return times


def run(turns: int = TURNS) -> list[Row]:
    """Measure and return the table's row."""
    times = asyncio.run(measure(turns))
    with_backup, without = median(times["backup"]), median(times["plain"])
    return [
        at_most(
            f"Turn that writes a backup ÷ turn that does not ({ENTRIES:,}-entry conversations,"
            f" median of {turns})",
            with_backup / without,
            1.1,
            f"with a backup {ms(with_backup)}, without {ms(without)} (POST→idle turn event)",
            COMMAND,
        )
    ]


if __name__ == "__main__":
    for row in run():
        print(row.cells())
