"""One live process per node name: a key each node renews, checked when a node starts.

Two processes with one OARLOCK_NODE_ID would both hold that node's leases, and both run the
same conversation's agent. Each node writes `oarlock:node:<name>` (its own random value,
expiring after a lease, with a mark of its token) at every heartbeat; a node starting under a
name whose key another process still renews is refused, and so is one whose token is not the
one the nodes running now use (they would not accept each other's logins). A key left by a
node that died is only waited out: it is not renewed, and a start within a lease of the death
waits until it expires.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
import time

import redis

from app.cluster.events import PREFIX, TIMEOUT

KEY = PREFIX + "node:"


def token_mark(token: str | None) -> str:
    """What the nodes compare of their token: a slow hash (scrypt), never the token itself."""
    if not token:
        return "-"
    mark = hashlib.scrypt(token.encode(), salt=b"oarlock node token", n=2**14, r=8, p=1)
    return mark[:8].hex()


def instance(token: str | None) -> str:
    """This process's value for its node's key: its own random part and its token's mark."""
    return f"{secrets.token_hex(8)}:{token_mark(token)}"


def redis_error(url: str, node: str | None, token: str | None) -> str | None:
    """Why Redis cannot serve this node (not answering, a password wrong or missing, no such
    database, or its name another live node's), or None. Blocking: run before the app starts.

    The name is watched only when it was given (a default name is unique), and only while its
    key exists: until it is renewed or expires (at most a lease).
    """
    client = redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT, socket_timeout=TIMEOUT)
    try:
        client.ping()
        return _other_token(client, token_mark(token)) or (_twin(client, node) if node else None)
    except (redis.RedisError, OSError) as error:
        return unusable(error)
    finally:
        client.close()


def unusable(error: Exception) -> str:
    """The line that says Redis cannot be used, from its error's first line."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if isinstance(error, redis.AuthenticationError) and ("HELLO" in reason or "NOAUTH" in reason):
        reason = "the server needs a password (redis://:password@host:port/0)"
    return f"OARLOCK_REDIS_URL cannot be used: {reason}"


def _other_token(client: redis.Redis, mark: str) -> str | None:
    """Why this node's token is not the one the nodes running now use, or None."""
    for key in client.scan_iter(match=KEY + "*", count=100):
        value = client.get(key)
        if value is not None and value.decode().rpartition(":")[2] != mark:
            node = key.decode().removeprefix(KEY)
            return (
                f"OARLOCK_TOKEN is not the token of the nodes running now (node {node!r}): "
                "give every node the same one; to change it, stop every node first (a stopped "
                "node's name is forgotten a lease after it stops)."
            )
    return None


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
