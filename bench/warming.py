"""First reply after the agent went to sleep: warmed while the user types ÷ already warm.

    python -m bench warming

One relay (child process) with the real Claude Code CLI against the fake Messages API,
OARLOCK_AGENT_IDLE_TIMEOUT=5, one conversation followed by one WebSocket as a tab. The time
is from the POST of a message to the first `delta` of its reply (the first reply text a
browser shows). Three cases take turns, each after one untimed turn so the session exists:

- warm: the agent has just finished a turn (its CLI, which resumed the session, is live;
  REPORT s later: after a new CLI's first turn the relay asks it for its context report
  once, 26 `count_tokens` requests, and a turn sent meanwhile waits behind them; 44-50 ms
  at load 1-2 (1.3-2.3 s before session 35: the fake's listen backlog of 5 made the CLI's
  connections past the fifth wait 1 s for the kernel to take them));
- warming: the agent went to sleep (the tab saw `"agent": "asleep"`), then the tab sends
  `{"type": "warm"}` as the UI does on the first keystroke, and the POST comes 1 s later;
- cold (a figure, no target): asleep, no warm-up: the CLI starts after the POST.

The row is the median warming time ÷ the median warm time.

Beside it, as figures (issue 18 asked where the time goes), the same CLI without the relay:
ClaudeSDKClient resumes the session in a fresh CLI (spawn and initialize, timed), waits
TYPING, then sends two queries; each is timed from query() to its first text delta. The
CLI's first query after its start is slower than the next ones in the CLI itself (it sends
no API request in between: the work is its own). The relay's warm-up now sends the CLI a
prompt that a hook stops before the model, which pre-pays part of it (bench/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeSDKClient, ResultMessage
from claude_agent_sdk.types import StreamEvent

from bench.common import Fake, Relay, Row, Tab, at_most, claude_env, median, ms
from bench.overhead import DirectClaude

COMMAND = "python -m bench warming"
ROUNDS = 5
TYPING = 1.0  # seconds from the first keystroke (warm) to Enter (POST)
IDLE_TIMEOUT = 5.0  # longer than REPORT: the warm case's agent must not fall asleep first
REPORT = 1.0  # seconds after a new CLI's first turn: its context report is over
IDLE = {"state": "idle", "queued": 0}


def first_text(m: dict[str, Any]) -> bool:
    """True for the event that brings a reply's first text to a tab."""
    if m["type"] == "delta":
        return True
    entry = m.get("entry") if m["type"] == "entry" else None
    return bool(entry and entry["kind"] == "agent" and entry["text"])


class Typist(Tab):
    """A tab whose user types before pressing Enter; it notes when its agent said ready."""

    ready_at: float | None = None  # when the agent last said "ready" (perf_counter)

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], seconds: float = 120
    ) -> None:
        def noted(m: dict[str, Any]) -> bool:
            if m["type"] == "agent" and m["agent"] == "ready":
                self.ready_at = time.perf_counter()
            return predicate(m)

        await super().until(noted, seconds)

    async def first_reply(self, text: str) -> float:
        """Seconds from the POST to the reply's first text; then the turn is waited for.

        The first text is a delta, or the agent's whole message when it came in one burst
        (the relay then stores and sends it once, with no deltas).
        """
        start = time.perf_counter()
        status = await asyncio.to_thread(self.relay.send, self.conversation_id, text)
        assert status == 202, status
        await self.until(first_text)
        elapsed = time.perf_counter() - start
        await self.until(lambda m: m["type"] == "turn" and m["turn"] == IDLE)
        return elapsed

    async def asleep(self) -> None:
        await self.until(lambda m: m["type"] == "agent" and m["agent"] == "asleep")

    async def warm_and_type(self) -> float:
        """Send a warm-up, then read events for TYPING s; the time the warm-up began.

        Checks that the warm-up had its second: the relay answered it before Enter.
        """
        assert self.ws is not None
        start, self.ready_at = time.perf_counter(), None
        await self.ws.send(json.dumps({"type": "warm", "conversation_id": self.conversation_id}))
        answered = False

        def seen(m: dict[str, Any]) -> bool:
            nonlocal answered
            answered = answered or m["type"] == "warm"
            return False

        with contextlib.suppress(TimeoutError):
            await self.until(seen, TYPING)
        assert answered, "the relay did not answer the warm-up within the typing time"
        return start

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


