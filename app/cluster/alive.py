"""One live process per node name: a key each node renews, checked when a node starts.

Two processes with one OARLOCK_NODE_ID would both hold that node's leases, and both run the
same conversation's agent. Each node writes `oarlock:node:<name>` (its own random value,
expiring after a lease) at every heartbeat; a node starting under a name whose key another
process still renews is refused. A key left by a node that died is only waited out: it is
not renewed, and a start within a lease of the death waits until it expires.
"""

from __future__ import annotations

import secrets
import sys
import time

import redis

from app.cluster.events import PREFIX, TIMEOUT

KEY = PREFIX + "node:"


def instance() -> str:
    """This process's value for its node's key."""
    return secrets.token_hex(8)


def redis_error(url: str, node: str | None) -> str | None:
    """Why Redis cannot serve this node (not answering, a password wrong or missing, no such
    database, or its name another live node's), or None. Blocking: run before the app starts.

    The name is watched only when it was given (a default name is unique), and only while its
    key exists: until it is renewed or expires (at most a lease).
    """
    client = redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT, socket_timeout=TIMEOUT)
    try:
        client.ping()
        return _twin(client, node) if node else None
    except redis.AuthenticationError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "refused"
        if "HELLO" in reason or "NOAUTH" in reason:
            reason = "the server needs a password (redis://:password@host:port/0)"
        return f"OARLOCK_REDIS_URL cannot be used: {reason}"
    except (redis.RedisError, OSError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return f"OARLOCK_REDIS_URL cannot be used: {reason}"
    finally:
        client.close()


def _twin(client: redis.Redis, node: str) -> str | None:
    """Watch the key until it is renewed (a live twin) or expires (a dead namesake's)."""
    first = client.pttl(KEY + node)
    if first < 0:  # no key (-2), or one without expiry (-1, not ours): free
        return None
    print(  # (a start within a lease of a crash waits here: say why)
        f"Node name {node!r} was in use a moment ago: waiting up to {first / 1000:.0f} s "
        "to tell a stopped node from a live one…",
        file=sys.stderr,
        flush=True,
    )
    began = time.monotonic()
    while True:
        time.sleep(0.1)
        left = client.pttl(KEY + node)
        if left < 0:
            return None  # expired: nobody renews it
        if left > first - (time.monotonic() - began) * 1000 + 250:  # renewed meanwhile
            return (
                f"OARLOCK_NODE_ID: another live relay runs as node {node!r}; give each node "
                "its own name (two would both run the same conversations' agents)."
            )
