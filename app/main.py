"""The app factory: settings in, FastAPI app out; the lifespan owns hub and supervisor."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import OperationalError
from sqlmodel import select
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from app import __version__, store
from app.cluster import install as install_cluster
from app.cluster import make_hub, setting_error
from app.config import Settings
from app.db import ensure_private_dir, get_session, make_engine, unavailable
from app.head import HeadAsGet
from app.limits import BodyLimit, body_limit
from app.models import Conversation
from app.notify import Notifier
from app.push import load_or_create_vapid, vapid_from_token
from app.resources import resource_dir
from app.routes import (
    api,
    attachments,
    backups,
    changes,
    files,
    imports,
    pages,
    push,
    search,
    steer,
    ws,
)
from app.security import (
    LOOPBACK_HOSTS,
    SECURITY_HEADERS,
    FailureLimiter,
    Guard,
    load_or_create_token,
)
from app.sessions import Sessions
from app.supervisor import Supervisor
from app.validation_errors import listed_problems, unreadable_json

STATIC = resource_dir("static")
log = logging.getLogger(__name__)


class StaticAssets(StaticFiles):
    """Static files that browsers revalidate (ETag) so an upgrade never mixes old modules."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        """Serve a file with Cache-Control: no-cache."""
        response = super().file_response(*args, **kwargs)
        response.headers["cache-control"] = "no-cache"
        if Path(args[0]).name == "sw.js":  # the service worker serves the whole app, not /static/
            response.headers["service-worker-allowed"] = "/"
        return response


class SafeJSONResponse(JSONResponse):
    """JSON that can always be sent: text that is not valid UTF-8 goes out \\u-escaped."""

    def render(self, content: Any) -> bytes:
        """Encode as UTF-8, or as ASCII with escapes when content holds a lone surrogate."""
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


def allowed_hosts(settings: Settings) -> list[str]:
    """Host header names the relay answers to (DNS rebinding defence)."""
    hosts = [*LOOPBACK_HOSTS, *settings.allowed_hosts]
    if settings.host not in ("0.0.0.0", "::", ""):
        hosts.append(settings.host)
    return hosts


def create_app(settings: Settings) -> FastAPI:
    """Build the relay's app; nothing starts until its lifespan runs."""
    ensure_private_dir(settings.resolved_data_dir)
    engine = make_engine(settings.db_url)

    def load_seq(conversation_id: int) -> int:
        with get_session(engine) as session:
            if settings.redis_url is not None:  # a Redis counter starts above every stored seq
                return store.seq_floor(session=session, conversation_id=conversation_id)
            seq = session.exec(
                select(Conversation.last_seq).where(Conversation.id == conversation_id)
            ).first()
        return seq or 0

    if (error := setting_error(settings)) is not None:
        raise ValueError(error)
    node = None
    if settings.redis_url is not None:  # several nodes (app/cluster/)
        from app.cluster.node import default_node_id

        node = settings.node_id or default_node_id()
        settings = settings.model_copy(update={"node_id": node})
    hub = make_hub(settings, load_seq, node or "")
    supervisor = Supervisor(settings, engine, hub)
    if node is not None:
        from app.cluster.node import ClusterNode

        supervisor.cluster = ClusterNode(settings, engine, supervisor)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # What start-up built lives as long as the process: out of the collector's sight, a
        # full collection no longer walks it (it stalled a streaming reply for ms, bench/README).
        gc.collect()
        gc.freeze()
        await hub.start()
        await supervisor.start()
        sessions: Sessions | None = app.state.sessions
        # Stopped, not cancelled: a query under way in a worker thread ends before the engine.
        stop_checking = asyncio.Event()
        checking = (
            None if sessions is None else asyncio.create_task(sessions.check_forever(stop_checking))
        )
        try:
            yield
        finally:
            stop_checking.set()
            app.state.notifier.mute()
            await supervisor.stop()
            await app.state.notifier.close()
            await hub.stop()
            if checking is not None:
                await checking
            engine.dispose()
            gc.unfreeze()  # (an app in a longer-lived process, as in the tests)

    # No Swagger UI or ReDoc: they load scripts from a CDN that the CSP blocks (/docs is ours).
    app = FastAPI(
        title="oarlock", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None
    )
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
    app.state.limiter = (
        FailureLimiter() if supervisor.cluster is None else supervisor.cluster.limiter
    )
    app.state.sessions = None if token is None else Sessions(engine, token)
    app.state.notifier = Notifier(
        settings,
        engine,
        hub,
        app.state.sessions,
        # A cluster's nodes derive one key from their token; one node keeps its own.
        vapid_from_token(token)
        if supervisor.cluster is not None and token is not None
        else load_or_create_vapid(settings.resolved_data_dir),
        runs_here=None if supervisor.cluster is None else supervisor.cluster.holds,
        shared=None if supervisor.cluster is None else supervisor.cluster.presence,
    )
    app.add_middleware(
        Guard,
        token=token,
        allowed_hosts=allowed_hosts(settings),
        allowed_origins=settings.allowed_origins,
        max_body=body_limit(settings.max_message_bytes),
        limiter=app.state.limiter,
        sessions=app.state.sessions,
    )
    # Outside the Guard: bodies are limited on every route, before the token is even checked.
    app.add_middleware(
        BodyLimit, max_body=body_limit(settings.max_message_bytes), timeout=settings.request_timeout
    )
    app.add_middleware(HeadAsGet)  # outermost: every layer sees the GET it answers as
    app.include_router(api.router)
    app.include_router(search.router)
    app.include_router(files.router)
    app.include_router(changes.router)
    app.include_router(attachments.router)
    app.include_router(backups.router)
    app.include_router(imports.router)
    app.include_router(steer.router)
    app.include_router(push.router)
    app.include_router(ws.router)
    app.include_router(pages.router)
    app.mount("/static", StaticAssets(directory=STATIC), name="static")

    if node is not None:
        install_cluster(app)  # a Redis failure: 503

    @app.exception_handler(OperationalError)
    async def database_unavailable(_request: Request, error: OperationalError) -> JSONResponse:
        """A database that cannot be written (read-only, disk full): say so, keep running."""
        log.error("database error: %s", error)
        return JSONResponse({"detail": unavailable(error)}, status_code=503)

    @app.exception_handler(store.ConversationGone)
    async def conversation_gone(_request: Request, error: store.ConversationGone) -> JSONResponse:
        """A conversation deleted between a request's read of it and its work on it."""
        return JSONResponse({"detail": str(error)}, status_code=404)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        """FastAPI's own answer; a body that parses but Python will not read says why (it was
        "There was an error parsing the body"), as the socket says of a message."""
        cause = error.__cause__ if error.status_code == 400 else None
        if cause is not None and (detail := unreadable_json(cause, "The request body")):
            return JSONResponse({"detail": detail}, status_code=400)
        return await http_exception_handler(request, error)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        """FastAPI's 422 list of problems (the first 20), sendable even when the input was not
        valid UTF-8 or held NaN."""
        problems = jsonable_encoder(listed_problems(error.errors()))
        return SafeJSONResponse({"detail": problems}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected_error(_request: Request, error: Exception) -> JSONResponse:
        """Anything unforeseen: a JSON 500 with a message, never plain text (it is logged)."""
        detail = "The relay failed to answer this request (an internal error, logged)."
        headers = {k.decode(): v.decode() for k, v in SECURITY_HEADERS}
        # uvicorn closes the connection after an unhandled error: said, so that a client does
        # not send its next request down it (a hostile review's next request was reset).
        headers["connection"] = "close"
        return JSONResponse({"detail": detail}, status_code=500, headers=headers)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness check (no auth)."""
        return {"status": "ok"}

    return app