async def first_delta(client: ClaudeSDKClient, text: str) -> tuple[float, str | None]:
    """Seconds from query() to the first text delta; and the session id of the result."""
    start, elapsed, session = time.perf_counter(), 0.0, None
    await client.query(text)
    async for message in client.receive_response():
        kind = message.event.get("type") if isinstance(message, StreamEvent) else None
        if not elapsed and kind == "content_block_delta":
            elapsed = time.perf_counter() - start
        if isinstance(message, ResultMessage):
            session = message.session_id
    return elapsed, session


async def direct(fake: Fake, root: Path, rounds: int) -> dict[str, list[float]]:
    """The CLI alone: its start (resuming), then its first and second query's first delta."""
    times: dict[str, list[float]] = {"start": [], "first": [], "second": []}
    env = claude_env(root / "home-direct", fake)
    cli = DirectClaude(env, root / "direct")
    await cli.open()
    _, session = await first_delta(cli.client, "Start the session.")
    await cli.close()
    for n in range(rounds):
        cli = DirectClaude(env, root / "direct")
        cli.client.options.resume = session  # as the relay's adapter resumes a conversation
        start = time.perf_counter()
        await cli.open()
        times["start"].append(time.perf_counter() - start)
        await asyncio.sleep(TYPING)
        for name in ("first", "second"):
            elapsed, session = await first_delta(cli.client, f"Direct {name} {n}.")
            times[name].append(elapsed)
        await cli.close()
    return times


async def measure(rounds: int) -> dict[str, list[float]]:
    """Warm, warming and cold first replies, taking turns."""
    times: dict[str, list[float]] = {"warm": [], "warming": [], "cold": [], "ready": []}
    fake = Fake()
    try:
        with tempfile.TemporaryDirectory(prefix="oarlock-warming-") as tmp:
            root = Path(tmp)
            env = claude_env(root / "home", fake)
            env["OARLOCK_AGENT_IDLE_TIMEOUT"] = str(IDLE_TIMEOUT)
            with Relay(root / "data", "real", env=env) as relay:
                tab = Typist(relay, relay.create("claude", "warming"))
                await tab.open()
                try:
                    await tab.first_reply("Start the session.")
                    # Every warm case then runs on a CLI that resumed the session, as the
                    # others do (only those carry the warm-up hook), not on the new one.
                    await tab.asleep()
                    await tab.first_reply("Resume the session.")
                    for n in range(rounds):
                        # The relay asks a new CLI for its context report after its first
                        # turn: let it end, so that it does not slow the warm turn.
                        await asyncio.sleep(REPORT)
                        times["warm"].append(await tab.first_reply(f"Warm {n}."))
                        await tab.asleep()
                        warmed = await tab.warm_and_type()
                        times["warming"].append(await tab.first_reply(f"Warming {n}."))
                        assert tab.ready_at is not None  # the agent said ready before its reply
                        times["ready"].append(tab.ready_at - warmed)
                        await tab.asleep()
                        times["cold"].append(await tab.first_reply(f"Cold {n}."))
                finally:
                    await tab.close()
            times |= {
                f"CLI {name}": found for name, found in (await direct(fake, root, rounds)).items()
            }
    finally:
        fake.stop()
    for name, found in times.items():
        shown = ", ".join(f"{t * 1000:.0f}" for t in found)
        print(f"warming {name:>7} ms: {shown}", file=sys.stderr)
    return times


def run(rounds: int = ROUNDS) -> list[Row]:
    """Measure and return the table's row."""
    times = asyncio.run(measure(rounds))
    warm, warming, cold = (median(times[name]) for name in ("warm", "warming", "cold"))
    start, first, second = (median(times[f"CLI {name}"]) for name in ("start", "first", "second"))
    late = sum(1 for t in times["ready"] if t > TYPING)
    return [
        at_most(
            f"First reply after the agent went to sleep, warmed while typing ({TYPING:g} s "
            f"before Enter) ÷ agent already warm, median of {rounds}",
            warming / warm,
            1.5,
            f"warming {ms(warming)}, warm {ms(warm)}; without warming (cold) {ms(cold)} "
            f"(POST → first text: a delta, or the whole message if it came in one burst); "
            f"warming: the agent was ready {ms(median(times['ready']))} "
            f"after the warm-up ({late} of {rounds} times after Enter). "
            f"The CLI alone (ClaudeSDKClient, query → first delta): "
            f"start and resume {ms(start)}, then its first query {ms(first)}, "
            f"its second {ms(second)}",
            COMMAND,
        )
    ]
