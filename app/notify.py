"""Notify (SPEC §9): a turn ended or a permission question came in a conversation.

The notifier watches the hub's events (it needs no call from the supervisor): a
conversation broadcast as not running after it was broadcast as running is a turn
that ended; a permission entry published as pending is a question. For each it
broadcasts a `notify` event, which open pages show as a browser notification when
they are not looking at that conversation (static/notify.js), and it sends a Web
Push to every subscribed browser that has no visible page (pages say over their
socket whether they are visible). A browser whose page is visible but open on
another conversation shows the page's notification and gets no push; a hidden
page shows its own and gets the push too, with the same tag, so one replaces the
other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import httpx
from py_vapid import Vapid02
from sqlalchemy import delete, or_
from sqlalchemy.engine import Engine
from sqlmodel import select

from app import push, store
from app.config import Settings
from app.db import get_session
from app.hub import Event, Hub, Subscriber
from app.models import LoginSession, PushSubscription
from app.questions import QUESTION_TOOL
from app.sessions import Sessions

if TYPE_CHECKING:
    from app.cluster.presence import Presence

log = logging.getLogger(__name__)

BODIES = {"turn": "Turn finished", "permission": "Permission asked", "question": "Question asked"}
TITLE_CHARS = 80  # a notification shows a line, not a paragraph
MAX_SUBSCRIPTIONS = 200  # rows the table may hold: each is one browser


def question_kind(event: Event) -> str | None:
    """For the event that puts a new question in a timeline: "permission" (may a tool run?)
    or "question" (the agent's own, AskUserQuestion); else None."""
    entry = event.get("entry")
    if event.get("type") != "entry" or not isinstance(entry, dict):
        return None
    data = entry.get("data") or {}
    if entry.get("state") != "pending" or data.get("type") != "permission":
        return None
    return "question" if data.get("tool") == QUESTION_TOOL else "permission"


def payload(kind: str, conversation_id: int, title: str) -> dict[str, Any]:
    """What a notification says: the conversation's title and one short line, nothing more."""
    short = title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 1] + "…"
    return {
        "kind": kind,
        "conversation_id": conversation_id,
        "title": short,
        "body": BODIES[kind],
        "url": f"/c/{conversation_id}",
    }


