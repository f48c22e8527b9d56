"""What the fake APIs share: a threaded HTTP server on 127.0.0.1, used as a context manager."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

LOREM = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit"]


@dataclass(frozen=True)
class Request:
    """One request a fake received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or a list of text parts/blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


class FakeServer:
    """Serves one handler class in a background thread on a free loopback port."""

    def __init__(self, handler: Callable[[], type[BaseHTTPRequestHandler]], path: str = "") -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler())
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self.port: int = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}{path}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> Self:
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
