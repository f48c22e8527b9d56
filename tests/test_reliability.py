"""The crash-safety experiment at a small N (make reliability runs the full one)."""

from __future__ import annotations

from pathlib import Path

from bench.reliability import run
from tests import postgres


def test_kills_lose_nothing_and_duplicate_nothing(tmp_path: Path) -> None:
    # OARLOCK_TEST_DB=postgres: the relay child processes use a fresh PostgreSQL database.
    tally = run(kills=3, seed=7, workdir=tmp_path, database_url=postgres.database_url(tmp_path))
    print(tally.line())
    assert tally.kills == 3
    assert len(tally.acked) > 0
    assert (tally.lost, tally.duplicated, tally.misordered) == (0, 0, 0)
    assert (tally.half_compacted, tally.integrity_failures) == (0, 0)
    assert (tally.undelivered, tally.unanswered, tally.answered_twice) == (0, 0, 0)
    # every acknowledged message is accounted for: answered once, or cut with a line
    assert tally.answered_once + tally.cut_with_line == len(tally.acked)
