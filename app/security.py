"""The relay's defences: access token, Host and Origin checks, JSON-only API, limits, headers.

The relay drives agents that run shell commands as the user, so every request
is checked here before any route sees it, WebSocket upgrades included.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.requests import cookie_parser

COOKIE = "oarlock_token"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
PUBLIC_PATHS = ("/healthz", "/login", "/favicon.ico")
PUBLIC_PREFIXES = ("/static/",)
STATE_CHANGING = ("POST", "PUT", "PATCH", "DELETE")
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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


def is_loopback(host: str) -> bool:
    """True for names that only this machine can reach."""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def host_name(host_header: str) -> str:
    """The name part of a Host header (no port; IPv6 brackets removed)."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class FailureLimiter:
    """Counts failed tokens per client address; too many in a window are refused."""

    def __init__(self, limit: int = 10, window: float = 60.0) -> None:
        self.limit = limit
        self.window = window
        self._failures: dict[str, deque[float]] = {}

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
    ) -> None:
        self.app = app
        self.token = token
        self.allowed_hosts = {h.lower() for h in allowed_hosts}
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}
        self.max_body = max_body
        self.limiter = limiter or FailureLimiter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._check(scope, headers)
        if refusal is not None:
            status, detail, extra = refusal
            await _refuse(scope, receive, send, status, detail, extra)
            return
        redirect = self._login_by_url(scope, headers)
        if redirect is not None:
            await send({"type": "http.response.start", "status": 303, "headers": redirect})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, _with_headers(send))

    def _check(
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
            return 403, "Cross-origin request refused.", []
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            if path == "/login" and method == "POST" and self.limiter.blocked(_client(scope)):
                return 429, "Too many failed attempts; wait a minute.", []
            return None
        if self.token is not None:
            bearer = headers.get("authorization", "")
            given, by_cookie = None, False
            if bearer.lower().startswith("bearer "):
                given = bearer[7:].strip()
            else:
                # Lenient parsing: another app's odd cookie on localhost must not hide ours.
                cookies = cookie_parser(headers.get("cookie", ""))
                if COOKIE in cookies:
                    given, by_cookie = cookies[COOKIE], True
            client = _client(scope)
            if self.limiter.blocked(client):
                return 429, "Too many failed attempts; wait a minute.", []
            if given is None and _url_token(scope) is not None:
                return None  # a login by URL: _login_by_url checks it and redirects
            if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
                if given is not None:
                    self.limiter.fail(client)
                if not websocket and method == "GET" and not path.startswith("/api/"):
                    return 303, "Log in first.", [(b"location", b"/login")]
                return 401, "Missing or invalid token.", [(b"www-authenticate", b"Bearer")]
            if by_cookie and (websocket or method in STATE_CHANGING) and origin is None:
                return 403, "Cross-origin request refused (no Origin header).", []
        if not websocket and method in STATE_CHANGING and path.startswith("/api/"):
            length = headers.get("content-length")
            if length is not None and not length.strip().isdigit():
                return 400, "Invalid Content-Length header.", []
            if length is not None and int(length) > self.max_body:
                return 413, f"Request body over the limit of {self.max_body} bytes.", []
            if length is None and "transfer-encoding" in headers:
                return 411, "Send a Content-Length header.", []
            if int(length or 0) > 0 and not _is_json(headers.get("content-type", "")):
                return 415, "The API accepts application/json only.", []
        return None

    def _login_by_url(
        self, scope: Scope, headers: dict[str, str]
    ) -> list[tuple[bytes, bytes]] | None:
        """For GET ?token=…: set the cookie and redirect to the same URL without the token."""
        given = _url_token(scope)
        if given is None or self.token is None:
            return None
        query = parse_qs(_query(scope), keep_blank_values=True)
        rest = {k: v for k, v in query.items() if k != "token"}
        location = scope["path"] + (f"?{urlencode(rest, doseq=True)}" if rest else "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            self.limiter.fail(_client(scope))
            return [(b"location", b"/login?failed=1"), *SECURITY_HEADERS]
        return [
            (b"location", location.encode()),
            (b"set-cookie", session_cookie(self.token, secure=scope.get("scheme") == "https")),
            *SECURITY_HEADERS,
        ]


def check_login(expected: str | None, given: str, limiter: FailureLimiter, scope: Scope) -> bool:
    """Check a token typed into the login form (a failure counts against the client)."""
    ok = expected is None or hmac.compare_digest(given.encode(), expected.encode())
    if not ok:
        limiter.fail(_client(scope))
    return ok


def session_cookie(token: str, *, secure: bool) -> bytes:
    """The Set-Cookie value that logs a browser in."""
    value = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age=2592000"
    return (value + ("; Secure" if secure else "")).encode()


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return client[0] if client else "unknown"


def _query(scope: Scope) -> str:
    return scope.get("query_string", b"").decode("latin-1")


def _url_token(scope: Scope) -> str | None:
    """The token= of a plain GET page request (a login by URL), blank included."""
    if scope["type"] != "http" or scope.get("method") != "GET":
        return None
    values = parse_qs(_query(scope), keep_blank_values=True).get("token")
    return values[0] if values else None


def _is_json(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == "application/json"


def _with_headers(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message.setdefault("headers", [])
            message["headers"] = list(message["headers"]) + SECURITY_HEADERS
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
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        # Close before accepting: the handshake fails with 403; the reason is in the log.
        await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})
        return
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *extra,
        *SECURITY_HEADERS,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
