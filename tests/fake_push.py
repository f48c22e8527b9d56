"""A fake Web Push service on 127.0.0.1, and a browser's side of a subscription.

The fake records each push (path, headers, encrypted body) and answers 201, or the
status set for a path (410 for a subscription it forgot, 307 to test redirects). A
FakeBrowser holds the P-256 key and auth secret a browser makes when it subscribes,
and decrypts what the relay sent with them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.push import b64url
from tests.fake_server import FakeServer


@dataclass(frozen=True)
class Push:
    """One POST the fake push service received."""

    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class PushLog:
    """What the fake received, and how it answers each path."""

    pushes: list[Push] = field(default_factory=list)
    status: dict[str, int] = field(default_factory=dict)
    location: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to(self, path: str) -> list[Push]:
        """The pushes received at path, oldest first."""
        with self.lock:
            return [push for push in self.pushes if push.path == path]

    def wait(self, path: str, count: int = 1, timeout: float = 30) -> list[Push]:
        """Wait until path received count pushes; return them."""
        deadline = time.monotonic() + timeout
        while len(found := self.to(path)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path}: {len(found)} pushes, not {count}")
            time.sleep(0.02)
        return found


def push_service(log: PushLog) -> FakeServer:
    """A fake push service writing into log (start it with `with`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            with log.lock:
                log.pushes.append(Push(self.path, headers, body))
            status = log.status.get(self.path, 201)
            self.send_response(status)
            if self.path in log.location:
                self.send_header("Location", log.location[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return FakeServer(lambda: Handler)


class FakeBrowser:
    """A browser's keys for one subscription; decrypts the pushes sent to it."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)

    def subscription(self) -> dict[str, Any]:
        """What PushSubscription.toJSON() gives the page."""
        public = self.key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return {
            "endpoint": self.endpoint,
            "expirationTime": None,
            "keys": {"p256dh": b64url(public), "auth": b64url(self.auth)},
        }

    def decrypt(self, push: Push) -> dict[str, Any]:
        """The push's payload, decrypted with this browser's private key."""
        assert push.headers["content-encoding"] == "aes128gcm"
        plain = http_ece.decrypt(
            push.body, private_key=self.key, auth_secret=self.auth, version="aes128gcm"
        )
        payload: dict[str, Any] = json.loads(plain)
        return payload
