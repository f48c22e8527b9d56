"""What one client can make the relay hold or wait for: request bodies, slow requests, snapshots.

Bodies: every route, counted as the bytes arrive (Content-Length absent, chunked or
lying), refused with 413 past the limit and 408 when they do not arrive in time.
Heads: uvicorn has no timeout for a request head that never ends, so the relay
serves HTTP with a subclass of its protocol that closes such connections.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.attachments import body_limit as body_limit_for
from app.config import Settings
from app.hub import encode
from app.security import SECURITY_HEADERS

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SNAPSHOT_CHARS = 1024 * 1024  # a socket's snapshot holds the newest entries that fit in this
WS_MAX_MESSAGE = 64 * 1024  # bytes uvicorn accepts in one WebSocket message (ws.py allows 16 KiB)
MAX_HEAD = 64 * 1024  # bytes of a request line and its headers (nginx's default allows 32 KiB)
# Seconds an idle kept-alive connection stays open. uvicorn's 5 s is exactly httpx's own
# expiry: a request sent as the relay closed the connection was lost (reset, or no answer).
# Longer than the clients' (httpx 5 s, aiohttp 15 s) and proxies' (nginx upstream 60 s).
KEEP_ALIVE_SECONDS = 75


class Refused(HTTPException):
    """A request refused while its body arrives (413, 408): FastAPI answers it as JSON."""

    def __init__(self, status: int, detail: str) -> None:
        # The rest of the body is never read: the connection cannot carry another request.
        super().__init__(status, detail, headers={"connection": "close"})


def body_limit(max_message_bytes: int) -> int:
    """The largest request body: a message at its limit, as JSON may spell it, and the rest.

    JSON writes a character in up to six bytes (a control character as \\u0001; a quote, a
    backslash or a newline in two): sized for that, a message within the limit is never
    refused for its spelling (before: a pasted file near the limit, heavy with newlines and
    quotes, got "Request body over the limit"). Its own limit is checked once read.
    """
    return 6 * max_message_bytes + 4096


def body_limit_detail(limit: int) -> str:
    """The 413 message."""
    return f"Request body over the limit of {limit} bytes."


def body_timeout_detail(timeout: float) -> str:
    """The 408 message for a body that does not arrive in time."""
    return f"The request body did not arrive within {timeout:g} s."


class BodyLimit:
    """ASGI middleware: every request body within max_body bytes, arrived within timeout seconds."""

    def __init__(self, app: ASGIApp, *, max_body: int, timeout: float) -> None:
        self.app = app
        self.max_body = max_body
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length, chunked = _declared_body(scope)
        max_body = body_limit_for(scope.get("method", "GET"), scope["path"], self.max_body)
        if length is not None and length > max_body:
            await _answer(send, 413, body_limit_detail(max_body))
            return
        complete = not chunked and not length
        received = 0
        started = False
        deadline = asyncio.get_running_loop().time() + self.timeout

        async def limited_receive() -> Message:
            nonlocal complete, received
            if complete:  # after the body: waiting for a disconnect is not limited
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise Refused(408, body_timeout_detail(self.timeout)) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_body:
                    raise Refused(413, body_limit_detail(max_body))
                complete = not message.get("more_body", False)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if not complete:  # an answer before the body: close rather than read the rest
                    headers = list(message.get("headers", []))
                    if not any(name.lower() == b"connection" for name, _ in headers):
                        message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except Refused as refused:
            if started:
                raise
            await _answer(send, refused.status_code, refused.detail)


def _declared_body(scope: Scope) -> tuple[int | None, bool]:
    """The Content-Length (None when absent or unreadable) and whether the body is chunked."""
    length: int | None = None
    chunked = False
    for name, value in scope["headers"]:
        if name == b"content-length" and value.strip().isdigit():
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *SECURITY_HEADERS,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class TimedHttpProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol, closing a connection whose request head does not end in time
    or grows too long.

    The clock starts when the connection opens, and on a kept-alive connection at the
    first byte of each new request; it stops when the head is complete. A connection
    that sent nothing is closed silently; one with a partial head gets a 408 first. A head
    (request line and headers) over MAX_HEAD bytes gets a 431 and the connection closes:
    uvicorn keeps every header it is sent, so an endless head, before any token is checked,
    grew the relay by about its size (one review run: 1 GB sent, 1.45 GB held).
    """

    head_timeout = 20.0
    _head_timer: asyncio.TimerHandle | None = None
    _head_begun = False
    _in_head = True  # the bytes that arrive belong to a request head (none since: a body)
    _head_bytes = 0
    _head_tail = b""  # the head's last 3 bytes so far (its end can span two reads)

    def data_received(self, data: bytes) -> None:
        """Count a head's bytes, up to its blank line; refuse a head over the limit before
        the parser reads it (a head that arrived whole in one read included: counted after
        the parser, it had ended, and a head of 64-128 KiB was served)."""
        if self._in_head:
            seen = self._head_tail + data
            end = seen.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4 - len(self._head_tail)
            self._head_tail = seen[-3:]
            if self._head_bytes > MAX_HEAD and not self.transport.is_closing():
                detail = f"The request head is over the limit of {MAX_HEAD} bytes."
                self._refuse(b"431 Request Header Fields Too Large", detail)
                return
        super().data_received(data)

    def on_message_complete(self) -> None:
        """A request's body is complete: what follows is the next request's head."""
        super().on_message_complete()
        self._in_head, self._head_bytes, self._head_tail = True, 0, b""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the head's clock."""
        super().connection_made(transport)
        self._arm_head_timer()

    def on_message_begin(self) -> None:
        """A request's first byte: its head must now end in time."""
        super().on_message_begin()
        self._head_begun = True
        if self._head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        """The head is complete: stop its clock."""
        self._disarm_head_timer()
        self._head_begun = False
        self._in_head = False
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the clock of a connection that is gone."""
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        running = self.cycle is not None and not self.cycle.response_complete
        if self._head_begun and not running:
            detail = f"The request head did not arrive within {self.head_timeout:g} s."
            self._refuse(b"408 Request Timeout", detail)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """A request the parser cannot read (an unknown method, a broken header or chunk):
        uvicorn's 400, as JSON with the security headers like every other error."""
        self._refuse(b"400 Bad Request", msg)

    def _refuse(self, status: bytes, detail: str) -> None:
        """Answer a request whose head never became a request, and close the connection."""
        body = json.dumps({"detail": detail}).encode()
        lines = [
            b"HTTP/1.1 " + status,
            b"content-type: application/json",
            b"content-length: " + str(len(body)).encode(),
            b"connection: close",
            *(name + b": " + value for name, value in SECURITY_HEADERS),
        ]
        self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        self.transport.close()


