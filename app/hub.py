"""In-process fan-out of conversation events to every subscribed browser tab.

Each event of a conversation carries the next number of that conversation's
sequence. The hub keeps the most recent events so that a tab that reconnects
gets exactly what it missed; one that asks for more than is kept, or that falls
behind, is told to resync (reload its state) instead.

Each event is encoded to JSON once, when it is published: subscribers queue the
text, so a hundred tabs cost one encoding, not a hundred.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]

REPLAY_EVENTS = 2048  # events kept per conversation for reconnecting tabs
SUBSCRIBER_QUEUE = 4096  # events a tab may fall behind before it is dropped
RESYNC = '{"type":"resync","reason":"fell behind"}'


def encode(event: Event) -> str:
    """An event as the compact JSON text a socket sends."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Published:
    """A published event as kept for replay: its seq and its JSON text (not the dict)."""

    seq: int
    text: str


@dataclass(eq=False)
class Subscriber:
    """One tab's view: a bounded queue of JSON texts the socket's sender drains."""

    queue: asyncio.Queue[str] = field(
        default_factory=lambda: asyncio.Queue(maxsize=SUBSCRIBER_QUEUE)
    )
    conversation_id: int | None = None
    overflowed: bool = False

    def offer(self, message: Event | str) -> None:
        """Queue an event (or its JSON text) without waiting; a full queue means fallen behind."""
        if self.overflowed:
            return
        text = message if isinstance(message, str) else encode(message)
        try:
            self.queue.put_nowait(text)
        except asyncio.QueueFull:
            self.overflowed = True
            # Make room for the one message that tells the tab to reload.
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(RESYNC)


class Hub:
    """Conversation event streams and the global conversation-list stream."""

    def __init__(self, load_seq: Callable[[int], int]) -> None:
        self.epoch = secrets.token_hex(6)  # a new epoch per relay start: old seqs are void
        self._load_seq = load_seq
        self._seq: dict[int, int] = {}
        self._recent: dict[int, deque[Published]] = {}
        self._by_conversation: dict[int, set[Subscriber]] = {}
        self._everyone: set[Subscriber] = set()

    def next_seq(self, conversation_id: int) -> int:
        """Take the next sequence number of a conversation."""
        current = self._seq.get(conversation_id)
        if current is None:
            current = self._load_seq(conversation_id)
        self._seq[conversation_id] = current + 1
        return current + 1

    def rewind(self, conversation_id: int, seq: int) -> None:
        """Give back the last number taken when nothing was published with it."""
        if self._seq.get(conversation_id) == seq:
            self._seq[conversation_id] = seq - 1

    def current_seq(self, conversation_id: int) -> int:
        """The last sequence number given out for a conversation."""
        if conversation_id not in self._seq:
            self._seq[conversation_id] = self._load_seq(conversation_id)
        return self._seq[conversation_id]

    def publish(self, conversation_id: int, event: Event) -> Event:
        """Send an event (which must carry its seq) to the conversation's tabs."""
        event["conversation_id"] = conversation_id
        text = encode(event)  # once, however many tabs follow
        recent = self._recent.get(conversation_id)
        if recent is None:
            recent = self._recent[conversation_id] = deque(maxlen=REPLAY_EVENTS)
        recent.append(Published(event["seq"], text))
        for subscriber in self._by_conversation.get(conversation_id, ()):
            subscriber.offer(text)
        return event

    def emit(self, conversation_id: int, event: Event) -> Event:
        """Number an ephemeral event (not stored) and publish it."""
        event["seq"] = self.next_seq(conversation_id)
        return self.publish(conversation_id, event)

    def broadcast(self, event: Event) -> None:
        """Send an event to every connected tab (conversation list changes)."""
        text = encode(event)
        for subscriber in self._everyone:
            subscriber.offer(text)

    def connect(self) -> Subscriber:
        """Register a new tab."""
        subscriber = Subscriber()
        self._everyone.add(subscriber)
        return subscriber

    def disconnect(self, subscriber: Subscriber) -> None:
        """Forget a tab."""
        self._everyone.discard(subscriber)
        self._leave(subscriber)

    def missed(
        self, conversation_id: int, epoch: str | None, seq: int | None
    ) -> list[Published] | None:
        """Events after seq, or None when they cannot be replayed exactly."""
        if epoch != self.epoch or seq is None:
            return None
        current = self.current_seq(conversation_id)
        if seq == current:
            return []
        if seq > current:
            return None
        recent = self._recent.get(conversation_id)
        if not recent or recent[0].seq > seq + 1:
            return None
        return [published for published in recent if published.seq > seq]

    def follow(self, subscriber: Subscriber, conversation_id: int) -> None:
        """Make a tab receive a conversation's events from now on (and no other's)."""
        self._leave(subscriber)
        subscriber.conversation_id = conversation_id
        subscriber.overflowed = False
        self._by_conversation.setdefault(conversation_id, set()).add(subscriber)

    def subscribers(self, conversation_id: int) -> int:
        """How many tabs follow a conversation."""
        return len(self._by_conversation.get(conversation_id, ()))

    def _leave(self, subscriber: Subscriber) -> None:
        if subscriber.conversation_id is None:
            return
        followers = self._by_conversation.get(subscriber.conversation_id)
        if followers is not None:
            followers.discard(subscriber)
            if not followers:
                del self._by_conversation[subscriber.conversation_id]
        subscriber.conversation_id = None
