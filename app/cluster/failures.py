"""The limit on failed tokens, counted over every node of a cluster.

Each node counting its own let a guesser behind a round-robin proxy try the limit times
the number of nodes a minute. One Redis sorted set per client address holds the times of
its failures within the window; a node that cannot reach Redis counts on its own.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid

import redis
import redis.asyncio as aioredis

from app.cluster.events import PREFIX
from app.security import FailureLimiter

log = logging.getLogger(__name__)

KEY = PREFIX + "failures:"


class SharedFailureLimiter(FailureLimiter):
    """FailureLimiter whose counts every node shares (in Redis)."""

    def __init__(self, client: aioredis.Redis) -> None:
        super().__init__()
        self.redis = client

    async def failed(self, client: str) -> bool:
        """Record a failure; past the limit, wait before answering. True when past it."""
        key = KEY + client
        now = time.time()
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.zremrangebyscore(key, 0, now - self.window)
                pipe.zcard(key)
                pipe.zadd(key, {uuid.uuid4().hex: now})
                pipe.expire(key, math.ceil(self.window))
                _removed, earlier, _added, _expiry = await pipe.execute()
        except (redis.RedisError, OSError) as error:
            log.warning("cannot count a failed token in Redis (%s): counted here", error)
            return await super().failed(client)
        past = int(earlier) >= self.limit
        if past:
            await asyncio.sleep(self.pause)
        return past
