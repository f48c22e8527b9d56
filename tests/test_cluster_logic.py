"""The cluster's pure logic: event order across nodes, placement, settings (no servers)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.cluster import setting_error
from app.cluster.events import cancel_all
from app.cluster.node import can_run, session_reachable
from app.cluster.ordering import GAP_WAIT, Orderer, contiguous_top
from app.config import Settings


def test_events_are_handed_on_in_seq_order_whatever_order_they_arrive_in() -> None:
    order = Orderer(delivered=4)
    assert order.add(6, "six", now=0.0) == []  # 5 is still on its way (another node)
    assert order.add(5, "five", now=0.1) == [(5, "five"), (6, "six")]
    assert order.delivered == 6
    assert order.add(6, "six", now=0.2) == []  # a read overlapping another
    assert order.add(3, "three", now=0.2) == []  # before what was delivered


def test_a_hole_is_skipped_after_the_wait() -> None:
    order = Orderer(delivered=1)
    order.add(3, "three", now=10.0)
    assert order.expire(now=10.0 + GAP_WAIT / 2) == []
    assert order.expire(now=10.0 + GAP_WAIT) == [(3, "three")]
    assert order.since is None


def test_a_second_hole_waits_its_own_time() -> None:
    order = Orderer(delivered=1)
    order.add(3, "three", now=0.0)
    order.add(5, "five", now=0.0)
    assert order.expire(now=GAP_WAIT) == [(3, "three")]
    assert order.expire(now=GAP_WAIT + 0.1) == []  # 4 may still come
    assert order.add(4, "four", now=GAP_WAIT + 0.2) == [(4, "four"), (5, "five")]


def test_a_snapshot_claims_nothing_above_a_young_hole() -> None:
    now = 100.0
    assert contiguous_top([], now) is None
    assert contiguous_top([(7, now), (8, now)], now) == 8
    assert contiguous_top([(5, now), (6, now), (8, now)], now) == 6  # 7 may be in flight
    assert contiguous_top([(5, 0.0), (6, 0.0), (8, 0.0)], now) == 8  # an old hole: skipped


def test_a_node_takes_only_conversations_in_its_directories_and_within_its_limit(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine" / "project").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    roots = [tmp_path / "mine"]
    assert can_run(str(tmp_path / "mine" / "project"), roots, 0, None)
    assert not can_run(str(tmp_path / "other"), roots, 0, None)
    assert not can_run(str(tmp_path / "mine" / "missing"), roots, 0, None)  # not on this node
    assert not can_run(str(tmp_path / "mine" / "project"), roots, 2, 2)  # OARLOCK_MAX_AGENTS
    assert can_run(str(tmp_path / "mine" / "project"), roots, 1, 2)
    (tmp_path / "mine" / "loop").symlink_to(tmp_path / "mine" / "loop")
    assert not can_run(str(tmp_path / "mine" / "loop"), roots, 0, None)  # (was a RuntimeError)


def test_a_claude_session_is_reachable_only_where_its_transcript_is(tmp_path: Path) -> None:
    env = {"CLAUDE_CONFIG_DIR": str(tmp_path)}
    assert not session_reachable("claude", "abc-123", env)
    (tmp_path / "projects" / "-work-x").mkdir(parents=True)
    (tmp_path / "projects" / "-work-x" / "abc-123.jsonl").write_text("{}\n")
    assert session_reachable("claude", "abc-123", env)
    assert session_reachable("demo", "demo-1", env)


@pytest.mark.parametrize("url", [None, "sqlite:////tmp/x.db"])
def test_redis_without_postgresql_is_a_configuration_error(tmp_path: Path, url: str | None) -> None:
    settings = Settings(data_dir=tmp_path, database_url=url, redis_url="redis://127.0.0.1/0")
    error = setting_error(settings)
    assert error is not None and "needs a PostgreSQL database" in error


def test_postgresql_with_redis_and_either_alone_are_fine(tmp_path: Path) -> None:
    pg = "postgresql://oarlock@db/oarlock"
    token = "a-token-long-enough-0123"
    for url in (pg, "postgres://o@db/o"):
        settings = Settings(data_dir=tmp_path, database_url=url, redis_url="redis://r", token=token)
        assert setting_error(settings) is None
    assert setting_error(Settings(data_dir=tmp_path)) is None


def test_several_nodes_need_a_token_set(tmp_path: Path) -> None:
    # A node without OARLOCK_TOKEN makes one of its own, which the other nodes refuse.
    pg = "postgresql://oarlock@db/oarlock"
    error = setting_error(Settings(data_dir=tmp_path, database_url=pg, redis_url="redis://r"))
    assert error is not None and "needs OARLOCK_TOKEN, the same on every node" in error


async def test_stopping_ends_a_task_that_loses_the_first_cancel() -> None:
    """redis-py can lose a cancel that lands while it sets up a connection: the task goes on.
    A node's stop awaited each task once cancelled: such a task kept it waiting for ever (the
    likely cause of two nodes, their control channel cut, not stopping within 30 s in tests).
    Cancelled again until it ends, it stops."""
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:  # lost, as redis-py may lose one
            swallowed.set()
        await asyncio.sleep(60)  # and on: to subscribe anew

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    started = time.monotonic()
    await cancel_all([task])
    assert swallowed.is_set() and task.cancelled()
    assert time.monotonic() - started < 1
