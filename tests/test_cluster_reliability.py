"""The cluster reliability run, small: three nodes on PostgreSQL + Redis, kill -9 at random.

bench/reliability.py --cluster with a few kills (the README's figures come from --kills 20):
every acknowledged message stored once and in order, answered once or marked as cut.
"""

from __future__ import annotations

from pathlib import Path

from bench.reliability import run_cluster

KILLS = 8  # about a minute and a half on two busy cores


def test_killing_cluster_nodes_loses_misorders_and_double_answers_nothing(tmp_path: Path) -> None:
    tally = run_cluster(KILLS, seed=1, workdir=tmp_path, count=3)
    assert tally.kills == KILLS
    assert len(tally.acked) > 0
    found = {
        "lost": tally.lost,
        "duplicated": tally.duplicated,
        "misordered": tally.misordered,
        "half_compacted": tally.half_compacted,
        "undelivered": tally.undelivered,
        "unanswered": tally.unanswered,
        "answered_twice": tally.answered_twice,
        "integrity_failures": tally.integrity_failures,
    }
    assert found == dict.fromkeys(found, 0), tally.line()
