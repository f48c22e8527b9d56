"""The conversations whose leases a node holds, as its threads see them.

The loop, the storage writer and the lease renewal (a thread of its own, so that it never waits
behind writer jobs that wait on Redis) change it. Each taking of a lease gets a mark, so that
a renewal judges only the leases it asked about: one given back and taken anew while the
renewal's UPDATE ran is not lost, nor one given back (a lapse is a lease still held that the
UPDATE did not extend).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator


class Held:
    """A set of conversation ids, safe to change from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: dict[int, int] = {}  # conversation id → the mark of its lease's taking
        self._counter = itertools.count(1)

    def add(self, conversation_id: int) -> None:
        """The lease was taken (its row committed): held from now on."""
        with self._lock:
            self._marks[conversation_id] = next(self._counter)

    def discard(self, conversation_id: int) -> None:
        """Not held any more (given back, lapsed, deleted)."""
        with self._lock:
            self._marks.pop(conversation_id, None)

    def clear(self) -> None:
        """Nothing held (the node stops)."""
        with self._lock:
            self._marks.clear()

    def marks(self) -> dict[int, int]:
        """What is held now, each with its mark: what a renewal asks about."""
        with self._lock:
            return dict(self._marks)

    def lapsed(self, asked: dict[int, int], renewed: set[int]) -> set[int]:
        """Forget and return the leases asked about that the renewal did not extend.

        Only those still held under the same mark: one given back meanwhile is not lapsed, and
        one taken anew meanwhile (a new mark) was taken after the renewal looked.
        """
        with self._lock:
            lapsed = {
                cid
                for cid, mark in asked.items()
                if cid not in renewed and self._marks.get(cid) == mark
            }
            for cid in lapsed:
                del self._marks[cid]
        return lapsed

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._marks

    def __len__(self) -> int:
        return len(self._marks)

    def __iter__(self) -> Iterator[int]:
        """A copy's: the set may change meanwhile."""
        with self._lock:
            return iter(list(self._marks))
