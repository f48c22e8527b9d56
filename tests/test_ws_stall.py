"""A tab that stops reading is dropped (issue 18, session 5: one timer per tab, not per frame)."""

from __future__ import annotations

import base64
import json
import os
import socket
import time

import pytest

from app.routes import ws as ws_route
from tests.relay import LiveRelay


def test_a_tab_that_stops_reading_is_dropped(
    relay: LiveRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws_route, "SEND_TIMEOUT", 0.5)
    hub = relay.supervisor.hub
    loop = relay.supervisor.storage.loop
    # A raw socket with a small receive buffer that reads the handshake, then nothing more.
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", relay.settings.port))
    key = base64.b64encode(os.urandom(16)).decode()
    raw.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{relay.settings.port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\nCookie: {relay.cookie}\r\nOrigin: {relay.base}\r\n\r\n"
        ).encode()
    )
    try:
        assert raw.recv(4096).startswith(b"HTTP/1.1 101")
        deadline = time.monotonic() + 10
        while not hub._everyone:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (tab,) = hub._everyone
        chunk = json.dumps({"type": "fill", "text": "x" * 64 * 1024})
        deadline = time.monotonic() + 30
        while tab in hub._everyone:  # the relay's frames fill the socket's buffers, then wait
            assert time.monotonic() < deadline, "the tab was not dropped"
            loop.call_soon_threadsafe(tab.offer, chunk)
            time.sleep(0.01)
    finally:
        raw.close()
