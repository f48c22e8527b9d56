"""Browser logins: a random session id in the cookie, a keyed hash of it in the database.

The cookie is never the token. A row's key is HMAC-SHA256(token, session id), so
changing the token (OARLOCK_TOKEN or data/token) invalidates every session at once,
and a copy of the database alone cannot be used to log in.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Collection

from sqlalchemy import delete
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from app.db import get_session
from app.models import LoginSession

log = logging.getLogger(__name__)

LIFETIME = 30 * 24 * 3600  # seconds: the cookie's Max-Age
# Seconds between two looks at the sessions that have sockets open: one ended elsewhere (a
# log out on another node, expiry) has its sockets closed within this.
CHECK_SECONDS = 2.0


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
        self._close(self.key(session_id))

    def _close(self, key: str) -> None:
        for callback in list(self._watchers.pop(key, ())):
            callback()

    def live(self, keys: Collection[str]) -> set[str]:
        """Those of the stored keys that belong to live sessions (database I/O)."""
        if not keys:
            return set()
        with get_session(self.engine) as db:
            found = db.exec(
                select(LoginSession.key).where(
                    col(LoginSession.key).in_(list(keys)),
                    LoginSession.expires_at > int(time.time()),
                )
            ).all()
        return set(found)

    async def check(self) -> None:
        """Close the open sockets of sessions that ended since they were opened.

        This process closes its own at once on log out; this finds the others: a log out on
        another node of a cluster, a session that expired while its tab stayed open.
        """
        for key in [key for key, watchers in self._watchers.items() if not watchers]:
            del self._watchers[key]  # their sockets closed
        keys = list(self._watchers)
        if not keys:
            return
        live = await asyncio.to_thread(self.live, keys)
        for key in keys:
            if key not in live:
                self._close(key)

    async def check_forever(self, stop: asyncio.Event, every: float = CHECK_SECONDS) -> None:
        """check(), every few seconds, until stop is set (a look under way finishes first)."""
        while True:
            try:
                await asyncio.wait_for(stop.wait(), every)
                return
            except TimeoutError:
                pass
            try:
                await self.check()
            except Exception:  # the database is away: the next look retries
                log.warning("cannot check the open sockets' sessions", exc_info=True)

    def watch(self, session_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call callback when the session ends; returns the function that stops watching."""
        watchers = self._watchers.setdefault(self.key(session_id), set())
        watchers.add(callback)
        return lambda: watchers.discard(callback)