class Notifier:
    """Turns hub events into notify events and Web Pushes."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        hub: Hub,
        sessions: Sessions | None,
        vapid: Vapid02,
        runs_here: Callable[[int], bool] | None = None,
        shared: Presence | None = None,
    ) -> None:
        self.engine = engine
        # Whether this node runs a conversation's turns (in a cluster, holds its lease): only
        # the node that ran a turn tells of its end, not one that stored a message meanwhile.
        self.runs_here = runs_here
        self.shared = shared  # in a cluster: the visible tabs of every node
        self.hub = hub
        self.sessions = sessions
        self.vapid = vapid
        self.public_key = push.application_server_key(self.vapid)
        extra = tuple(name.lower().strip(".") for name in settings.push_services)
        self.services = push.PUSH_SERVICES + extra
        self.loopback_http = settings.push_loopback_http
        self.contact = settings.push_contact
        self._running: set[int] = set()  # conversations last broadcast as running
        self._visible: dict[Subscriber, str | None] = {}  # visible tabs: their session's key
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._muted = False  # the relay is shutting down: the turns it cuts did not "finish"
        hub.watchers.append(self.on_event)

    # -- what the pages say ----------------------------------------------------------------

    def session_key(self, session_id: str | None) -> str | None:
        """The stored key of a login session id (None without one, or without a token)."""
        if self.sessions is None or not session_id or len(session_id) > 100:
            return None
        return self.sessions.key(session_id)

    @property
    def token_tag(self) -> str | None:
        """A value that changes with the token (None without one): marks a subscription's token."""
        return None if self.sessions is None else self.sessions.key("push subscriptions")

    def presence(self, subscriber: Subscriber, session_key: str | None, visible: bool) -> None:
        """A tab says whether it is visible (document.visibilityState)."""
        if visible:
            self._visible[subscriber] = session_key
        else:
            self._visible.pop(subscriber, None)
        self._share()

    def forget(self, subscriber: Subscriber) -> None:
        """A tab closed its socket."""
        if subscriber in self._visible:
            del self._visible[subscriber]
            self._share()

    def _share(self) -> None:
        if self.shared is not None:
            self.shared.changed(set(self._visible.values()))

    def endpoint_problem(self, endpoint: str) -> str | None:
        """Why pushes may not go to this endpoint (app/push.py's rule), or None."""
        return push.endpoint_problem(
            endpoint, services=self.services, loopback_http=self.loopback_http
        )

    # -- events ----------------------------------------------------------------------------

    def on_event(self, conversation_id: int | None, event: Event) -> None:
        """See every published (conversation_id) and broadcast (None) event."""
        try:
            self._on_event(conversation_id, event)
        except Exception:  # a notification never breaks the turn that caused it
            log.exception("cannot notify of a %s event", event.get("type"))

    def _on_event(self, conversation_id: int | None, event: Event) -> None:
        kind = event.get("type")
        if kind == "conversation" and conversation_id is None:
            view = event.get("conversation") or {}
            cid = view.get("id")
            if self.runs_here is not None and not (isinstance(cid, int) and self.runs_here(cid)):
                return
            if view.get("running"):
                self._running.add(cid)
            elif cid in self._running:
                self._running.discard(cid)
                self.notify("turn", cid, str(view.get("title") or ""))
        elif kind == "conversation_removed":
            self._running.discard(event.get("conversation_id"))
        elif conversation_id is not None and (asked := question_kind(event)) is not None:
            self._start(self._notify_question(asked, conversation_id))

    def _title(self, conversation_id: int) -> str:
        """A conversation's title (in a thread: it reads the database)."""
        with get_session(self.engine) as session:
            conversation = store.get_conversation(session=session, conversation_id=conversation_id)
        return conversation.title if conversation else ""

    async def _notify_question(self, kind: str, conversation_id: int) -> None:
        self.notify(kind, conversation_id, await asyncio.to_thread(self._title, conversation_id))

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work)
        except RuntimeError:  # no loop (unit tests of the hub): nothing to push
            work.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def notify(self, kind: str, conversation_id: int, title: str) -> None:
        """Tell the open pages, and push to the browsers with no visible page."""
        if self._muted:
            return
        body = payload(kind, conversation_id, title)
        self.hub.broadcast({"type": "notify", **body})
        looking = set(self._visible.values())  # decided now, when it happened
        self._start(self._push(body, looking))

    # -- Web Push --------------------------------------------------------------------------

    def targets(self, looking: set[str | None]) -> list[PushSubscription]:
        """Subscriptions of live sessions of this token (or made without one), no page visible."""
        with get_session(self.engine) as session:
            live = select(LoginSession.key).where(LoginSession.expires_at > int(time.time()))
            rows = session.exec(
                select(PushSubscription)
                .where(
                    or_(
                        PushSubscription.session_key.is_(None),  # type: ignore[union-attr]
                        PushSubscription.session_key.in_(live),  # type: ignore[union-attr]
                    )
                )
                .order_by(PushSubscription.id)  # type: ignore[arg-type]
            ).all()
        tag = self.token_tag
        return [row for row in rows if row.session_key not in looking and row.token_tag == tag]

    async def _push(self, body: dict[str, Any], looking: set[str | None]) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        if self.shared is not None:
            looking |= await self.shared.looking()
        # One browser after the other: a user has a few, and each waits at most push.TIMEOUT.
        for row in await asyncio.to_thread(self.targets, looking):
            problem = self.endpoint_problem(row.endpoint)
            if problem is not None:  # stored under other settings: never sent now
                log.warning("push to %s skipped: %s", row.endpoint[:80], problem)
                continue
            target = push.Target(row.endpoint, row.p256dh, row.auth)
            try:
                status = await push.send(self._http(), self.vapid, self.contact, target, data)
            except Exception as error:  # noqa: BLE001 - one browser's failure stops no other's
                log.warning("push to %s failed: %r", row.endpoint[:80], error)
                continue
            if status in push.GONE:
                await asyncio.to_thread(self.remove, row.endpoint)
            elif status >= 300:
                log.warning("push to %s answered %d", row.endpoint[:80], status)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = push.client()
        return self._client

    def remove(self, endpoint: str) -> None:
        """Forget a subscription."""
        with get_session(self.engine) as session:
            session.exec(delete(PushSubscription).where(PushSubscription.endpoint == endpoint))  # type: ignore[call-overload]
            session.commit()

    def mute(self) -> None:
        """Notify of nothing from now on (the relay is stopping its turns)."""
        self._muted = True

    async def close(self) -> None:
        """Let pushes under way finish (briefly), then close the HTTP client."""
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=2)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