def protocol_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's HTTP protocol with the head timeout, keep-alive, the WebSocket message limit."""
    protocol = type("TimedHttpProtocol", (TimedHttpProtocol,), {})
    protocol.head_timeout = settings.request_timeout
    return {
        "http": protocol,
        "timeout_keep_alive": KEEP_ALIVE_SECONDS,
        "ws_max_size": WS_MAX_MESSAGE,
    }


def fit_snapshot(view: dict[str, Any], chars: int = SNAPSHOT_CHARS) -> dict[str, Any]:
    """A conversation view whose timeline fits in `chars` of JSON.

    The queued messages at its end go first, the last to run first (the turn's `queued`
    still counts them: the UI says how many more wait); then the oldest entries (has_more
    becomes true, so the tab pages back over HTTP). The newest entry that is not queued stays
    even when it alone is larger.
    """
    timeline: list[dict[str, Any]] = view["timeline"]
    sizes = [len(encode(entry)) + 1 for entry in timeline]
    total = len(encode({**view, "timeline": []})) + sum(sizes)
    if total <= chars:
        return view
    queued = next((i for i, e in enumerate(timeline) if e.get("state") == "queued"), len(timeline))
    end = len(timeline)
    while end > queued and total > chars:
        end -= 1
        total -= sizes[end]
    start = 0
    while queued - start > 1 and total > chars:
        total -= sizes[start]
        start += 1
    if start == 0:
        return {**view, "timeline": timeline[:end]}
    earlier = timeline[start]["seq"]  # the older ones left out: read from the oldest kept
    return {**view, "timeline": timeline[start:end], "has_more": True, "earlier": earlier}


def _find_malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    return trim


_malloc_trim = _find_malloc_trim()


def give_back_memory() -> None:
    """Return freed heap memory to the system: glibc keeps it for reuse otherwise."""
    if _malloc_trim is not None:
        _malloc_trim(0)
