"""The HTML pages: the app shell and the login form."""

from __future__ import annotations

import contextlib
from urllib.parse import parse_qs

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.exc import OperationalError

from app import __version__
from app.api_docs import operations
from app.resources import resource_dir
from app.security import COOKIE, after_login, check_login, cleared_cookie, session_cookie

TEMPLATES = Jinja2Templates(directory=str(resource_dir("templates")))

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
@router.get("/c/{conversation_id}", response_class=HTMLResponse)
async def index(request: Request) -> Response:
    """The single-page app."""
    settings = request.app.state.settings
    page = {"version": __version__, "static_url": "/static"}
    page["cwd_default"] = str(settings.cwd_default)  # the new-conversation placeholder
    # The context watch's thresholds: the 🧠 button turns amber at soft, red at hard.
    page |= {"context_soft": settings.context_soft, "context_hard": settings.context_hard}
    return TEMPLATES.TemplateResponse(request, "index.html", page)


@router.get("/docs", response_class=HTMLResponse)
async def api_docs(request: Request) -> Response:
    """The API reference, rendered here from the OpenAPI schema (no CDN, no script)."""
    context = {"version": __version__, "operations": operations(request.app.openapi())}
    return TEMPLATES.TemplateResponse(request, "docs.html", context)


@router.get("/login", response_class=HTMLResponse)
async def login_page(
    request: Request, failed: int = 0, ended: int = 0, next: str | None = None
) -> Response:
    """The form to paste the access token into (next: the conversation to open after it).

    A browser logged in already goes on (it came by a login link, or opened the form again).
    """
    sessions = request.app.state.sessions
    session_id = request.cookies.get(COOKIE)
    if sessions is not None and session_id:
        with contextlib.suppress(OperationalError):  # the database is down: the form, as ever
            if await to_thread.run_sync(sessions.valid, session_id):  # (database I/O)
                return RedirectResponse(after_login(next) or "/", status_code=303)
    error = "That token is not valid." if failed else None
    # A tab whose session ended (logged out elsewhere, the token changed) says why it is here.
    notice = "Your session has ended: log in again to go on." if ended and not failed else None
    context = {"error": error, "notice": notice, "next": after_login(next)}
    return TEMPLATES.TemplateResponse(request, "login.html", context)


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the pasted token; on success set the session cookie and go to the app."""
    body = parse_qs((await request.body())[:4096].decode("utf-8", "replace"))
    token = body.get("token", [""])[0].strip()
    going = after_login(body.get("next", [None])[0])  # a conversation's link, or None
    state = request.app.state
    if not token or not await check_login(state.token, token, state.limiter, request.scope):
        again = f"/login?failed=1&next={going}" if going else "/login?failed=1"
        return RedirectResponse(again, status_code=303)
    response = RedirectResponse(going or "/", status_code=303)
    if state.sessions is not None:
        secure = request.url.scheme == "https"
        response.headers.append(
            "set-cookie",
            session_cookie(await to_thread.run_sync(state.sessions.create), secure=secure).decode(),
        )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End this browser's session (its cookie stops working) and go to the login form."""
    sessions = request.app.state.sessions
    session_id = request.cookies.get(COOKIE)
    if sessions is not None and session_id:
        await to_thread.run_sync(sessions.remove, session_id)  # (database I/O)
        sessions.close_sockets(session_id)
    response = RedirectResponse("/login", status_code=303)
    response.headers.append(
        "set-cookie", cleared_cookie(secure=request.url.scheme == "https").decode()
    )
    return response
