"""Put a conversation's events back in seq order as they arrive from its stream.

Numbers are taken (INCR) before the database write and appended (XADD) after the commit,
so two nodes writing one conversation may append 6 before 5. Each node delivers a
conversation's events in seq order: a later one waits for the missing one, at most GAP_WAIT
seconds (a node that died between taking a number and appending it leaves a hole forever);
then the hole is skipped and the tabs that see it ask again (replay or snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass, field

GAP_WAIT = 2.0  # seconds a hole in the numbering is waited for


@dataclass
class Orderer:
    """The seq order of one conversation's events on one node."""

    delivered: int  # the last seq handed on
    waiting: dict[int, str] = field(default_factory=dict)  # seq -> JSON text, beyond a hole
    since: float | None = None  # when the current hole was first seen

    def add(self, seq: int, text: str, now: float) -> list[tuple[int, str]]:
        """Take an arrived event; the events now deliverable, in order."""
        if seq <= self.delivered or seq in self.waiting:
            return []  # seen already (a read overlapping another)
        self.waiting[seq] = text
        return self._run(now)

    def expire(self, now: float) -> list[tuple[int, str]]:
        """Skip a hole waited for longer than GAP_WAIT; the events delivered past it."""
        if not self.waiting or self.since is None or now - self.since < GAP_WAIT:
            return []
        self.delivered = min(self.waiting) - 1
        return self._run(now)

    def skip(self) -> list[tuple[int, str]]:
        """Skip every hole at once (events known lost): all that waited, in order."""
        out = sorted(self.waiting.items())
        if out:
            self.delivered = out[-1][0]
        self.waiting.clear()
        self.since = None
        return out

    def _run(self, now: float) -> list[tuple[int, str]]:
        out = []
        while self.delivered + 1 in self.waiting:
            self.delivered += 1
            out.append((self.delivered, self.waiting.pop(self.delivered)))
        if not self.waiting:
            self.since = None
        elif out or self.since is None:
            self.since = now  # a new hole: its wait starts now
        return out


def contiguous_top(seqs: list[tuple[int, float]], now: float) -> int | None:
    """The highest seq a snapshot may claim from a stream's tail of (seq, appended at) pairs.

    Below a recent hole (younger than GAP_WAIT) nothing above it counts yet: the missing
    event may still be on its way. None for an empty tail.
    """
    if not seqs:
        return None
    ordered = sorted(seqs)
    top = ordered[-1][0]
    for index in range(len(ordered) - 1, 0, -1):
        seq, at = ordered[index]
        below = ordered[index - 1][0]
        if below != seq - 1 and now - at < GAP_WAIT:
            top = below  # a young hole under seq: claim only what is under it
    return top
