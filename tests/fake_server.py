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


class _Server(ThreadingHTTPServer):
    # Claude Code sends its context report's count_tokens requests 13 at a time: with the
    # default backlog (5) the kernel drops the others' SYNs and they wait 1 s to retry.
    request_queue_size = 128
    daemon_threads = True
    block_on_close = False


class FakeServer:
    """Serves one handler class in a background thread on a free loopback port."""

    def __init__(self, handler: Callable[[], type[BaseHTTPRequestHandler]], path: str = "") -> None:
        self._server = _Server(("127.0.0.1", 0), handler())
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
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
