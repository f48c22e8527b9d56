"""Memory: the relay with 1,000 conversations, and one live Claude Code agent process.

    python -m bench memory

Relay: two relays (no-op bench agent, no agent process) in child processes, one on an empty
database and one on 1,000 conversations of 20 entries each (seeded with SQL). Both get the
same requests: every page of the conversation list, then every conversation opened once
(GET /api/conversations/{id}) and given a message (so each has a runner, a turn's events
and a replay buffer, read before any idle release); then each one's VmRSS. The ratio is
loaded ÷ empty.

Touched: two relays (no-op bench agent, OARLOCK_AGENT_IDLE_TIMEOUT=2), one given a message
of 10 kB (so events that carry 10 kB) in each of 100 conversations and one in each of 10,000;
then both are left idle for three timeouts, and each one's VmRSS is read. The ratio is
10,000 ÷ 100: what stays is what the relay keeps per conversation it ever touched.

Agents under the budget: a relay with the real CLI, OARLOCK_AGENT_MEMORY=500 MiB (two CLIs),
given one turn in each of 3 (then, another relay, 10) conversations, then left idle for 60 s
(less than the idle timeout: only the budget stops agents). The figure is the RSS of the
relay's process tree (relay, its watcher, its agents' process trees) ÷ the relay's own
(relay and watcher); the target is (budget + relay) ÷ relay: the budget holds.

Agent: the Claude Code CLI after one turn against the fake Messages API, started by the
relay (its child; one per conversation) and started directly by ClaudeSDKClient (this
process's child), AGENT_PAIRS of each; the ratio is the median relay CLI ÷ the median direct
CLI (the relay should add nothing to an agent). One CLI read once moved by up to ~9 MiB
between runs (session 5): each is read AGENT_READS times, SETTLE s after the turns.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from app.agent_memory import MIB, tree_rss
from bench.common import (
    Fake,
    Http,
    Relay,
    Row,
    at_most,
    children,
    claude_env,
    median,
    rss_mib,
    seed,
)
from bench.overhead import DirectClaude, RelayClaude

COMMAND = "python -m bench memory"
CONVERSATIONS = 1_000
ENTRIES = 20
TOUCHED = (100, 10_000)
IDLE_TIMEOUT = 2.0  # seconds: OARLOCK_AGENT_IDLE_TIMEOUT of the touched relays
MESSAGE = "m" * 10_000
SENDERS = 4
AGENT_BUDGET_MIB = 500  # OARLOCK_AGENT_MEMORY of the agents' relays: two CLIs
AGENT_CONVERSATIONS = (3, 10)
AGENTS_IDLE = 60.0  # seconds the agents' relays stay idle before their RSS is read
AGENT_PAIRS = 3  # CLIs started by the relay, and as many directly
AGENT_READS = 3  # VmRSS reads of each CLI, 1 s apart
SETTLE = 3.5  # seconds after the last turn: a new CLI's context report is over (bench/warming.py)


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
            touch(loaded, CONVERSATIONS)  # runners, events and replay buffers, still held
            loaded.wait_idle(CONVERSATIONS)
            return rss_mib(empty.pid), rss_mib(loaded.pid)


def touch(relay: Relay, count: int) -> None:
    """Send one message to each of conversations 1..count (SENDERS threads), each acknowledged."""

    def sender(first: int) -> None:
        http = Http(relay.port)
        try:
            for cid in range(first, count + 1, SENDERS):
                status, _entry = http.request(
                    "POST", f"/api/conversations/{cid}/messages", {"text": MESSAGE}
                )
                assert status == 202, status
        finally:
            http.close()

    threads = [threading.Thread(target=sender, args=(n + 1,)) for n in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def touched_rss() -> tuple[float, float, float]:
    """VmRSS (MiB) of relays that had 100 and 10,000 conversations touched, and the seconds."""
    env = {**os.environ, "OARLOCK_AGENT_IDLE_TIMEOUT": str(IDLE_TIMEOUT)}
    with tempfile.TemporaryDirectory(prefix="oarlock-touched-") as tmp:
        root = Path(tmp)
        for count in TOUCHED:
            (root / str(count)).mkdir()
            seed(root / str(count) / "oarlock.db", count, 0)
        few, many = TOUCHED
        with (
            Relay(root / str(few), "noop", env=env) as small,
            Relay(root / str(many), "noop", env=env) as large,
        ):
            started = time.monotonic()
            touch(small, few)
            touch(large, many)
            took = time.monotonic() - started
            time.sleep(IDLE_TIMEOUT * 3)  # every turn over, every idle conversation released
            return rss_mib(small.pid), rss_mib(large.pid), took


def _is_claude(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "claude"
    except OSError:
        return False


def split_rss(relay_pid: int) -> tuple[float, float, int]:
    """MiB of the relay (with its watcher) and of its agents' process trees; live agents."""
    agents = [pid for pid in children(relay_pid) if _is_claude(pid)]
    agent_bytes = sum(tree_rss(pid) for pid in agents)
    return (tree_rss(relay_pid) - agent_bytes) / MIB, agent_bytes / MIB, len(agents)


