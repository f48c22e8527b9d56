"""Browser logins: a random session id in the cookie, a keyed hash of it in the database.

The cookie is never the token. A row's key is HMAC-SHA256(token, session id), so
changing the token (OARLOCK_TOKEN or data/token) invalidates every session at once,
and a copy of the database alone cannot be used to log in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

from sqlalchemy import delete
from sqlalchemy.engine import Engine
from sqlmodel import select

from app.db import get_session
from app.models import LoginSession

LIFETIME = 30 * 24 * 3600  # seconds: the cookie's Max-Age


class Sessions:
    """Create, check and end login sessions for one token."""

    def __init__(self, engine: Engine, token: str) -> None:
        self.engine = engine
        self._token = token.encode()
        self._watchers: dict[str, set[Callable[[], None]]] = {}

    def key(self, session_id: str) -> str:
        """The stored form of a session id."""
        return hmac.new(self._token, session_id.encode(), hashlib.sha256).hexdigest()

    def create(self) -> str:
        """Start a session; returns the id to put in the cookie (stored only hashed)."""
        session_id = secrets.token_urlsafe(32)
        now = int(time.time())
        with get_session(self.engine) as db:
            # Ended and expired rows go as new ones come: the table stays small.
            db.exec(delete(LoginSession).where(LoginSession.expires_at <= now))
            db.add(LoginSession(key=self.key(session_id), expires_at=now + LIFETIME))
            db.commit()
        return session_id

    def valid(self, session_id: str) -> bool:
        """True when the id belongs to a live session of the current token."""
        if not session_id or len(session_id) > 100:
            return False
        with get_session(self.engine) as db:
            row = db.exec(
                select(LoginSession.id).where(
                    LoginSession.key == self.key(session_id),
                    LoginSession.expires_at > int(time.time()),
                )
            ).first()
        return row is not None

    def end(self, session_id: str) -> None:
        """End a session: its cookie no longer logs anyone in, its open sockets close."""
        self.remove(session_id)
        self.close_sockets(session_id)

    def remove(self, session_id: str) -> None:
        """Delete a session's row (database I/O: the relay calls it in a thread)."""
        key = self.key(session_id)
        with get_session(self.engine) as db:
            db.exec(delete(LoginSession).where(LoginSession.key == key))
            db.commit()

    def close_sockets(self, session_id: str) -> None:
        """Close the sockets a session opened (on the event loop)."""
        for callback in list(self._watchers.pop(self.key(session_id), ())):
            callback()

    def watch(self, session_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call callback when the session ends; returns the function that stops watching."""
        watchers = self._watchers.setdefault(self.key(session_id), set())
        watchers.add(callback)
        return lambda: watchers.discard(callback)
