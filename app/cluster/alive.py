"""One live process per node name: a key each node renews, checked when a node starts.

Two processes with one OARLOCK_NODE_ID would both hold that node's leases, and both run the
same conversation's agent. Each node writes `oarlock:node:<name>` (its own random value,
expiring after a lease) at every heartbeat; a node starting under a name whose key another
process still renews is refused. A key left by a node that died is only waited out: it is
not renewed, and a start within a lease of the death waits one heartbeat to tell.
"""

from __future__ import annotations

import secrets
import time

import redis

from app.cluster.events import PREFIX, TIMEOUT

KEY = PREFIX + "node:"


def instance() -> str:
    """This process's value for its node's key."""
    return secrets.token_hex(8)


def twin_error(url: str, node: str, lease_seconds: float) -> str | None:
    """Why this node cannot start under its name (another live process renews it), or None.

    Blocking (run before the app starts): at most one heartbeat's wait, and only when the key
    exists.
    """
    client = redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT, socket_timeout=TIMEOUT)
    try:
        return _twin(client, node, lease_seconds)
    except (redis.RedisError, OSError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return f"OARLOCK_REDIS_URL cannot be used: {reason}"
    finally:
        client.close()


def _twin(client: redis.Redis, node: str, lease_seconds: float) -> str | None:
    first = client.pttl(KEY + node)
    if first < 0:  # no key (-2), or one without expiry (-1, not ours): free
        return None
    waited = lease_seconds / 3 + 0.5  # a live node renews within a heartbeat
    time.sleep(waited)
    later = client.pttl(KEY + node)
    if later > first - waited * 1000 + 250:  # renewed meanwhile
        return (
            f"OARLOCK_NODE_ID: another live relay runs as node {node!r}; give each node "
            "its own name (two would both run the same conversations' agents)."
        )
    return None
