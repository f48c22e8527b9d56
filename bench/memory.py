"""Memory: the relay with 1,000 conversations, and one live Claude Code agent process.

    python -m bench memory

Relay: two relays (no-op bench agent, no agent process) in child processes, one on an empty
database and one on 1,000 conversations of 20 entries each (seeded with SQL). Both get the
same requests: every page of the conversation list, then every conversation opened once
(GET /api/conversations/{id}); then each one's VmRSS. The ratio is loaded ÷ empty.

Agent: the Claude Code CLI after one turn against the fake Messages API, started by the
relay (its child) and started directly by ClaudeSDKClient (this process's child); the
ratio is the relay's CLI ÷ the direct CLI (the relay should add nothing to an agent).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from bench.common import Fake, Relay, Row, at_most, claude_env, rss_mib, seed
from bench.overhead import DirectClaude, RelayClaude

COMMAND = "python -m bench memory"
CONVERSATIONS = 1_000
ENTRIES = 20


def load_everything(relay: Relay) -> int:
    """List every conversation page by page, then open each; how many there were."""
    ids: list[int] = []
    path = "/api/conversations?status=active&limit=500"
    while True:
        status, page = relay.http.request("GET", path)
        assert status == 200, status
        ids += [c["id"] for c in page["conversations"]]
        if page["next"] is None:
            break
        path = f"/api/conversations?status=active&limit=500&before={page['next']}"
    for conversation_id in ids:
        status, _view = relay.http.request("GET", f"/api/conversations/{conversation_id}")
        assert status == 200, status
    return len(ids)


def relay_rss() -> tuple[float, float]:
    """VmRSS (MiB) of the relay on an empty database and with 1,000 conversations."""
    with tempfile.TemporaryDirectory(prefix="oarlock-memory-") as tmp:
        root = Path(tmp)
        for name, count in (("empty", 0), ("loaded", CONVERSATIONS)):
            (root / name).mkdir()
            seed(root / name / "oarlock.db", count, ENTRIES)
        with Relay(root / "empty", "noop") as empty, Relay(root / "loaded", "noop") as loaded:
            assert (load_everything(empty), load_everything(loaded)) == (0, CONVERSATIONS)
            return rss_mib(empty.pid), rss_mib(loaded.pid)


async def agent_rss() -> tuple[float, float]:
    """VmRSS (MiB) of the CLI after one turn: started by the relay, and directly."""
    fake = Fake()
    try:
        with tempfile.TemporaryDirectory(prefix="oarlock-memory-cli-") as tmp:
            root = Path(tmp)
            with Relay(root / "data", "real", env=claude_env(root / "home-relay", fake)) as relay:
                through = RelayClaude(relay)
                direct = DirectClaude(claude_env(root / "home-direct", fake), root / "direct")
                try:
                    await through.open()
                    await direct.open()
                    await through.turn("Please say hello back.")
                    await direct.turn("Please say hello back.")
                    await asyncio.sleep(1)  # let both settle after the turn
                    return rss_mib(through.cli_pid()), rss_mib(direct.cli_pid())
                finally:
                    await through.close()
                    await direct.close()
    finally:
        fake.stop()


def run() -> list[Row]:
    """Measure and return the table's rows."""
    empty, loaded = relay_rss()
    relay_cli, direct_cli = asyncio.run(agent_rss())
    rows = [
        at_most(
            f"Relay RSS, {CONVERSATIONS:,} conversations listed and opened ÷ empty database",
            loaded / empty,
            1.5,
            f"{loaded:.0f} MiB with {CONVERSATIONS:,} conversations, {empty:.0f} MiB empty; "
            "no agent process",
            COMMAND,
        ),
        at_most(
            "RSS of one live Claude Code CLI after a turn: relay's ÷ ClaudeSDKClient's",
            relay_cli / direct_cli,
            1.1,
            f"relay's CLI {relay_cli:.0f} MiB, direct CLI {direct_cli:.0f} MiB (per agent)",
            COMMAND,
        ),
    ]
    for row in rows:
        print(f"memory: {row.figures}", file=sys.stderr)
    return rows
