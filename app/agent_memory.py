"""The agents' memory: what their processes hold, the budget, and which idle agents to stop.

An agent is counted by the resident memory (VmRSS) of its process and every descendant
(the Claude Code CLI and the shells it started). The demo agent has no process: it counts 0.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
AGENT_SIZE = 200 * MIB  # a live Claude Code CLI after a turn (bench/README.md: ~190-226 MiB)
BUDGET_SHARE = 0.25  # of MemTotal: agents never take more than a quarter of the machine
MIN_AGENTS = 2  # the default budget holds at least this many agents


def default_budget(mem_total: int) -> int:
    """A quarter of the machine's memory, rounded down to whole agents (at least two)."""
    agents = max(MIN_AGENTS, int(mem_total * BUDGET_SHARE) // AGENT_SIZE)
    return agents * AGENT_SIZE


def mem_total(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The machine's memory in bytes (MemTotal), or 0 when it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def parse_size(text: str) -> int:
    """Bytes from "800" (MiB), "800M", "800MiB", "2G", "2GiB" (case-insensitive)."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1024, "M": MIB, "G": 1024 * MIB, "T": 1024 * 1024 * MIB}
    unit = MIB
    if value and value[-1] in units:
        value, unit = value[:-1], units[value[-1]]
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number < 2**60:  # also NaN and infinity
        raise ValueError(f"{text!r} is not a memory size such as 1500 (MiB), 800M or 2G")
    return int(number * unit)


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0  # gone, or a zombie (no VmRSS line)


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        children += [int(child) for child in text.split()]
    return children


def tree_rss(pid: int | None) -> int:
    """Bytes resident in a process and all its descendants; 0 for no process."""
    if pid is None:
        return 0
    total, todo, seen = 0, [pid], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        total += _rss(current)
        todo += _children(current)
    return total


@dataclass(frozen=True)
class Live:
    """One live agent as the budget sees it."""

    conversation_id: int
    rss: int  # bytes, its process tree
    last_used: float  # monotonic time of its last use
    stoppable: bool  # idle: no turn, no start, no question, no background work


def to_stop(agents: Sequence[Live], budget: int, incoming: int = 0) -> list[int]:
    """The idle agents to stop, least recently used first, so the rest (+ incoming) fit.

    Running agents are never chosen: when only they are left, the budget is exceeded.
    """
    total = sum(agent.rss for agent in agents) + incoming
    chosen: list[int] = []
    for agent in sorted((a for a in agents if a.stoppable), key=lambda a: a.last_used):
        if total <= budget:
            break
        chosen.append(agent.conversation_id)
        total -= agent.rss
    return chosen


def fits(agents: Sequence[Live], budget: int, incoming: int = 0) -> bool:
    """Whether the agents that cannot be stopped, and the incoming, fit the budget (so that
    stopping the idle ones, as to_stop picks them, makes room)."""
    return sum(agent.rss for agent in agents if not agent.stoppable) + incoming <= budget


def starting_size(sizes: Iterable[int], count: int) -> int:
    """What `count` agents about to start will hold: each as much as the largest live agent,
    or AGENT_SIZE when none is live (so that starts at the same moment are all counted)."""
    if count <= 0:
        return 0
    return count * max(sizes, default=AGENT_SIZE)
