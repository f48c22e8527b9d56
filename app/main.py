"""The app factory: settings in, FastAPI app out; the lifespan owns hub and supervisor."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import OperationalError
from sqlmodel import select
from starlette.responses import Response

from app import __version__
from app.config import Settings
from app.db import get_session, make_engine
from app.hub import Hub
from app.limits import BodyLimit
from app.models import Conversation
from app.routes import api, pages, ws
from app.security import LOOPBACK_HOSTS, FailureLimiter, Guard, load_or_create_token
from app.supervisor import Supervisor

STATIC = Path(__file__).resolve().parents[1] / "static"
log = logging.getLogger(__name__)


class StaticAssets(StaticFiles):
    """Static files that browsers revalidate (ETag) so an upgrade never mixes old modules."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        """Serve a file with Cache-Control: no-cache."""
        response = super().file_response(*args, **kwargs)
        response.headers["cache-control"] = "no-cache"
        return response


def allowed_hosts(settings: Settings) -> list[str]:
    """Host header names the relay answers to (DNS rebinding defence)."""
    hosts = [*LOOPBACK_HOSTS, *settings.allowed_hosts]
    if settings.host not in ("0.0.0.0", "::", ""):
        hosts.append(settings.host)
    return hosts


def create_app(settings: Settings) -> FastAPI:
    """Build the relay's app; nothing starts until its lifespan runs."""
    settings.resolved_data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)

    def load_seq(conversation_id: int) -> int:
        with get_session(engine) as session:
            seq = session.exec(
                select(Conversation.last_seq).where(Conversation.id == conversation_id)
            ).first()
        return seq or 0

    hub = Hub(load_seq)
    supervisor = Supervisor(settings, engine, hub)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await supervisor.start()
        try:
            yield
        finally:
            await supervisor.stop()
            engine.dispose()

    app = FastAPI(title="oarlock", version=__version__, lifespan=lifespan)
    token = (
        None
        if settings.no_auth
        else load_or_create_token(settings.token, settings.resolved_data_dir)
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.hub = hub
    app.state.supervisor = supervisor
    app.state.token = token
    app.state.limiter = FailureLimiter()
    app.add_middleware(
        Guard,
        token=token,
        allowed_hosts=allowed_hosts(settings),
        allowed_origins=settings.allowed_origins,
        max_body=settings.max_message_bytes + 4096,
        limiter=app.state.limiter,
    )
    # Outside the Guard: bodies are limited on every route, before the token is even checked.
    app.add_middleware(
        BodyLimit, max_body=settings.max_message_bytes + 4096, timeout=settings.request_timeout
    )
    app.include_router(api.router)
    app.include_router(ws.router)
    app.include_router(pages.router)
    app.mount("/static", StaticAssets(directory=STATIC), name="static")

    @app.exception_handler(OperationalError)
    async def database_unavailable(_request: Request, error: OperationalError) -> JSONResponse:
        """A database that cannot be written (read-only, disk full): say so, keep running."""
        log.error("database error: %s", error)
        reason = str(error.orig) if error.orig else str(error)
        detail = f"The database cannot be used right now ({reason}). Nothing was stored."
        return JSONResponse({"detail": detail}, status_code=503)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness check (no auth)."""
        return {"status": "ok"}

    return app