def budget_rss() -> dict[int, tuple[float, float, int]]:
    """Per conversation count: relay MiB, agents MiB and live agents after the idle wait."""
    fake = Fake()
    found: dict[int, tuple[float, float, int]] = {}
    relays: list[tuple[int, Relay]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="oarlock-budget-") as tmp:
            root = Path(tmp)
            try:
                for count in AGENT_CONVERSATIONS:
                    env = claude_env(root / f"home-{count}", fake)
                    env["OARLOCK_AGENT_MEMORY"] = str(AGENT_BUDGET_MIB)
                    relay = Relay(root / f"data-{count}", "real", env=env)
                    relays.append((count, relay))
                    for n in range(count):
                        cid = relay.create("claude", f"budget {n}")
                        assert relay.send(cid, f"Turn in conversation {n}.") == 202
                        relay.wait_idle(cid, timeout=120)
                time.sleep(AGENTS_IDLE)  # both relays idle together
                for count, relay in relays:
                    found[count] = split_rss(relay.pid)
            finally:
                for _count, relay in relays:
                    relay.stop()
    finally:
        fake.stop()
    return found


async def read_each(pids: dict[str, list[int]]) -> dict[str, list[float]]:
    """Each process's median VmRSS (MiB) over AGENT_READS reads 1 s apart, per side."""
    reads: dict[int, list[float]] = {pid: [] for found in pids.values() for pid in found}
    for n in range(AGENT_READS):
        if n:
            await asyncio.sleep(1)
        for pid, found in reads.items():
            found.append(rss_mib(pid))
    return {side: [median(reads[pid]) for pid in found] for side, found in pids.items()}


async def agent_rss() -> tuple[float, float, list[float], list[float]]:
    """VmRSS (MiB) of the CLI after one turn, started by the relay and directly: medians.

    AGENT_PAIRS CLIs a side, their turns taking turns; each CLI read AGENT_READS times, 1 s
    apart, from SETTLE s after the last turn (past a new CLI's context report); a CLI's figure
    is the median of its reads, a side's the median of its CLIs. Also each CLI's figure.
    """
    fake = Fake()
    try:
        with tempfile.TemporaryDirectory(prefix="oarlock-memory-cli-") as tmp:
            root = Path(tmp)
            with Relay(root / "data", "real", env=claude_env(root / "home-relay", fake)) as relay:
                through = [RelayClaude(relay) for _ in range(AGENT_PAIRS)]
                direct = [
                    DirectClaude(claude_env(root / f"home-direct-{n}", fake), root / f"direct-{n}")
                    for n in range(AGENT_PAIRS)
                ]
                try:
                    for tab, cli in zip(through, direct, strict=True):
                        await tab.open()
                        await cli.open()
                        await tab.turn("Please say hello back.")
                        await cli.turn("Please say hello back.")
                    await asyncio.sleep(SETTLE)
                    pids = {
                        "relay": [p for p in children(relay.pid) if _is_claude(p)],
                        "direct": [p for p in children(os.getpid()) if _is_claude(p)],
                    }
                    assert [len(found) for found in pids.values()] == [AGENT_PAIRS] * 2, pids
                    each = await read_each(pids)
                    return (
                        median(each["relay"]),
                        median(each["direct"]),
                        each["relay"],
                        each["direct"],
                    )
                finally:
                    for tab in through:
                        await tab.close()
                    for cli in direct:
                        await cli.close()
    finally:
        fake.stop()


def run() -> list[Row]:
    """Measure and return the table's rows."""
    empty, loaded = relay_rss()
    few, many, took = touched_rss()
    relay_cli, direct_cli, relay_each, direct_each = asyncio.run(agent_rss())
    budgets = budget_rss()
    rows = [
        at_most(
            f"Relay RSS, {CONVERSATIONS:,} conversations listed, opened and given a message "
            "÷ empty database",
            loaded / empty,
            1.5,
            f"{loaded:.0f} MiB with {CONVERSATIONS:,} conversations, {empty:.0f} MiB empty; "
            "no agent process",
            COMMAND,
        ),
        at_most(
            f"Relay RSS after touching {TOUCHED[1]:,} conversations with events ÷ after "
            f"{TOUCHED[0]:,}",
            many / few,
            1.2,
            f"{many:.0f} MiB after {TOUCHED[1]:,}, {few:.0f} MiB after {TOUCHED[0]:,} (a 10 kB "
            f"message each, {took:.0f} s; idle timeout {IDLE_TIMEOUT:g} s, read after "
            f"{IDLE_TIMEOUT * 3:g} s idle)",
            COMMAND,
        ),
        at_most(
            "RSS of one live Claude Code CLI after a turn: relay's ÷ ClaudeSDKClient's",
            relay_cli / direct_cli,
            1.1,
            f"relay's CLI {relay_cli:.0f} MiB, direct CLI {direct_cli:.0f} MiB (medians of "
            f"{AGENT_PAIRS} CLIs a side, each read {AGENT_READS} times {SETTLE:g}-"
            f"{SETTLE + AGENT_READS - 1:g} s after the turns; each: relay "
            f"{', '.join(f'{x:.0f}' for x in relay_each)}, direct "
            f"{', '.join(f'{x:.0f}' for x in direct_each)} MiB)",
            COMMAND,
        ),
    ]
    for count, (relay, agents, live) in budgets.items():
        rows.append(
            at_most(
                f"RSS of the relay and its agents, {count} conversations touched then idle "
                f"{AGENTS_IDLE:g} s ÷ the relay alone (budget {AGENT_BUDGET_MIB} MiB)",
                (relay + agents) / relay,
                math.floor((AGENT_BUDGET_MIB + relay) / relay * 100) / 100,
                f"{relay + agents:.0f} MiB: relay {relay:.0f} MiB, {live} live CLI "
                f"{agents:.0f} MiB; target (budget + relay) ÷ relay",
                COMMAND,
            )
        )
    for row in rows:
        print(f"memory: {row.figures}", file=sys.stderr)
    return rows
