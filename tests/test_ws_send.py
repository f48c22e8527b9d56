"""A tab's frames go from its sender to the server's send with nothing in between.

Starlette's WebSocket.send_text, its exception handler's `send` wrapper and the Guard's
header wrapper only act on HTTP responses and the handshake; per frame per tab they were
calls for nothing. The server's own send is watched (a profile hook in the relay's thread)
to see who calls it with each frame.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.sync.client import connect

from app.routes import ws as ws_route
from tests.relay import TOKEN, LiveRelay, make_settings, receive, receive_until

SERVER_SEND = WebSocketsSansIOProtocol.send.__code__  # `oarlock serve`'s WebSocket protocol


@contextmanager
def callers_of_server_send() -> Iterator[list[tuple[str, str, str]]]:
    """(caller's file, caller's name, text) of each websocket.send in threads started inside."""
    seen: list[tuple[str, str, str]] = []

    def watch(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_code is not SERVER_SEND:
            return
        message = frame.f_locals.get("message") or {}
        if message.get("type") == "websocket.send" and frame.f_back is not None:
            caller = frame.f_back.f_code
            seen.append((caller.co_filename, caller.co_qualname, message.get("text") or ""))

    threading.setprofile(watch)  # type: ignore[arg-type]
    try:
        yield seen
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]


def frames_come_straight_from_the_sender(seen: list[tuple[str, str, str]]) -> None:
    frames = [entry for entry in seen if '"type":"hello"' not in entry[2]]
    assert frames, seen
    for filename, name, text in frames:
        assert (Path(filename), name) == (Path(ws_route.__file__), "_send"), (name, text[:80])


def test_frames_skip_every_wrapper_on_a_logged_in_socket(tmp_path: Path) -> None:
    with callers_of_server_send() as seen, LiveRelay(make_settings(tmp_path / "data")) as relay:
        cid = relay.create()["id"]
        with relay.socket() as ws:
            assert receive(ws)["type"] == "hello"
            ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
            assert receive(ws)["type"] == "snapshot"
            assert relay.send(cid, "hello").status_code == 202
            receive_until(ws, lambda m: m["type"] == "turn" and m["turn"]["state"] == "idle")
    frames_come_straight_from_the_sender(seen)


def test_frames_skip_every_wrapper_on_a_socket_with_the_token(tmp_path: Path) -> None:
    # A bearer token, no session: the Guard used to wrap this socket's send for headers.
    with callers_of_server_send() as seen, LiveRelay(make_settings(tmp_path / "data")) as relay:
        url = f"ws://127.0.0.1:{relay.settings.port}/ws"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with connect(url, additional_headers=headers, open_timeout=10) as ws:
            assert receive(ws)["type"] == "hello"
            ws.send(json.dumps({"type": "ping"}))
            assert receive(ws) == {"type": "pong"}
    frames_come_straight_from_the_sender(seen)
