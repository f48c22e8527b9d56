"""Several relay nodes behind one URL: PostgreSQL shared, Redis between them (docs/deploy.md).

Nothing here runs unless OARLOCK_REDIS_URL is set; one process on SQLite stays the default.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.engine.url import make_url

from app.config import Settings
from app.hub import Hub

log = logging.getLogger(__name__)


def setting_error(settings: Settings) -> str | None:
    """Why these settings cannot run a cluster node, or None."""
    if settings.redis_url is None:
        return None
    backend = make_url(
        settings.db_url.replace("postgres://", "postgresql://", 1)
    ).get_backend_name()
    if backend != "postgresql":
        return (
            "OARLOCK_REDIS_URL (several relay nodes) needs a PostgreSQL database that every "
            "node shares: set OARLOCK_DATABASE_URL=postgresql://… (SQLite is one process's "
            "file), or unset OARLOCK_REDIS_URL to run one relay."
        )
    if settings.token is None and not settings.no_auth:
        return (
            "OARLOCK_REDIS_URL (several relay nodes) needs OARLOCK_TOKEN, the same on every "
            "node (a node without it would make a token of its own, which the others refuse)."
        )
    return None


ENGINE_DOWN = "The event engine (Redis) cannot be reached right now. Nothing was stored."


def install(app: FastAPI) -> None:
    """Answer 503 when Redis fails a request before anything was stored (a number not taken)."""
    import redis

    async def engine_unavailable(_request: Request, error: Exception) -> JSONResponse:
        log.error("redis error: %s", error)
        return JSONResponse({"detail": ENGINE_DOWN}, status_code=503)

    app.add_exception_handler(redis.RedisError, engine_unavailable)


def make_hub(settings: Settings, load_seq: Callable[[int], int], node: str) -> Hub:
    """The in-process hub, or a cluster node's hub when OARLOCK_REDIS_URL is set."""
    if settings.redis_url is None:
        return Hub(load_seq)
    from app.cluster.events import ClusterHub

    return ClusterHub(load_seq, settings.redis_url, node)
