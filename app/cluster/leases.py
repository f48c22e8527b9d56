"""Conversation leases in PostgreSQL: one owner node per conversation, with the database's locks.

A lease is a row (conversation_id, node, expires_at). Taking one is one INSERT … ON CONFLICT DO
UPDATE … WHERE the row is ours or expired: PostgreSQL locks the row for the statement, so of
two nodes racing for it exactly one gets it back. Every time is the database's now(), so the
nodes' clocks play no part. These run in worker threads (asyncio.to_thread), off the loop.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine


class LeaseLost(Exception):
    """This node's lease of a conversation lapsed (it stalled): another node may run it now."""


_ACQUIRE = text(
    """
    INSERT INTO lease (conversation_id, node, expires_at)
    VALUES (:cid, :node, now() + make_interval(secs => :secs))
    ON CONFLICT (conversation_id) DO UPDATE
        SET node = EXCLUDED.node, expires_at = EXCLUDED.expires_at
        WHERE lease.node = EXCLUDED.node OR lease.expires_at < now()
    RETURNING node
    """
)
_RENEW = text(
    """
    UPDATE lease SET expires_at = now() + make_interval(secs => :secs)
    WHERE node = :node AND expires_at >= now() AND conversation_id = ANY(:held)
    RETURNING conversation_id
    """
)
_RENEW_ONE = text(
    """
    UPDATE lease SET expires_at = now() + make_interval(secs => :secs)
    WHERE conversation_id = :cid AND node = :node AND expires_at >= now()
    RETURNING conversation_id
    """
)
_RELEASE = text("DELETE FROM lease WHERE conversation_id = :cid AND node = :node")
# Given back only while no message waits: one stored meanwhile keeps its node running it.
_RELEASE_IDLE = text(
    """
    DELETE FROM lease WHERE conversation_id = :cid AND node = :node
      AND NOT EXISTS (SELECT 1 FROM entry e WHERE e.conversation_id = :cid AND e.state = 'queued')
    """
)
_RELEASE_ALL = text("DELETE FROM lease WHERE node = :node")
# Conversations with work (a turn cut short, messages queued, text left streaming, a question
# left open, a tool call or compaction left running) that no live lease covers: a dead node's,
# or never taken.
_ORPHANS = text(
    """
    SELECT c.id, c.cwd FROM conversation c
    LEFT JOIN lease l ON l.conversation_id = c.id AND l.expires_at >= now()
    WHERE l.conversation_id IS NULL
      AND (c.turn_active OR EXISTS (
          SELECT 1 FROM entry e WHERE e.conversation_id = c.id
            AND e.state IN ('queued', 'streaming', 'pending', 'running')))
    ORDER BY c.id
    LIMIT :limit
    """
)
# Conversations a node holds that have messages waiting (a wake-up may have been lost).
_WAITING = text(
    """
    SELECT DISTINCT e.conversation_id FROM entry e
    JOIN lease l ON l.conversation_id = e.conversation_id
    WHERE l.node = :node AND e.state = 'queued'
    """
)
_OWNER = text("SELECT node FROM lease WHERE conversation_id = :cid AND expires_at >= now()")


def acquire(engine: Engine, conversation_id: int, node: str, seconds: float) -> bool:
    """Take (or extend) a conversation's lease; False while another node's is live."""
    with engine.begin() as connection:
        row = connection.execute(
            _ACQUIRE, {"cid": conversation_id, "node": node, "secs": seconds}
        ).first()
    return row is not None


def renew(engine: Engine, node: str, seconds: float, held: set[int]) -> set[int]:
    """Extend a node's live leases of the conversations it holds; those it still holds.

    Only the held ones: a lease row of this node that the node does not know it holds (its
    memory and the table disagree) lapses, and the orphan scan hands its work on, instead of
    being renewed for ever with nobody running the conversation.
    """
    if not held:
        return set()
    with engine.begin() as connection:
        params = {"node": node, "secs": seconds, "held": sorted(held)}
        rows = connection.execute(_RENEW, params).all()
    return {int(row[0]) for row in rows}


def still_held(connection: Connection, conversation_id: int, node: str, seconds: float) -> bool:
    """Extend a node's lease of one conversation, in the caller's transaction; False: lapsed.

    The fence of a node that stalled longer than its lease: what it does as the owner
    starts only when this holds (the row stays locked until the caller's commit).
    """
    row = connection.execute(
        _RENEW_ONE, {"cid": conversation_id, "node": node, "secs": seconds}
    ).first()
    return row is not None


def release(engine: Engine, conversation_id: int, node: str) -> None:
    """Give a lease back (another node may take the conversation at once)."""
    with engine.begin() as connection:
        connection.execute(_RELEASE, {"cid": conversation_id, "node": node})


def release_idle(engine: Engine, conversation_id: int, node: str) -> bool:
    """Give an idle conversation's lease back unless a message waits; whether it was."""
    with engine.begin() as connection:
        result = connection.execute(_RELEASE_IDLE, {"cid": conversation_id, "node": node})
    return bool(result.rowcount)


def release_all(engine: Engine, node: str) -> None:
    """Give back every lease of a node (it is stopping)."""
    with engine.begin() as connection:
        connection.execute(_RELEASE_ALL, {"node": node})


def orphans(engine: Engine, limit: int = 100) -> list[tuple[int, str]]:
    """Conversations with work and no live lease: (id, working directory)."""
    with engine.begin() as connection:
        rows = connection.execute(_ORPHANS, {"limit": limit}).all()
    return [(int(row[0]), str(row[1])) for row in rows]


def waiting(engine: Engine, node: str) -> set[int]:
    """The conversations a node holds whose messages wait."""
    with engine.begin() as connection:
        rows = connection.execute(_WAITING, {"node": node}).all()
    return {int(row[0]) for row in rows}


def owner(engine: Engine, conversation_id: int) -> str | None:
    """The node holding a conversation's live lease, if any."""
    with engine.begin() as connection:
        row = connection.execute(_OWNER, {"cid": conversation_id}).first()
    return str(row[0]) if row is not None else None
