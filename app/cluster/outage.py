"""A task's failures while the database or Redis cannot be reached: one line when it begins
(and when its reason changes), one when it ends, not a traceback at every try.

A node's heartbeat logged about 65 lines of traceback every few seconds while PostgreSQL
was down (327 lines in 10 s, an operator review). An unexpected error still gets its
traceback, each time.
"""

from __future__ import annotations

import logging

import redis
from sqlalchemy.exc import DBAPIError

UNREACHABLE = (DBAPIError, redis.RedisError, OSError)  # what an outage raises


class Outage:
    """Logs one task's outage once; `failed` in its except block, `worked` after a success."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what  # "the cluster heartbeat"
        self.reason: str | None = None  # the outage's, while it lasts

    def failed(self, error: Exception) -> None:
        """The task failed with error (call from its except block: a traceback may be logged)."""
        if not isinstance(error, UNREACHABLE):
            self.log.exception("%s failed", self.what)
            return
        reason = (str(getattr(error, "orig", None) or error).strip().splitlines() or ["?"])[0]
        if reason != self.reason:
            self.log.warning("%s failed (tried again until it works): %s", self.what, reason)
        self.reason = reason

    def worked(self) -> None:
        """The task succeeded: say so once after an outage."""
        if self.reason is not None:
            self.log.warning("%s works again", self.what)
            self.reason = None
