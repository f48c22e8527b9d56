"""Every node on one Redis database: checked through PostgreSQL, which they all share.

Nodes whose OARLOCK_REDIS_URL names different Redis servers or databases (`/0` on one, `/1` on
another) share the conversations but not the events, the wake-ups, the node names or the
start-up checks: a tab on one node never sees what the other's agents do, and two processes
under one node name both hold its leases. Neither Redis can tell (each sees its own keys), so
each node writes its Redis's epoch (events.py: made by the first node on a Redis, new when that
Redis loses its data) and its lease in a row of its own at every heartbeat (`cluster_node`, the
database's clock). A node starting while a live node's row (its own name's included) names
another epoch is refused; a running node that sees one, or finds its own row written by
another process, logs it.

A Redis that lost its data (a restart without persistence) gets a new epoch, which its nodes
see within a second (READ_BLOCK_MS) and write at their next heartbeat, a third of a lease
later: a start waits up to SETTLE leases for that, and a running node logs a difference only
once it has lasted as long.
"""

from __future__ import annotations

import sys
import time

import redis
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from app.cluster.alive import unusable
from app.cluster.events import EPOCH_KEY, TIMEOUT
from app.db import display_url, make_engine

SETTLE = 1.5  # leases a difference must outlast: a heartbeat after the epoch is seen, and more
LOOK = 0.5  # seconds between looks while a start waits

_RECORD = text(
    """
    INSERT INTO cluster_node (name, epoch, lease, seen_at) VALUES (:name, :epoch, :lease, now())
    ON CONFLICT (name) DO UPDATE
        SET epoch = EXCLUDED.epoch, lease = EXCLUDED.lease, seen_at = EXCLUDED.seen_at
    """
)
# This node's row as another process may have left it (written within half its lease).
_MINE = text(
    """
    SELECT epoch FROM cluster_node
    WHERE name = :name AND seen_at >= now() - make_interval(secs => lease / 2)
    """
)
# Rows of nodes gone an hour (a default node name is new at each start: they add up); rows
# another node is writing now are left to a later beat (no waiting on their locks).
_FORGET = text(
    """
    DELETE FROM cluster_node WHERE name IN (
        SELECT name FROM cluster_node WHERE seen_at < now() - interval '1 hour'
        FOR UPDATE SKIP LOCKED
    )
    """
)
# The live nodes (a row written within `part` of its own lease) whose Redis has another epoch.
_ELSEWHERE = text(
    """
    SELECT name FROM cluster_node
    WHERE name != :skip AND epoch IS DISTINCT FROM :epoch
      AND seen_at >= now() - make_interval(secs => lease * :part)
    ORDER BY name
    """
)


def beat(engine: Engine, name: str, epoch: str, wrote: str | None, lease: float) -> list[str]:
    """Write this node's row; the live nodes on another Redis, this node's own name first
    when its row holds another epoch than the one it last wrote (wrote: a twin wrote it).
    In a worker thread."""
    with engine.begin() as connection:
        before = connection.execute(_MINE, {"name": name}).scalar()
        connection.execute(_RECORD, {"name": name, "epoch": epoch, "lease": lease})
        connection.execute(_FORGET)
        found = elsewhere(connection, epoch, skip=name)
    twin = wrote is not None and before is not None and before not in (wrote, epoch)
    return [name, *found] if twin else found


def elsewhere(
    connection: Connection, epoch: str | None, skip: str = "", part: float = 1
) -> list[str]:
    """The live nodes (a row written within part of their lease) but skip whose row names
    another epoch than this one."""
    params = {"skip": skip, "epoch": epoch, "part": part}
    return list(connection.execute(_ELSEWHERE, params).scalars())


def other_redis(name: str, found: list[str]) -> str:
    """The line that says a live node runs on another Redis database than this one."""
    if found[0] == name:
        return (
            f"OARLOCK_REDIS_URL: another live relay runs as node {name!r} on another Redis "
            "server or database: give every node the same Redis and its own name."
        )
    return (
        f"OARLOCK_REDIS_URL: node {found[0]!r} uses another Redis server or database than "
        f"node {name!r}: give every node the same one (on different ones, a node's tabs never "
        "see what the others' agents do)."
    )


def start_error(db_url: str, redis_url: str, name: str, lease: float) -> str | None:
    """Why this node may not start beside the live ones (another Redis), or None. Blocking:
    run before the app starts. Waits only while a live node's row differs, up to SETTLE of the
    longest lease (a Redis that just lost its data, whose nodes write the new epoch soon)."""
    engine = make_engine(db_url)
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=TIMEOUT, socket_timeout=TIMEOUT)
    try:
        with engine.connect() as connection:
            found = elsewhere(connection, _epoch(client))  # its own name's row included
            if not found:
                return None
            longest = connection.execute(text("SELECT max(lease) FROM cluster_node")).scalar()
            wait = max(lease, float(longest or 0)) * SETTLE
            print(  # (a start after Redis lost its data waits here: say why)
                f"Node {found[0]!r} names another Redis epoch: waiting up to {wait:.0f} s to "
                "tell a Redis that lost its data from another Redis…",
                file=sys.stderr,
                flush=True,
            )
            deadline = time.monotonic() + wait
            problem: Exception | None = None
            while time.monotonic() < deadline:
                time.sleep(LOOK)
                connection.rollback()  # each look sees the rows written since
                try:
                    epoch = _epoch(client)
                except (redis.RedisError, OSError) as error:  # Redis restarting: look again
                    problem = error
                    continue
                problem = None
                # Written within half its lease: every live node writes each third of one.
                found = elsewhere(connection, epoch, part=0.5)
                if not found:
                    return None
            return unusable(problem) if problem is not None else other_redis(name, found)
    except (redis.RedisError, OSError) as error:
        return unusable(error)
    except SQLAlchemyError as error:
        return f"The database {display_url(db_url)} cannot be used: {error.__class__.__name__}."
    finally:
        client.close()
        engine.dispose()


def _epoch(client: redis.Redis) -> str | None:
    value = client.get(EPOCH_KEY)
    return value.decode() if isinstance(value, bytes) else None
