"""Exhaustion: oversized and slow requests, and a flood of WebSocket subscribes (issue 12: 6, 9).

The relay runs as `python -m app serve` (the CLI's uvicorn setup, the protocol included);
requests are written on raw sockets, so nothing in between fixes what they send.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from app.hub import encode
from app.limits import MAX_HEAD, SNAPSHOT_CHARS, fit_snapshot
from bench.common import rss_mib
from bench.reliability import TOKEN, Relay

LIMIT = 6 * 256 * 1024 + 4096  # app.limits.body_limit of the default OARLOCK_MAX_MESSAGE_BYTES
TIMEOUT = 1.0  # OARLOCK_REQUEST_TIMEOUT for these relays
OVER_LIMIT = {"detail": f"Request body over the limit of {LIMIT} bytes."}
BODY_LATE = {"detail": "The request body did not arrive within 1 s."}
HEAD_LATE = {"detail": "The request head did not arrive within 1 s."}
HEAD_OVER = {"detail": f"The request head is over the limit of {MAX_HEAD} bytes."}


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Relay, httpx.Client]]:
    """A relay started by the CLI with a 1 s request timeout, and an API client."""
    yield from serve(tmp_path, monkeypatch, TIMEOUT)


@pytest.fixture
def patient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Relay, httpx.Client]]:
    """A relay started by the CLI with a 60 s request timeout, and an API client."""
    yield from serve(tmp_path, monkeypatch, 60)


def serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout: float
) -> Iterator[tuple[Relay, httpx.Client]]:
    """Start `python -m app serve` with this request timeout; stop it afterwards."""
    monkeypatch.setenv("OARLOCK_REQUEST_TIMEOUT", str(timeout))
    relay = Relay(tmp_path)
    client = relay.start()
    try:
        yield relay, client
    finally:
        client.close()
        relay.kill(15)


def connection(relay: Relay) -> socket.socket:
    """A raw TCP connection to the relay."""
    return socket.create_connection(("127.0.0.1", relay.port), timeout=15)


def head(method: str, path: str, *lines: str) -> bytes:
    """A request head with the relay's Host."""
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *lines, "", ""]).encode()


