"""Conversation leases on a real PostgreSQL (started by the test): one owner, expiry, orphans."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from app import store
from app.cluster import leases
from app.db import get_session
from tests import postgres


@pytest.fixture
def url() -> Iterator[str]:
    """A new PostgreSQL database whatever OARLOCK_TEST_DB says (`engine` migrates it)."""
    url = postgres.start().create_database()
    try:
        yield url
    finally:
        postgres.start().drop_database(url)


def conversation(engine: Engine, *, queued: bool = False, state: str | None = None) -> int:
    """A conversation; with a queued message, or an entry in the given state."""
    with get_session(engine) as session:
        made = store.create_conversation(
            session=session, title="T", provider="demo", cwd="/w", permission_mode="default"
        )
        if queued:
            state = "queued"
        if state is not None:
            store.add_entry(
                session=session, conversation=made, seq=1, kind="user", text="hi", state=state
            )
        return made.id or 0


def expire(engine: Engine, cid: int) -> None:
    """Make a lease past its time, as a node that stopped renewing it would leave it."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE lease SET expires_at = now() - interval '1 second'"
                " WHERE conversation_id = :c"
            ),
            {"c": cid},
        )


def test_one_node_holds_a_lease_until_it_expires(engine: Engine) -> None:
    cid = conversation(engine)
    assert leases.acquire(engine, cid, "a", 30)
    assert leases.acquire(engine, cid, "a", 30)  # its own: extended
    assert not leases.acquire(engine, cid, "b", 30)
    assert leases.owner(engine, cid) == "a"
    expire(engine, cid)
    assert leases.owner(engine, cid) is None
    assert leases.renew(engine, "a", 30, {cid}) == set()  # too late: not renewed
    assert leases.acquire(engine, cid, "b", 30)
    assert leases.owner(engine, cid) == "b"
    leases.release(engine, cid, "a")  # not a's any more: nothing happens
    assert leases.owner(engine, cid) == "b"
    leases.release(engine, cid, "b")
    assert leases.owner(engine, cid) is None


def test_of_nodes_racing_for_a_lease_exactly_one_gets_it(engine: Engine) -> None:
    cid = conversation(engine)
    results: dict[str, bool] = {}
    start = threading.Barrier(8)

    def race(node: str) -> None:
        start.wait()
        results[node] = leases.acquire(engine, cid, node, 30)

    threads = [threading.Thread(target=race, args=(f"n{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [node for node, won in results.items() if won]
    assert len(winners) == 1
    assert leases.owner(engine, cid) == winners[0]


def test_renew_keeps_only_live_leases_and_orphans_are_work_without_one(engine: Engine) -> None:
    idle = conversation(engine)
    waiting = conversation(engine, queued=True)
    held = conversation(engine, queued=True)
    assert leases.acquire(engine, held, "a", 30)
    assert leases.acquire(engine, idle, "a", 30)
    assert leases.renew(engine, "a", 30, {held}) == {held}  # only what the node knows it holds
    assert leases.renew(engine, "a", 30, {held, idle, waiting}) == {held, idle}
    assert [cid for cid, _ in leases.orphans(engine)] == [waiting]  # idle has no work
    expire(engine, held)
    assert [cid for cid, _ in leases.orphans(engine)] == [waiting, held]
    leases.release_all(engine, "a")
    assert leases.renew(engine, "a", 30, {held, idle}) == set()
    assert leases.renew(engine, "a", 30, set()) == set()


def test_an_idle_lease_goes_back_unless_a_message_waits(engine: Engine) -> None:
    idle, waiting = conversation(engine), conversation(engine, queued=True)
    for cid in (idle, waiting):
        assert leases.acquire(engine, cid, "a", 30)
    assert not leases.release_idle(engine, idle, "b")  # not b's
    assert leases.release_idle(engine, idle, "a")
    assert not leases.release_idle(engine, waiting, "a")  # its message keeps it with a
    assert (leases.owner(engine, idle), leases.owner(engine, waiting)) == (None, "a")


def test_a_call_left_running_is_work_for_the_orphan_scan(engine: Engine) -> None:
    # A tool call or a compaction line a dead node left running: single-node recovery closed
    # it, a cluster's scan did not look for it.
    cid = conversation(engine, state="running")
    assert [found for found, _ in leases.orphans(engine)] == [cid]
