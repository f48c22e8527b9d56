"""Which login sessions have a visible tab on any node: no push goes to a browser in use.

Each node keeps the session keys of its visible tabs in a Redis set of its own, written
again on each change and at each heartbeat, and expiring when the node stops writing it
(a dead node's tabs are not looking any more). The node that pushes reads every node's set.
"""

from __future__ import annotations

import asyncio
import logging
import math

import redis
import redis.asyncio as aioredis

from app.cluster.events import PREFIX

log = logging.getLogger(__name__)

KEY = PREFIX + "visible:"
NO_SESSION = "-"  # a tab of a relay without a token (no login session)


class Presence:
    """This node's visible tabs in Redis, and every node's."""

    def __init__(self, client: aioredis.Redis, node: str, seconds: float) -> None:
        self.redis = client
        self.key = KEY + node
        self.seconds = math.ceil(seconds)  # a node that stopped writing is forgotten after it
        self.values: set[str | None] = set()
        self._writing: asyncio.Task[None] | None = None
        self._again = False

    def changed(self, values: set[str | None]) -> None:
        """This node's visible tabs changed: write them (the newest, once a write is over)."""
        self.values = values
        if self._writing is not None and not self._writing.done():
            self._again = True
            return
        self._writing = asyncio.get_running_loop().create_task(self._write_newest())

    async def _write_newest(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            await self.write()

    async def write(self) -> None:
        """Replace this node's set with its visible tabs and renew its expiry."""
        members = [value or NO_SESSION for value in self.values]
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(self.key)
                if members:
                    pipe.sadd(self.key, *members)
                    pipe.expire(self.key, self.seconds)
                await pipe.execute()
        except (redis.RedisError, OSError) as error:  # the next change or heartbeat retries
            log.warning("cannot share this node's visible tabs: %s", error)

    async def looking(self) -> set[str | None]:
        """The session keys of the visible tabs on every node (only this one's without Redis)."""
        found: set[str | None] = set(self.values)
        try:
            keys = [key async for key in self.redis.scan_iter(match=KEY + "*", count=100)]
            for key in keys:
                if key.decode() != self.key:
                    members = await self.redis.smembers(key)
                    found |= {None if m.decode() == NO_SESSION else m.decode() for m in members}
        except (redis.RedisError, OSError) as error:
            log.warning("cannot see the other nodes' visible tabs: %s", error)
        return found
