"""The WebSocket at /ws: one per tab, following one conversation at a time.

The sender takes whatever is queued when the hub wakes it (once per burst of
events, see hub.py): one event goes out as a JSON object, several as one JSON array.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import anyio
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from app import store
from app.hub import RESYNC, Event, Subscriber
from app.limits import fit_snapshot
from app.models import Conversation
from app.notify import Notifier
from app.security import COOKIE, SERVER_SEND_KEY, Send
from app.supervisor import ConversationError, Supervisor
from app.validation_errors import unreadable_json

MAX_FRAME = 16 * 1024  # clients only send small control messages
MAX_BATCH = 256  # events sent in one frame at most
SEND_TIMEOUT = 10.0  # seconds a frame may wait for a tab to read before the tab is dropped
STALL_CHECKS = 10  # looks per SEND_TIMEOUT at the frame being sent: dropped within 10-11 s

router = APIRouter()


@router.websocket("/ws")
async def websocket(socket: WebSocket) -> None:
    """Run a receiver and a sender together; when either ends, both end."""
    supervisor: Supervisor = socket.app.state.supervisor
    await socket.accept()
    subscriber = supervisor.hub.connect()
    notifier: Notifier = socket.app.state.notifier
    session_key = notifier.session_key(socket.cookies.get(COOKIE))
    stall: Stall | None = None
    try:
        # The feed as the tab was registered (no await since connect): see Hub.feed.
        hello = {"type": "hello", "epoch": supervisor.hub.epoch, "feed": supervisor.hub.feed()}
        await socket.send_json(hello)
        async with anyio.create_task_group() as group:
            stall = Stall(group.cancel_scope.cancel)

            async def receive() -> None:
                with contextlib.suppress(WebSocketDisconnect):
                    await _receive(socket, supervisor, subscriber, session_key)
                group.cancel_scope.cancel()

            async def send() -> None:
                with contextlib.suppress(WebSocketDisconnect):
                    await _send(socket, subscriber, stall)
                group.cancel_scope.cancel()

            group.start_soon(receive)
            group.start_soon(send)
    finally:
        if stall is not None:
            stall.stop()
        supervisor.hub.disconnect(subscriber)
        notifier.forget(subscriber)


class Stall:
    """Drops a tab whose frame waited SEND_TIMEOUT to be sent (it stopped reading).

    One timer per tab looks now and then at when the frame being sent began: a timeout per
    frame (asyncio.timeout, several µs) was paid per frame per tab.
    """

    def __init__(self, drop: Callable[[], Any]) -> None:
        self.drop = drop
        self.since: float | None = None  # loop time the frame being sent began (None: none)
        self.loop = asyncio.get_running_loop()
        self.timer = self.loop.call_later(SEND_TIMEOUT / STALL_CHECKS, self._look)

    def _look(self) -> None:
        since = self.since
        if since is not None and self.loop.time() - since >= SEND_TIMEOUT:
            self.drop()  # it reconnects and resyncs
            return
        self.timer = self.loop.call_later(SEND_TIMEOUT / STALL_CHECKS, self._look)

    def stop(self) -> None:
        """The tab is gone: look no more."""
        self.timer.cancel()


async def _send(socket: WebSocket, subscriber: Subscriber, stall: Stall) -> None:
    """Send the tab its frames, with the server's own send once the socket is accepted.

    Starlette's WebSocket.send_text checks the socket's state and passes the message through
    the framework's wrappers, which act on HTTP responses only: per frame per tab, that is
    work for nothing. A server's send raises OSError once the tab is gone (Starlette made
    that a WebSocketDisconnect): the sender ends, as it did.
    """
    send: Send | None = socket.scope.get(SERVER_SEND_KEY)
    if send is None:  # an app without the Guard (never in create_app)
        send = socket.send
    clock = stall.loop.time
    while True:
        # Encoded events joined, nothing re-encoded; tabs at the same place share the frame.
        frame = await subscriber.frame(MAX_BATCH)
        stall.since = clock()
        try:
            await send({"type": "websocket.send", "text": frame})
        except OSError:
            return
        stall.since = None


async def _receive(
    socket: WebSocket, supervisor: Supervisor, subscriber: Subscriber, session_key: str | None
) -> None:
    while True:
        # Read nothing more while this tab has not read what it asked for: a flood of
        # subscribes costs the relay one queue's budget, not a snapshot per frame.
        await subscriber.wait_for_room()
        message = await socket.receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("bytes") or (message.get("text") or "").encode()
        if len(data) > MAX_FRAME:  # counted in bytes, as the limit is documented
            await socket.close(code=1009, reason="Message too big.")
            return
        raw = data.decode("utf-8", "replace")
        try:
            request = json.loads(raw)
        except json.JSONDecodeError:
            subscriber.offer({"type": "error", "detail": "Messages must be JSON objects."})
            continue
        except (ValueError, RecursionError) as error:  # valid JSON that Python will not read
            detail = unreadable_json(error, "The message") or "Messages must be JSON objects."
            subscriber.offer({"type": "error", "detail": detail})
            continue
        if not isinstance(request, dict):
            subscriber.offer({"type": "error", "detail": "Messages must be JSON objects."})
            continue
        if request.get("type") == "presence":
            visible = request.get("visible") is True
            socket.app.state.notifier.presence(subscriber, session_key, visible)
            subscriber.offer({"type": "presence", "visible": visible})
            continue
        for answer in await _answer(supervisor, subscriber, request):
            subscriber.offer(answer)


async def _answer(
    supervisor: Supervisor, subscriber: Subscriber, request: dict[str, Any]
) -> list[Event | str]:
    """What to send back, in order."""
    kind = request.get("type")
    if kind == "ping":
        return [{"type": "pong"}]
    if kind == "warm":
        return [await _warm(supervisor, request)]
    if kind != "subscribe":
        # Only scalars are named: repr() of a deeply nested list or object would recurse.
        scalar = kind is None or isinstance(kind, str | int | float)
        named = repr(kind)[:60] if scalar else "(a list or object)"
        return [{"type": "error", "detail": f"Unknown message type {named}."}]
    conversation_id = request.get("conversation_id")
    seq = request.get("seq")
    if not _is_id(conversation_id) or (seq is not None and not _is_seq(seq)):
        return [
            {"type": "error", "detail": "subscribe needs an integer conversation_id (and seq)."}
        ]
    return await _subscribe(supervisor, subscriber, conversation_id, request.get("epoch"), seq)


async def _subscribe(
    supervisor: Supervisor,
    subscriber: Subscriber,
    conversation_id: int,
    epoch: Any,
    seq: int | None,
) -> list[Event | str]:
    """Follow a conversation from seq (the events missed), or from a snapshot."""
    hub = supervisor.hub
    await hub.prepare(conversation_id)  # a cluster node reads the conversation's stream first
    gone: list[Event | str] = [_gone(conversation_id)]
    if epoch == hub.epoch and seq is not None:
        if await supervisor.storage.read(_find, supervisor, conversation_id) is None:
            return gone
        # No await from here on: the replay and the live stream join without a gap.
        missed = hub.missed(conversation_id, epoch, seq)
        if missed is not None:
            hub.follow(subscriber, conversation_id)
            if not missed:
                return [{"type": "subscribed", "conversation_id": conversation_id}]
            return [published.text for published in missed]
    try:
        view = await supervisor.view(conversation_id)  # read in a storage thread
    except LookupError:
        return gone
    # Back on the loop: what was published since the snapshot's seq follows it, then the
    # live stream; no await between them.
    replay = hub.missed(conversation_id, hub.epoch, view["seq"])
    hub.follow(subscriber, conversation_id)
    if replay is None:  # more published meanwhile than the hub keeps: the tab reloads
        return [RESYNC]
    snapshot = {
        "type": "snapshot",
        "conversation_id": conversation_id,
        "conversation": fit_snapshot(view),
    }
    return [snapshot, *(published.text for published in replay)]


def _gone(conversation_id: int) -> Event:
    """The answer about a conversation that does not exist (a tab that knew it drops it)."""
    detail = f"No conversation {conversation_id}."
    return {"type": "error", "detail": detail, "conversation_id": conversation_id, "gone": True}


def _find(supervisor: Supervisor, conversation_id: int) -> Conversation | None:
    """The conversation or None, its numbering loaded (in a storage thread)."""
    with supervisor.session() as session:
        conversation = store.get_conversation(session=session, conversation_id=conversation_id)
    if conversation is not None:
        supervisor.hub.prime(conversation_id)
    return conversation


async def _warm(supervisor: Supervisor, request: dict[str, Any]) -> Event:
    """Start a conversation's agent before its message (the user is typing)."""
    conversation_id = request.get("conversation_id")
    if not _is_id(conversation_id):
        return {"type": "error", "detail": "warm needs an integer conversation_id."}
    conversation = await supervisor.storage.read(_find, supervisor, conversation_id)
    if conversation is None:
        return _gone(conversation_id)
    try:
        state = supervisor.warm(conversation)
    except ConversationError as error:
        return {"type": "error", "detail": str(error)}
    return {"type": "warm", "conversation_id": conversation_id, "agent": state}


def _is_seq(value: Any) -> bool:
    """An integer (true is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_id(value: Any) -> bool:
    """A conversation id SQLite can hold."""
    return _is_seq(value) and 1 <= value < 2**63
