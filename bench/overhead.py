"""Relay overhead per turn, with the real Claude Code CLI and the fake Messages API.

    python -m bench overhead [--turns 15]   (three runs of that many turns)

Through the relay: POST a message, then wait on a subscribed WebSocket for the turn event
that says idle (nothing queued): user message in, result out, as a browser sees it.
Directly: the same CLI driven by claude_agent_sdk's ClaudeSDKClient with the options the
relay's adapter uses (stream-json, partial messages, the claude_code system prompt, the
permission callback, the relay's tools as an in-process MCP server loaded up front) and its
prompt as the adapter sends it (a user message with its own uuid): query(), then
receive_response() until the ResultMessage.

Both CLIs are warm (two turns each first), both talk to one fake API in its own process,
and the turns come in pairs, each side going first in every other pair. The relay asks
the CLI for its context report once per process, after its first turn: the warm-up turns
cover it, so no report overlaps a timed turn. A run's figure is the ratio of its medians;
the row is the median of three runs (each with its own relay, CLIs and fake API), since
one run of a 30-100 ms turn on a shared machine can be lucky.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from claude_agent_sdk import (
    ClaudeAgentOptions,
    ClaudeSDKClient,
    PermissionResultAllow,
    ResultMessage,
)

from app.agents.claude_code import _tool_server, _user_message
from app.tools import ToolResult, relay_tools
from bench.common import Fake, Relay, Row, Tab, at_most, children, claude_env, median, ms

COMMAND = "python -m bench overhead"
TURNS = 15
RUNS = 3
WARMUP = 2
IDLE = {"state": "idle", "queued": 0}


class RelayClaude(Tab):
    """A claude conversation in a relay, followed by one WebSocket."""

    def __init__(self, relay: Relay) -> None:
        super().__init__(relay, relay.create("claude", "overhead"))

    async def turn(self, text: str) -> float:
        """One turn's time: POST until the idle turn event."""
        start = time.perf_counter()
        status = self.relay.send(self.conversation_id, text)  # 202 in a few ms: the loop waits
        assert status == 202, status
        await self.until(lambda m: m["type"] == "turn" and m["turn"] == IDLE)
        return time.perf_counter() - start

    def cli_pid(self) -> int:
        """The relay's CLI child (the relay also has its watcher process)."""
        (pid,) = [p for p in children(self.relay.pid) if _is_claude(p)]
        return pid

    async def close(self) -> None:
        """Close the socket."""
        if self.ws is not None:
            await self.ws.close()


async def _allow(*_args: Any) -> PermissionResultAllow:
    return PermissionResultAllow()


async def _unused(_arguments: dict[str, Any]) -> ToolResult:
    return ToolResult("not in this bench", is_error=True)


# The relay's tools, as the adapter hands them to its CLI (the same --mcp-config).
TOOLS = relay_tools(save_handoff=_unused, search_archive=_unused, read_archive=_unused)


class DirectClaude:
    """The same CLI driven by ClaudeSDKClient in this process."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        cwd.mkdir(parents=True, exist_ok=True)
        self.client = ClaudeSDKClient(
            ClaudeAgentOptions(
                cwd=str(cwd),
                permission_mode="default",
                can_use_tool=_allow,
                include_partial_messages=True,
                system_prompt={"type": "preset", "preset": "claude_code"},
                env=env,
                mcp_servers=_tool_server(TOOLS),
            )
        )

    async def open(self) -> None:
        """Start the CLI."""
        await self.client.connect()

    async def turn(self, text: str) -> float:
        """One turn's time: query until the ResultMessage."""
        start = time.perf_counter()
        await self.client.query(_user_message(text, str(uuid.uuid4())))
        async for message in self.client.receive_response():
            if isinstance(message, ResultMessage):
                assert not message.is_error, message
        return time.perf_counter() - start

    def cli_pid(self) -> int:
        """The CLI child of this process (the only one)."""
        (pid,) = [p for p in children(os.getpid()) if _is_claude(p)]
        return pid

    async def close(self) -> None:
        """Stop the CLI."""
        await self.client.disconnect()


def _is_claude(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "claude"
    except OSError:
        return False


async def measure(turns: int) -> dict[str, list[float]]:
    """Alternate relay and direct turns; the timed ones per side."""
    times: dict[str, list[float]] = {"relay": [], "direct": []}
    fake = Fake()
    try:
        with tempfile.TemporaryDirectory(prefix="oarlock-overhead-") as tmp:
            root = Path(tmp)
            relay = Relay(root / "data", "real", env=claude_env(root / "home-relay", fake))
            through = RelayClaude(relay)
            direct = DirectClaude(claude_env(root / "home-direct", fake), root / "direct")
            try:
                await through.open()
                await direct.open()
                for n in range(WARMUP + turns):
                    text = f"Turn {n}: please say hello back."
                    if n % 2:  # each side goes first in half the pairs
                        direct_time = await direct.turn(text)
                        relay_time = await through.turn(text)
                    else:
                        relay_time = await through.turn(text)
                        direct_time = await direct.turn(text)
                    if n >= WARMUP:
                        times["relay"].append(relay_time)
                        times["direct"].append(direct_time)
                    await asyncio.sleep(0.05)
            finally:
                await through.close()
                await direct.close()
                relay.stop()
    finally:
        fake.stop()
    for name, found in times.items():
        shown = ", ".join(f"{t * 1000:.0f}" for t in found)
        print(f"overhead {name:>6} ms: {shown}", file=sys.stderr)
    return times


def run(turns: int = TURNS, runs: int = RUNS) -> list[Row]:
    """Measure and return the table's row: the median run's ratio."""
    found = []
    for _ in range(runs):
        times = asyncio.run(measure(turns))
        relay, direct = median(times["relay"]), median(times["direct"])
        found.append((relay / direct, relay, direct))
    found.sort()
    ratio, relay, direct = found[len(found) // 2]
    shown = ", ".join(f"{r:.2f}" for r, _, _ in found)
    return [
        at_most(
            f"Turn with Claude Code + fake API, median of {runs} runs of {turns} turns: "
            "relay ÷ ClaudeSDKClient direct",
            ratio,
            1.10,
            f"median run: relay {ms(relay)}, direct {ms(direct)} (POST→idle turn event vs "
            f"query→result); runs {shown}",
            COMMAND,
        )
    ]
