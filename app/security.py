"""The relay's defences: access token, Host and Origin checks, JSON-only API, limits, headers.

The relay drives agents that run shell commands as the user, so every request
is checked here before any route sees it, WebSocket upgrades included.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, urlencode

import anyio
from sqlalchemy.exc import OperationalError
from starlette.requests import cookie_parser

from app.attachments import body_limit, is_image_type, is_upload
from app.db import unavailable
from app.sessions import LIFETIME, Sessions

log = logging.getLogger(__name__)
COOKIE = "oarlock_session"  # a session id (app/sessions.py), never the token
SESSION_SCOPE_KEY = "oarlock.session"  # from _check to __call__: the socket's session
# A WebSocket's scope carries the server's own send under this key (set by Guard once the
# handshake passed its checks): the route sends its frames with it, through no wrapper.
SERVER_SEND_KEY = "oarlock.server_send"
DATABASE_DOWN = "\0database-down"  # _session_of could not read the sessions (never an id)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
PUBLIC_PATHS = ("/healthz", "/login", "/favicon.ico")
CONVERSATION_PATH = re.compile(r"/c/[1-9][0-9]{0,18}")  # a conversation's own link
PUBLIC_PREFIXES = ("/static/",)
# Answered 401 without a token, as a script expects; other GETs are pages (to the login form).
API_PATHS = ("/api/", "/openapi.json")
STATE_CHANGING = ("POST", "PUT", "PATCH", "DELETE")
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # same-origin, not no-referrer: with no-referrer Chromium posts forms with Origin: null,
    # which the Origin check must refuse. Other sites still get no Referer at all.
    (b"referrer-policy", b"same-origin"),
]

NO_STORE = (b"cache-control", b"no-store")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


MIN_TOKEN = 16  # characters of a configured token (a generated one has 43)


def token_error(configured: str | None) -> str | None:
    """Why a configured token is refused, if it is: a short one can be guessed, and whoever
    has it runs shell commands through the agents."""
    if configured is None:
        return None
    if configured != configured.strip() or not configured.isascii() or not configured.isprintable():
        # An Authorization header trims spaces and carries ASCII only: such a token could
        # log in by its URL and never through the form's neighbour, the API.
        return (
            "OARLOCK_TOKEN must be printable ASCII without a space at either end (an API "
            "client's Authorization header could not carry it), or unset it (a token is "
            "generated for you)."
        )
    if len(configured) >= MIN_TOKEN:
        return None
    return (
        f"OARLOCK_TOKEN is {len(configured)} characters: use at least {MIN_TOKEN}, or unset it "
        "(a token is generated for you)."
    )


def load_or_create_token(configured: str | None, data_dir: Path) -> str:
    """The configured token, else the one stored in the data dir (created 0600 on first start)."""
    if configured:
        return configured
    path = data_dir / "token"
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(token + "\n")
    return token


# Headers the checks read once: a second copy could be the one another reader takes (a
# browser sends each once; RFC 6265 §5.4: one Cookie header).
SINGLE_HEADERS = frozenset(
    {"host", "origin", "authorization", "content-length", "content-type", "cookie"}
)


def _duplicated(scope: Scope) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
    """A 400 for a request that repeats a header the checks read (RFC 9110: Host once)."""
    seen: set[str] = set()
    for key, _ in scope["headers"]:
        name = key.decode("latin-1").lower()
        if name in SINGLE_HEADERS:
            if name in seen:
                return 400, f"The {name.title()} header is repeated; send it once.", []
            seen.add(name)
    return None


def is_loopback(host: str) -> bool:
    """True for names that only this machine can reach: localhost, 127.0.0.0/8, ::1 (not a
    DNS name that merely starts with "127.", which may resolve anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


# A Host header (RFC 9110): a DNS name or IPv4 address, or an IPv6 address in brackets; then
# maybe a port.
_HOST = re.compile(r"(?:\[(?P<ip6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::[0-9]*)?")


def host_name(host_header: str) -> str:
    """The name part of a Host header (no port; IPv6 brackets removed); "" when the header is
    not a host (a list, junk after the brackets, two ports), which no allowed host matches."""
    match = _HOST.fullmatch(host_header)
    if match is None:
        return ""
    return match["ip6"] or match["name"]


Guess = Literal["ok", "wrong", "refused"]


class FailureLimiter:
    """Counts failed tokens per client address; past the limit, failures are slowed.

    Only failures are slowed and refused (429): a correct token or a live session always
    gets in, so a page that makes the owner's browser send wrong guesses locks nobody out.
    A client's wrong tokens are judged one at a time (guess): guesses sent in parallel wait
    in turn, so past the limit they come no faster than one a pause.
    """

    def __init__(self, limit: int = 10, window: float = 60.0, pause: float = 1.0) -> None:
        self.limit = limit
        self.window = window
        self.pause = pause
        self._failures: dict[str, deque[float]] = {}
        self._turns: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # lock, [its users]

    async def guess(self, client: str, ok: bool) -> Guess:
        """A token a client tried (ok: it is right): "ok", "wrong", or "refused" (past the
        limit, answered after the pause).

        A right token gets in at once unless the client's wrong ones wait to be judged; then
        it waits its turn behind them, so a right guess in a flood is not known sooner.
        """
        if ok and client not in self._turns:
            return "ok"
        lock, users = self._turns.setdefault(client, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                if ok:
                    return "ok"
                return "refused" if await self.failed(client) else "wrong"
        finally:
            users[0] -= 1
            if not users[0]:
                del self._turns[client]

    def blocked(self, client: str) -> bool:
        """True when this client failed too often lately."""
        failures = self._failures.get(client)
        if not failures:
            return False
        cutoff = time.monotonic() - self.window
        while failures and failures[0] < cutoff:
            failures.popleft()
        return len(failures) >= self.limit

    def fail(self, client: str) -> None:
        """Record one failed attempt."""
        self._failures.setdefault(client, deque()).append(time.monotonic())
        if len(self._failures) > 10_000:  # bounded memory under a flood of addresses
            self._failures.pop(next(iter(self._failures)))

    async def failed(self, client: str) -> bool:
        """Record a failure; past the limit, wait before answering. True when past it."""
        past = self.blocked(client)
        self.fail(client)
        if past:
            await asyncio.sleep(self.pause)
        return past


class Guard:
    """ASGI middleware applying every check, for HTTP and WebSocket alike."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        allowed_hosts: Iterable[str],
        allowed_origins: Iterable[str] = (),
        max_body: int = 256 * 1024,
        limiter: FailureLimiter | None = None,
        sessions: Sessions | None = None,
    ) -> None:
        self.app = app
        self.token = token
        # As a Host header's name is compared: without its port and IPv6 brackets.
        self.allowed_hosts = {host_name(h).lower() or h.lower() for h in allowed_hosts}
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}
        self.max_body = max_body
        self.limiter = limiter or FailureLimiter()
        self.sessions = sessions
        self._origins_told: set[str] = set()  # refused origins logged (once each, a few)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = _duplicated(scope) or await self._check(scope, headers)
        if refusal is not None:
            status, detail, extra = refusal
            await _refuse(scope, receive, send, status, detail, extra)
            return
        login = await self._login_by_url(scope, let_in="authorization" in headers)
        if login is not None:
            await _refuse(scope, receive, send, *login)
            return
        session_id = scope.pop(SESSION_SCOPE_KEY, None)
        if scope["type"] == "websocket":
            # Headers go on HTTP responses only: a socket's messages (a frame per burst of
            # events per tab) pass unwrapped, and the route skips the framework's wrappers
            # too (SERVER_SEND_KEY). The middlewares outside this one (Starlette's
            # ServerErrorMiddleware, BodyLimit) pass a WebSocket's send on unchanged.
            scope[SERVER_SEND_KEY] = send
            if session_id and self.sessions is not None:
                await self._socket_of_session(scope, receive, send, session_id)
            else:
                await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _with_headers(send))

    async def _socket_of_session(
        self, scope: Scope, receive: Receive, send: Send, session_id: str
    ) -> None:
        """Run a socket logged in by a session; log out ends it with code 4401."""
        assert self.sessions is not None
        with anyio.CancelScope() as cancel:
            unwatch = self.sessions.watch(session_id, cancel.cancel)
            try:
                await self.app(scope, receive, send)
            finally:
                unwatch()
        if cancel.cancelled_caught:
            with contextlib.suppress(Exception):  # the socket may be gone already
                await send({"type": "websocket.close", "code": 4401, "reason": "Logged out."})

    def _tell_origin(self, origin: str, own: str) -> None:
        """Log a refused Origin once (the first 32): a self-hoster behind a proxy learns what
        the relay expected; an attacker's many origins cannot fill the log."""
        if origin in self._origins_told or len(self._origins_told) >= 32:
            return
        self._origins_told.add(origin)
        hint = "list it in OARLOCK_ALLOWED_ORIGINS if it is yours"
        if origin.startswith("https://") and own.startswith("http://"):
            hint = (
                "behind a TLS proxy, set OARLOCK_TRUSTED_PROXIES to the proxy's address "
                "(its X-Forwarded-Proto then counts), or " + hint
            )
        log.warning("refused requests from the origin %r (this relay is %r): %s", origin, own, hint)

    async def _check(
        self, scope: Scope, headers: dict[str, str]
    ) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        """Why a request is refused (status, detail, headers), or None to let it through."""
        host = headers.get("host", "")
        if host_name(host).lower() not in self.allowed_hosts:
            return 403, f"Host {host!r} is not allowed; add it to OARLOCK_ALLOWED_HOSTS.", []
        path: str = scope["path"]
        method = scope.get("method", "GET")
        websocket = scope["type"] == "websocket"
        origin = headers.get("origin")
        own_origin = f"{'https' if scope.get('scheme') in ('https', 'wss') else 'http'}://{host}"
        foreign = origin is not None and origin.rstrip("/").lower() not in (
            self.allowed_origins | {own_origin.lower()}
        )
        if (websocket or method in STATE_CHANGING) and foreign:
            self._tell_origin(str(origin), own_origin)
            return 403, "Cross-origin request refused.", []
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return None
        if self.token is not None:
            page = not websocket and method == "GET" and not path.startswith(API_PATHS)
            bearer = headers.get("authorization", "")
            if bearer.lower().startswith("bearer "):
                ok = hmac.compare_digest(bearer[7:].strip().encode(), self.token.encode())
                guess = await self.limiter.guess(_client(scope), ok)
                if guess == "refused":
                    return 429, "Too many failed attempts; wait a minute.", []
                if guess == "wrong":
                    return _unauthorized(page, path)
            elif (session_id := await self._session_of(headers)) == DATABASE_DOWN:
                return 503, "The database cannot be used right now; try again shortly.", []
            elif session_id is not None:
                scope[SESSION_SCOPE_KEY] = session_id
                if (websocket or method in STATE_CHANGING) and origin is None:
                    return 403, "Cross-origin request refused (no Origin header).", []
            elif _url_token(scope) is not None:
                return None  # a login by URL: _login_by_url checks it and redirects
            else:
                # A stale or unknown cookie is not a guess of the token: it is not counted.
                return _unauthorized(page, path)
        if not websocket and method in STATE_CHANGING and path.startswith("/api/"):
            length = headers.get("content-length")
            if length is not None and not length.strip().isdigit():
                return 400, "Invalid Content-Length header.", []
            limit = body_limit(method, path, self.max_body)
            if length is not None and int(length) > limit:
                return 413, f"Request body over the limit of {limit} bytes.", []
            if length is None and "transfer-encoding" in headers:
                return 411, "Send a Content-Length header.", []
            kind = headers.get("content-type", "")
            if int(length or 0) > 0 and is_upload(path):
                if not is_image_type(kind):
                    return 415, "An image is uploaded as image/… or application/octet-stream.", []
            elif int(length or 0) > 0 and not _is_json(kind):
                return 415, "The API accepts application/json only.", []
        return None

    async def _session_of(self, headers: dict[str, str]) -> str | None:
        """The request's session id when it names a live session, else None."""
        if self.sessions is None:
            return None
        # Lenient parsing: another app's odd cookie on localhost must not hide ours.
        session_id = cookie_parser(headers.get("cookie", "")).get(COOKIE)
        try:
            if not session_id:
                return None
            # Database I/O: in a thread, never on the event loop.
            valid = await anyio.to_thread.run_sync(self.sessions.valid, session_id)
            return session_id if valid else None
        except OperationalError:  # locked or unreadable: say so (503), never a bare 500
            log.warning("cannot check a session: the database is unavailable", exc_info=True)
            return DATABASE_DOWN

    async def _login_by_url(
        self, scope: Scope, *, let_in: bool = False
    ) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        """For GET ?token=…: start a session and redirect to the same URL without the token.

        let_in: the token header let the request in already; a wrong token= beside it is then
        no guess (counted, it would lock the right token out): the request is served.
        """
        given = _url_token(scope)
        if given is None or self.token is None or self.sessions is None:
            return None
        ok = hmac.compare_digest(given.encode(), self.token.encode())
        if not ok and let_in:
            return None
        guess = await self.limiter.guess(_client(scope), ok)
        if guess == "refused":
            return 429, "Too many failed attempts; wait a minute.", []
        if guess == "wrong":  # (a conversation's link still opens after the form)
            going = after_login(scope["path"])
            again = f"/login?failed=1&next={going}" if going else "/login?failed=1"
            return 303, "", [(b"location", again.encode())]
        query = parse_qs(_query(scope), keep_blank_values=True)
        rest = {k: v for k, v in query.items() if k != "token"}
        # A path on this relay, whatever was asked: "//host" or "/\\host" would send the browser
        # to another site, and a decoded CR or LF cannot go into a header.
        path = quote("/" + scope["path"].lstrip("/\\"), safe="/:@!$&'()*+,;=~")
        location = path + (f"?{urlencode(rest, doseq=True)}" if rest else "")
        try:
            session_id = await anyio.to_thread.run_sync(self.sessions.create)
        except OperationalError as error:  # as the app's own handler answers (main.py)
            return 503, unavailable(error), []
        cookie = session_cookie(session_id, secure=scope.get("scheme") == "https")
        return 303, "", [(b"location", location.encode()), (b"set-cookie", cookie)]


async def check_login(
    expected: str | None, given: str, limiter: FailureLimiter, scope: Scope
) -> bool:
    """Check a token typed into the login form (a failure counts, and is slowed past the limit)."""
    if expected is None:
        return True
    ok = hmac.compare_digest(given.encode(), expected.encode())
    return await limiter.guess(_client(scope), ok) == "ok"


def session_cookie(session_id: str, *, secure: bool) -> bytes:
    """The Set-Cookie value that logs a browser in.

    SameSite=Lax, not Strict: a link from another site (a chat, a mail, a terminal in the
    browser) is a navigation from that site, and a Strict cookie stayed home: a login link
    ended on the login form, a conversation's link asked to log in again. Lax sends it on
    such top-level GETs only, which change nothing here; every other request must carry the
    relay's own Origin (Guard).
    """
    value = f"{COOKIE}={session_id}; Path=/; HttpOnly; SameSite=Lax; Max-Age={LIFETIME}"
    return (value + ("; Secure" if secure else "")).encode()


def cleared_cookie(*, secure: bool) -> bytes:
    """The Set-Cookie value that removes the login cookie from a browser."""
    value = f"{COOKIE}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0"
    return (value + ("; Secure" if secure else "")).encode()


def _unauthorized(page: bool, path: str = "/") -> tuple[int, str, list[tuple[bytes, bytes]]]:
    """Pages go to the login form (a conversation's link comes back after it); the API and
    the socket get 401."""
    if page:
        login = f"/login?next={path}" if after_login(path) else "/login"
        return 303, "Log in first.", [(b"location", login.encode())]
    return 401, "Missing or invalid token.", [(b"www-authenticate", b"Bearer")]


def after_login(path: str | None) -> str | None:
    """Where the login form may send the browser next: a conversation's own link, nothing else
    (any other value could lead off the relay)."""
    return path if path is not None and CONVERSATION_PATH.fullmatch(path) else None


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return client[0] if client else "unknown"


def _query(scope: Scope) -> str:
    return scope.get("query_string", b"").decode("latin-1")


def _url_token(scope: Scope) -> str | None:
    """The token= of a plain GET page request (a login by URL), blank included: never an API
    path's (the API answers 401, never a redirect to the login page)."""
    if scope["type"] != "http" or scope.get("method") != "GET" or scope["path"].startswith("/api/"):
        return None
    values = parse_qs(_query(scope), keep_blank_values=True).get("token")
    return values[0] if values else None


def _is_json(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == "application/json"


def _with_headers(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            if not any(name.lower() == b"cache-control" for name, _ in headers):
                # Conversations, the token page, API answers: never kept in a browser's or a
                # proxy's cache (the static files say no-cache themselves: kept, revalidated).
                headers.append(NO_STORE)
            message["headers"] = headers + SECURITY_HEADERS
        await send(message)

    return wrapped


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    detail: str,
    extra: list[tuple[bytes, bytes]],
) -> None:
    """Answer with status and a JSON detail (none for a redirect), on HTTP or a handshake."""
    body = json.dumps({"detail": detail}).encode() if detail else b""
    headers = [
        *([(b"content-type", b"application/json")] if body else []),
        (b"content-length", str(len(body)).encode()),
        *extra,
        NO_STORE,
        *SECURITY_HEADERS,
    ]
    prefix = "http."
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            # A server without the denial extension: the handshake fails with a bare 403.
            await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})
            return
        prefix = "websocket.http."  # ASGI WebSocket Denial Response: a real status and body
    await send({"type": prefix + "response.start", "status": status, "headers": headers})
    await send({"type": prefix + "response.body", "body": body})