def response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one response: status, headers, body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed without an answer after {data!r}"
        data += chunk
    raw_head, body = data.split(b"\r\n\r\n", 1)
    status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, value = line.split(":", 1)
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of the body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def closed(sock: socket.socket) -> bool:
    """True when the relay closed the connection (EOF or reset)."""
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def assert_answers(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/login", "/healthz", "/api/conversations", "/nowhere"])
def test_declared_body_over_limit_is_refused_before_it_is_sent(
    served: tuple[Relay, httpx.Client], path: str
) -> None:
    relay, client = served
    with connection(relay) as sock:
        sock.sendall(head("POST", path, f"Content-Length: {300 * 1024 * 1024}"))
        sock.sendall(b"t" * 65536)  # a little of the 300 MiB, then wait for the answer
        status, headers, body = response(sock)
        assert (status, headers["content-type"], json.loads(body)) == (
            413,
            "application/json",
            OVER_LIMIT,
        )
        assert closed(sock)
    assert_answers(client)


def test_chunked_body_over_limit_is_refused_while_it_arrives(
    patient: tuple[Relay, httpx.Client],
) -> None:
    relay, client = patient
    chunk = b"token=" + b"t" * (64 * 1024 - 6)
    sent = 0
    with connection(relay) as sock:
        sock.sendall(head("POST", "/login", "Transfer-Encoding: chunked"))
        while not select.select([sock], [], [], 0.3)[0]:  # until the relay answers
            assert sent < 4 * 1024 * 1024, "4 MiB sent and still no answer"
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        status, _headers, body = response(sock)
        assert (status, json.loads(body)) == (413, OVER_LIMIT)
        assert LIMIT < sent <= LIMIT + len(chunk)  # refused at the chunk that went over
        assert closed(sock)
    assert_answers(client)


@pytest.mark.parametrize(
    ("path", "lines"),
    [
        ("/login", ["Content-Type: application/x-www-form-urlencoded"]),
        (
            "/api/conversations",
            [f"Authorization: Bearer {TOKEN}", "Content-Type: application/json"],
        ),
    ],
)
def test_body_that_stops_arriving_gets_408(
    served: tuple[Relay, httpx.Client], path: str, lines: list[str]
) -> None:
    relay, client = served
    with connection(relay) as sock:
        sock.sendall(head("POST", path, *lines, "Content-Length: 100") + b'{"title": "')
        status, headers, body = response(sock)
        assert (status, headers["connection"], json.loads(body)) == (408, "close", BODY_LATE)
        assert closed(sock)
    assert client.get("/api/conversations").json()["conversations"] == []  # nothing stored
    assert_answers(client)


def test_a_head_over_the_limit_gets_431_and_is_closed(served: tuple[Relay, httpx.Client]) -> None:
    """Before any token is checked: uvicorn keeps every header, so an endless head (1 GB sent)
    grew the relay by its size; now the relay answers once the head passes MAX_HEAD bytes."""
    relay, client = served
    before = rss_mib(relay.process.pid)
    with connection(relay) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        line = b"X-Filler: " + b"a" * 1000 + b"\r\n"
        sent = 0
        while sent < 64 * 1024 * 1024:  # 64 MiB, unless the relay answers first
            sock.sendall(line * 16)
            sent += len(line) * 16
            if select.select([sock], [], [], 0.01)[0]:
                break
        status, headers, body = response(sock)
        assert (status, headers["connection"], json.loads(body)) == (431, "close", HEAD_OVER)
        assert sent < 16 * MAX_HEAD  # it answered early, not at the end of the flood
    assert rss_mib(relay.process.pid) - before < 32
    with connection(relay) as sock:  # a head just within the limit is served
        filler = "a" * (MAX_HEAD - 200)
        sock.sendall(head("GET", "/healthz", f"X-Filler: {filler}"))
        status, _headers, _body = response(sock)
        assert status == 200
    # Over the limit in one read (a review: 64-128 KiB heads sent whole were served), and a
    # small head with a large body in the same read (the body is not the head's).
    with connection(relay) as sock:
        sock.sendall(head("GET", "/healthz", f"X-Filler: {'a' * (MAX_HEAD + 1)}"))
        status, headers, body = response(sock)
        assert (status, json.loads(body)) == (431, HEAD_OVER)
    with connection(relay) as sock:
        payload = json.dumps({"title": "a" * (2 * MAX_HEAD)}).encode()
        lines = [f"Authorization: Bearer {TOKEN}", "Content-Type: application/json"]
        length = f"Content-Length: {len(payload)}"
        sock.sendall(head("POST", "/api/conversations", *lines, length) + payload)  # one write
        status, _headers, _body = response(sock)
        assert status == 422  # read and refused as a title, not as a head
    assert_answers(client)


def test_half_sent_head_gets_408_and_is_closed(served: tuple[Relay, httpx.Client]) -> None:
    relay, client = served
    with connection(relay) as sock:
        sock.sendall(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        status, headers, body = response(sock)
        assert (status, headers["connection"], json.loads(body)) == (408, "close", HEAD_LATE)
        assert closed(sock)
    assert_answers(client)


def test_half_sent_head_on_a_kept_alive_connection_gets_408(
    served: tuple[Relay, httpx.Client],
) -> None:
    relay, _client = served
    with connection(relay) as sock:
        sock.sendall(head("GET", "/healthz"))
        status, _headers, body = response(sock)
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 12")
        status, _headers, body = response(sock)
        assert (status, json.loads(body)) == (408, HEAD_LATE)
        assert closed(sock)


def test_an_idle_kept_alive_connection_outlasts_the_clients_expiry(
    served: tuple[Relay, httpx.Client],
) -> None:
    """httpx drops an idle connection after 5 s: the relay must not close it first.

    At uvicorn's own 5 s, a request sent on it as the relay closed it got a reset or
    no answer at all (seen in CI: `httpx.ReadError: Connection reset by peer`).
    """
    relay, _client = served
    with connection(relay) as sock:
        sock.sendall(head("GET", "/healthz"))
        assert response(sock)[0] == 200
        time.sleep(6)
        sock.sendall(head("GET", "/healthz"))
        status, _headers, body = response(sock)
        assert (status, json.loads(body)) == (200, {"status": "ok"})


def test_connection_that_sends_nothing_is_closed_silently(
    served: tuple[Relay, httpx.Client],
) -> None:
    relay, _client = served
    with connection(relay) as sock:
        assert sock.recv(65536) == b""


def test_many_half_sent_requests_are_closed_and_the_relay_answers(
    served: tuple[Relay, httpx.Client],
) -> None:
    relay, client = served
    socks = [connection(relay) for _ in range(300)]
    try:
        for number, sock in enumerate(socks):
            if number % 2:
                sock.sendall(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            else:
                sock.sendall(head("POST", "/login", "Content-Length: 1000") + b"token=")
        assert_answers(client)
        statuses = [response(sock)[0] for sock in socks]
        assert statuses == [408] * len(socks)
        assert all(closed(sock) for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    assert_answers(client)


# -- WebSocket -------------------------------------------------------------------------------


def big_conversation(client: httpx.Client, messages: int) -> int:
    """A conversation whose last page holds `messages` messages of 250 kB each."""
    cid = int(client.post("/api/conversations", json={"provider": "demo"}).json()["id"])
    for n in range(messages):
        text = f"message {n} " + "x" * 250_000
        assert client.post(f"/api/conversations/{cid}/messages", json={"text": text}).is_success
    deadline = time.monotonic() + 120
    while client.get(f"/api/conversations/{cid}?limit=1").json()["turn"]["state"] != "idle":
        assert time.monotonic() < deadline, "the turns never ended"
        time.sleep(0.1)
    return cid


def test_subscribe_flood_holds_bounded_memory(patient: tuple[Relay, httpx.Client]) -> None:
    relay, client = patient
    cid = big_conversation(client, 20)
    view = client.get(f"/api/conversations/{cid}").json()
    assert len(encode(view)) > 5_000_000  # the whole last page is over 5 MB
    assert relay.process is not None
    before = rss_mib(relay.process.pid)
    frames = 40
    url = f"ws://127.0.0.1:{relay.port}/ws"
    origin = f"http://127.0.0.1:{relay.port}"
    login = httpx.get(f"{origin}/?token={TOKEN}", follow_redirects=False)  # starts a session
    headers = {"Cookie": login.headers["set-cookie"].split(";")[0], "Origin": origin}
    with connect(url, additional_headers=headers, max_size=None, max_queue=1) as ws:
        subscribe = json.dumps({"type": "subscribe", "conversation_id": cid})
        for _ in range(frames):  # and read nothing
            ws.send(subscribe)
        peak = before
        for _ in range(20):  # what the relay holds while the tab does not read
            peak = max(peak, rss_mib(relay.process.pid))
            time.sleep(0.25)
        assert_answers(client)
        print(f"flood: {before:.0f} -> {peak:.0f} MiB")
        assert peak - before < 100, f"{peak - before:.0f} MiB more while the tab did not read"
        assert json.loads(ws.recv(timeout=30))["type"] == "hello"
        messages = []
        while sum(message["type"] == "snapshot" for message in messages) < frames:
            messages.append(json.loads(ws.recv(timeout=30)))
    # The global feed's sidebar events may come between them (the last turns' ends, late
    # under load): the conversation's own stream sent one snapshot per subscribe, no more.
    own = [message for message in messages if message["type"] != "conversation"]
    assert [message["type"] for message in own] == ["snapshot"] * frames
    snapshots = [message["conversation"] for message in own]
    newest = [entry["id"] for entry in view["timeline"]][-4:]
    for snapshot in snapshots:  # each the newest entries that fit, the rest paged over HTTP
        assert len(encode(snapshot)) <= SNAPSHOT_CHARS
        assert snapshot["has_more"] is True
        assert [entry["id"] for entry in snapshot["timeline"]][-4:] == newest
    assert_answers(client)


def entry(number: int, size: int) -> dict[str, Any]:
    return {"id": number, "seq": number, "kind": "user", "text": "x" * size}


def test_fit_snapshot_keeps_a_small_view_as_it_is() -> None:
    view = {"id": 1, "timeline": [entry(1, 10), entry(2, 10)], "has_more": False}
    assert fit_snapshot(view, 10_000) is view


def test_fit_snapshot_keeps_the_newest_entries_that_fit() -> None:
    view = {"id": 1, "timeline": [entry(n, 1000) for n in range(1, 11)], "has_more": False}
    fitted = fit_snapshot(view, 3500)
    assert ([e["id"] for e in fitted["timeline"]], fitted["has_more"]) == ([8, 9, 10], True)
    assert fitted["earlier"] == 8  # "Load earlier" reads what was left out
    assert len(encode(fitted)) <= 3500 < len(encode({**fitted, "timeline": view["timeline"][-4:]}))


def test_fit_snapshot_keeps_the_newest_entry_even_alone_too_large() -> None:
    view = {"id": 1, "timeline": [entry(1, 10), entry(2, 5000)], "has_more": False}
    fitted = fit_snapshot(view, 1000)
    assert ([e["id"] for e in fitted["timeline"]], fitted["has_more"]) == ([2], True)


def test_fit_snapshot_leaves_out_the_last_queued_messages_first() -> None:
    # Found by a review: the oldest went first, queued ones included, so a long queue of
    # large messages could leave the next ones to run out and the last ones in.
    sent = [entry(n, 1000) for n in range(1, 4)]
    queued = [{**entry(n, 1000), "state": "queued"} for n in range(4, 8)]
    view = {"id": 1, "timeline": sent + queued, "has_more": False}
    fitted = fit_snapshot(view, 5500)
    assert ([e["id"] for e in fitted["timeline"]], fitted["has_more"]) == ([1, 2, 3, 4, 5], False)
    fitted = fit_snapshot(view, 1500)  # then the oldest; the newest sent one stays
    assert ([e["id"] for e in fitted["timeline"]], fitted["has_more"]) == ([3], True)
    assert fitted["earlier"] == 3


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"BREW /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # an unknown method
        b"GET /healthz HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header: x\r\n\r\n",
        b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
    ],
)
def test_a_request_the_parser_cannot_read_gets_a_json_400(
    served: tuple[Relay, httpx.Client], request_bytes: bytes
) -> None:
    # Found by a hostile review: uvicorn's plain-text 400, without the security headers.
    relay, client = served
    with connection(relay) as sock:
        sock.sendall(request_bytes)
        status, headers, body = response(sock)
        assert (status, headers["content-type"], headers["connection"]) == (
            400,
            "application/json",
            "close",
        )
        assert json.loads(body) == {"detail": "Invalid HTTP request received."}
        assert headers["x-content-type-options"] == "nosniff"
        assert closed(sock)
    assert_answers(client)
