"""HEAD answered as GET, without the body (RFC 9110 §9.3.2; FastAPI's routes answer it 405).

Uptime monitors and `curl -I` ask with HEAD. The app below sees a GET (a copy of the request's
scope, so every check applies as to a GET); the server, whose own scope still says HEAD, sends
the status and headers only (uvicorn drops a HEAD's body, its Content-Length kept).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HeadAsGet:
    """ASGI middleware: a HEAD request runs as the GET of the same URL."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}  # a copy: the server's scope stays HEAD
        await self.app(scope, receive, send)
