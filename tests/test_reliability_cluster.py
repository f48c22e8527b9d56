"""The cluster mode of the crash-safety experiment at a small N (make reliability CLUSTER=3)."""

from __future__ import annotations

from pathlib import Path

from bench.reliability import run_cluster


def test_kill_9_of_random_nodes_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    # Three nodes on a throwaway PostgreSQL and Redis; senders pick nodes at random.
    tally = run_cluster(kills=2, seed=3, workdir=tmp_path, count=3)
    print(tally.line())
    assert tally.kills == 2
    assert len(tally.acked) > 0
    assert (tally.lost, tally.duplicated, tally.misordered) == (0, 0, 0)
    assert (tally.half_compacted, tally.integrity_failures) == (0, 0)
    assert (tally.undelivered, tally.unanswered, tally.answered_twice) == (0, 0, 0)
    assert tally.answered_once + tally.cut_with_line == len(tally.acked)
