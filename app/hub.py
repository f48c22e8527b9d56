"""In-process fan-out of conversation events to every subscribed browser tab.

Each event of a conversation carries the next number of that conversation's
sequence. The hub keeps the most recent events so that a tab that reconnects
gets exactly what it missed; one that asks for more than is kept, or that falls
behind, is told to resync (reload its state) instead.

Each event is encoded to JSON once, when it is published, and appended once to its
conversation's stream: each tab only keeps its place in it, so a hundred tabs cost one
encoding and one append per event, not a hundred, and tabs at the same place send the
same frame, joined once. A conversation's tabs are woken once per burst of events, not
once per event: a streaming agent emits one delta per loop turn, and waking every tab's
sender for each one would spend the loop on frames of one event. The hub holds the wake-up
while each loop turn brings a new event, up to HOLD, or up to as long as the tabs' last
sending took when that is longer (so many tabs never starve the agent); a lone event waits
one loop turn.

What a tab can make the relay hold is bounded: how far behind it is, in events and in
characters (SUBSCRIBER_QUEUE, SOCKET_BUDGET: a conversation's stream keeps no more), each
frame by characters (FRAME_CHARS), and a conversation's replay by events and by characters
(REPLAY_CHARS). A conversation nobody touched for a while is released (`release`): its
numbering starts again from the database (the supervisor stores the last number first), and
a tab that comes back with an older seq gets a snapshot.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from json.encoder import c_make_encoder  # type: ignore[attr-defined]
from typing import Any, NamedTuple

Event = dict[str, Any]

REPLAY_EVENTS = 2048  # events kept per conversation for reconnecting tabs
REPLAY_CHARS = 1024 * 1024  # characters of JSON kept per conversation for reconnecting tabs
# Events a tab may fall behind before it is dropped. A queued event costs a tab one pointer
# (every tab queues the same text), so this bounds time behind more than memory: 16,384
# deltas are seconds of a fast stream (SOCKET_BUDGET bounds the characters).
SUBSCRIBER_QUEUE = 16384
SOCKET_BUDGET = 8 * 1024 * 1024  # characters of JSON one tab's queue may hold
FRAME_CHARS = 256 * 1024  # a frame takes queued texts up to this many characters (one at least)
HOLD = 0.0003  # seconds a burst may gather before its tabs are woken (more with many tabs)
RESYNC = '{"type":"resync","reason":"fell behind"}'
TRIM_EVERY = 64  # texts every tab took are forgotten in slices of at least this many


# One encoder for every event: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _unserializable(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# JSONEncoder.encode builds its C encoder again at every call, half the cost of a small
# event: this one is built once (the same output; events are trees, never circular).
_C_ENCODE = (
    c_make_encoder(
        None, _unserializable, json.encoder.encode_basestring, None, ":", ",", False, False, True
    )
    if c_make_encoder is not None
    else None
)


_STRING: Callable[[str], str] = json.encoder.encode_basestring  # as the encoder writes a str


def encode(event: Event) -> str:
    """An event as the compact JSON text a socket sends."""
    if _C_ENCODE is None:  # an interpreter without json's C speedups
        return _ENCODER.encode(event)
    return "".join(_C_ENCODE(event, 0))


class Published(NamedTuple):
    """A published event as a replay gives it: its seq and its JSON text (not the dict)."""

    seq: int
    text: str


class Replay:
    """A conversation's recent events, bounded by count and by characters.

    Each is kept as a plain (seq, text) tuple: one allocation per delta on the hot path (a
    Published is made only for a replay, which is rare).
    """

    __slots__ = ("chars", "events", "published")

    def __init__(self) -> None:
        self.events: deque[tuple[int, str]] = deque()
        self.chars = 0
        self.published = 0  # events appended, ever (a burst's wake-up counts them)

    def append(self, seq: int, text: str) -> None:
        """Keep an event, forgetting the oldest beyond the bounds (the newest always stays)."""
        self.published += 1
        events = self.events
        if len(events) >= REPLAY_EVENTS:  # (a full replay while streaming: one out, one in)
            self.chars -= len(events.popleft()[1])
        events.append((seq, text))
        self.chars += len(text)
        while self.chars > REPLAY_CHARS and len(events) > 1:
            self.chars -= len(events.popleft()[1])


class Stream:
    """A conversation's recent events as every following tab reads them: one list, a cursor each.

    Publishing appends an event's text once, however many tabs follow: a tab's position is a
    number (Subscriber.cursor), not a queue it must be given each event. Tabs at the same
    position take the same frame, joined once (`frame`).
    """

    __slots__ = ("base", "base_chars", "ends", "frame", "texts", "total")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.ends: list[int] = []  # characters appended ever, up to and with each text
        self.base = 0  # the position of texts[0]
        self.base_chars = 0  # characters appended ever before texts[0]
        self.total = 0  # characters appended ever
        self.frame: tuple[int, int, str] = (0, 0, "")  # the last frame joined: start, end, text

    @property
    def head(self) -> int:
        """The position after the last text."""
        return self.base + len(self.texts)

    def append(self, text: str) -> None:
        """Add an event's text for every follower."""
        self.texts.append(text)
        self.total += len(text)
        self.ends.append(self.total)

    def chars_from(self, position: int) -> int:
        """Characters of the texts from position (within the list) to the head."""
        first = position - self.base
        return self.total - (self.ends[first - 1] if first > 0 else self.base_chars)

    def trim(self, keep_from: int) -> None:
        """Forget the texts before keep_from (no follower needs them)."""
        drop = min(keep_from, self.head) - self.base
        if drop <= 0:
            return
        self.base_chars = self.ends[drop - 1]
        del self.texts[:drop]
        del self.ends[:drop]
        self.base += drop


@dataclass(eq=False, slots=True)
class Subscriber:
    """One tab's view: its place in its conversation's stream, and its own queue of messages.

    Its own messages (answers, replays, broadcasts) each wait for the stream position they were
    queued at, so the tab gets everything in the order it happened.
    """

    queue: deque[str] = field(default_factory=deque)  # its own messages, as JSON texts
    due: deque[int] = field(default_factory=deque)  # each one's stream position: sent from there
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # set: the sender may take
    conversation_id: int | None = None
    overflowed: bool = False
    chars: int = 0  # characters in queue
    room: asyncio.Event = field(default_factory=asyncio.Event)  # set: under half the budget
    stream: Stream | None = None  # the followed conversation's (None: none, or fallen behind)
    cursor: int = 0  # the stream position of the next event to send

    def offer(self, message: Event | str, *, wake: bool = True) -> None:
        """Queue a message (or its JSON text) without waiting; a full queue means fallen behind."""
        self.put(message if isinstance(message, str) else encode(message))
        if wake and not self.overflowed:
            self.ready.set()

    def put(self, text: str) -> None:
        """Queue a message's JSON text without waking the sender."""
        if self.overflowed:
            return
        queue = self.queue
        if queue:
            chars = self.chars + len(text)
            if chars > SOCKET_BUDGET or len(queue) >= SUBSCRIBER_QUEUE:
                self._overflow()
                return
        else:
            chars = len(text)
        queue.append(text)
        stream = self.stream
        self.due.append(0 if stream is None else stream.base + len(stream.texts))
        self.chars = chars
        if chars > SOCKET_BUDGET // 2:
            self.room.clear()

    def _overflow(self) -> None:
        self.overflowed = True
        self.stream = None  # nothing more of the conversation until the tab subscribes again
        # Drop what is queued for the one message that tells the tab to reload.
        self.queue.clear()
        self.due.clear()
        self.queue.append(RESYNC)
        self.due.append(0)
        self.chars = len(RESYNC)
        self.room.set()
        self.ready.set()

    def _fell_behind(self, stream: Stream) -> bool:
        """Further behind than a tab may be, in events or in characters (then it resyncs)."""
        cursor = self.cursor
        if cursor < stream.base:
            return True  # what it had not read was forgotten (Hub._trim)
        behind = stream.base + len(stream.texts) - cursor
        if not behind:
            return False
        waiting = behind + len(self.queue)
        return waiting > SUBSCRIBER_QUEUE or (
            waiting > 1 and stream.chars_from(cursor) + self.chars > SOCKET_BUDGET
        )

    def _take(self, limit: int, chars: int) -> tuple[list[str], tuple[int, int] | None]:
        """Take what is due, oldest first, up to limit texts and chars characters (one at least).

        Also returns (start, end) when the texts are exactly that slice of the stream (a frame
        other tabs may share).
        """
        stream = self.stream
        if stream is not None and self._fell_behind(stream):
            self._overflow()
            stream = None
        queue, due = self.queue, self.due
        taken: list[str] = []
        size = 0
        shared: tuple[int, int] | None = None
        while len(taken) < limit:
            if queue and (stream is None or due[0] <= self.cursor):
                text = queue[0]
                if taken and size + len(text) > chars:
                    break
                queue.popleft()
                due.popleft()
                self.chars -= len(text)
                taken.append(text)
                size += len(text)
                continue
            if stream is None:
                break
            base, ends = stream.base, stream.ends
            start = self.cursor
            stop = min(base + len(ends), start + limit - len(taken))
            if queue:
                stop = min(stop, due[0])
            if start >= stop:
                break
            first = start - base
            before = ends[first - 1] if first else stream.base_chars
            # The texts from start that fit in what is left of chars (one, when nothing yet).
            end = bisect.bisect_right(ends, before + chars - size, first, stop - base) + base
            if end == start:
                if taken:
                    break
                end = start + 1
            shared = (start, end) if not taken else None
            taken += stream.texts[first : end - base]
            size += ends[end - base - 1] - before
            self.cursor = end
            if end < stop:
                break  # the frame is full
        if shared is not None and len(taken) != shared[1] - shared[0]:
            shared = None  # own messages were taken too: this frame is the tab's own
        if not queue:
            self.chars = 0
        if self.chars <= SOCKET_BUDGET // 2:
            self.room.set()
        return taken, shared

    def pending(self) -> list[str]:
        """Take everything due now, in order (a tab leaving its stream; tests)."""
        return self._take(2**62, 2**62)[0]

    async def take(self, limit: int, chars: int = FRAME_CHARS) -> list[str]:
        """Wait until woken; take texts, oldest first, up to limit of them and chars of text."""
        while True:
            taken, _shared = self._take(limit, chars)
            if taken:
                return taken
            self.ready.clear()
            await self.ready.wait()

    async def frame(self, limit: int, chars: int = FRAME_CHARS) -> str:
        """Wait for the next frame: one text as it is, several as a JSON array.

        Tabs at the same place in the same stream get the same frame, joined once.
        """
        while True:
            taken, shared = self._take(limit, chars)
            if taken:
                break
            self.ready.clear()
            await self.ready.wait()
        if len(taken) == 1:
            return taken[0]
        stream = self.stream
        if shared is None or stream is None:
            return f"[{','.join(taken)}]"
        start, end, text = stream.frame
        if (start, end) != shared:
            text = f"[{','.join(taken)}]"
            stream.frame = (*shared, text)
        return text

    def detach(self) -> None:
        """Leave the stream: what it still had to send of it joins the tab's own queue."""
        if self.stream is None:
            return
        taken = self.pending()
        self.stream = None
        if taken:
            self.queue.extend(taken)  # pending() took all of the queue too
            self.due.extend([0] * len(taken))
            self.chars += sum(len(text) for text in taken)

    async def wait_for_room(self) -> None:
        """Wait until the queue holds less than half the budget (the tab reads what it asked)."""
        if self.chars > SOCKET_BUDGET // 2 and self.queue:
            await self.room.wait()


class Hub:
    """Conversation event streams and the global conversation-list stream."""

    def __init__(self, load_seq: Callable[[int], int]) -> None:
        self.epoch = secrets.token_hex(6)  # a new epoch per relay start: old seqs are void
        self._load_seq = load_seq
        # Numbers are taken by the storage writer thread and by the loop: under this lock.
        # Events reach tabs on the loop only (`soon` carries them there), in seq order: one
        # numbered while an earlier number is still being stored waits for it (_held).
        self.lock = threading.RLock()
        self.soon: Callable[..., None] = lambda fn, *args: fn(*args)
        self._seq: dict[int, int] = {}
        self._shown: dict[int, int] = {}  # the last seq published, all before it published
        self._held: dict[int, dict[int, Event]] = {}
        self._recent: dict[int, Replay] = {}
        self._by_conversation: dict[int, set[Subscriber]] = {}
        self._streams: dict[int, Stream] = {}  # the followed conversations' events, for their tabs
        self._everyone: set[Subscriber] = set()
        self._waking: dict[int, asyncio.Task[None]] = {}  # conversations holding a wake-up
        self._touched: dict[int, float] = {}  # when each conversation's state was last used
        # Called with (conversation_id, event) for each published event but deltas (the hot
        # path: a call per streamed piece of text, and no watcher wants them) and (None, event)
        # for each broadcast one, after the tabs got it (app/notify.py). They must not raise.
        self.watchers: list[Callable[[int | None, Event], None]] = []
        # The global feed as this process delivers it to its tabs: how many events so far,
        # under an id of its own (a restarted relay or another cluster node counts anew).
        # A list answer and a tab's hello each carry it (see feed()).
        self._feed_id = secrets.token_hex(6)
        self._fed = 0

    def _known(self, conversation_id: int) -> None:
        """Load a conversation's numbering (read outside the lock: it is database I/O)."""
        if conversation_id not in self._seq:
            loaded = self._load_seq(conversation_id)
            with self.lock:
                if conversation_id not in self._seq:
                    self._seq[conversation_id] = loaded
                    self._shown[conversation_id] = loaded
                    self._touched[conversation_id] = time.monotonic()

    def knows(self, conversation_id: int) -> bool:
        """Whether a conversation's numbering is loaded (prime would read nothing)."""
        return conversation_id in self._seq

    def next_seq(self, conversation_id: int) -> int:
        """Take the next sequence number of a conversation."""
        if conversation_id not in self._seq:  # (a call less per delta once it is known)
            self._known(conversation_id)
        with self.lock:
            current = self._seq[conversation_id] + 1
            self._seq[conversation_id] = current
            self._touched[conversation_id] = time.monotonic()
        return current

    def rewind(self, conversation_id: int, seq: int) -> None:
        """Give back a number nothing was published with (a later one taken: a skip event)."""
        with self.lock:
            if self._seq.get(conversation_id) == seq:
                self._seq[conversation_id] = seq - 1
                return
        self.publish(conversation_id, {"type": "skip", "seq": seq})  # tabs see no gap

    def current_seq(self, conversation_id: int) -> int:
        """The last sequence number given out for a conversation."""
        self._known(conversation_id)
        return self._seq[conversation_id]

    def shown_seq(self, conversation_id: int) -> int:
        """The last seq published (on the loop: every event up to it reached the tabs)."""
        self._known(conversation_id)
        return self._shown[conversation_id]

    def prime(self, conversation_id: int) -> None:
        """Load a conversation's numbering now (in a storage thread), not later on the loop.

        A conversation loaded already counts as used now: the caller goes on with it on the
        loop, and the idle sweep must not release it in between (a read on the loop, or a
        snapshot where a replay would do).
        """
        if conversation_id in self._seq:
            with self.lock:
                if conversation_id in self._seq:  # (released meanwhile: loaded anew below)
                    self._touched[conversation_id] = time.monotonic()
        self._known(conversation_id)

    def publish(self, conversation_id: int, event: Event) -> Event:
        """Send an event (which must carry its seq) to the conversation's tabs, in seq order."""
        event["conversation_id"] = conversation_id
        self.soon(self._publish_in_order, conversation_id, event)
        return event

    def publish_delta(self, conversation_id: int, seq: int, entry_id: int, text: str) -> None:
        """Publish a streamed piece of a message's text, numbered seq (the hot path).

        The same as publishing {"type": "delta", "entry_id", "text", "seq"}, with the same
        JSON text, without the dict and the encoder; in order on the loop (the usual case)
        it goes straight to the tabs.
        """
        self.soon(self._publish_delta, conversation_id, seq, entry_id, text)

    def stream_delta(self, conversation_id: int, entry_id: int, text: str, seqs: list[int]) -> None:
        """Number a streamed piece of text and publish it: next_seq and publish_delta in one.

        On the loop only (a single node's streaming reply read at once: the hottest path),
        under one taking of the lock; seqs (the message's) gets the number before any tab
        sees it. (Not touched: a conversation streaming a reply is never released.)
        """
        if conversation_id not in self._seq:
            self._known(conversation_id)
        self._publish_delta(conversation_id, 0, entry_id, text, seqs)

    def _publish_delta(
        self,
        conversation_id: int,
        seq: int,
        entry_id: int,
        text: str,
        seqs: list[int] | None = None,
    ) -> None:
        """Publish a delta numbered seq; given seqs, number it now instead, and append it there."""
        with self.lock:
            if seqs is not None:
                seq = self._seq[conversation_id] + 1
                self._seq[conversation_id] = seq
                seqs.append(seq)
            next_in_order = (
                self._shown.get(conversation_id, seq - 1) == seq - 1
                and conversation_id not in self._held
            )
            if next_in_order:
                self._shown[conversation_id] = seq
        if not next_in_order:  # an earlier number is still being stored: the general way
            event = {"type": "delta", "entry_id": entry_id, "text": text, "seq": seq}
            event["conversation_id"] = conversation_id
            self._publish_in_order(conversation_id, event)
            return
        # Exactly what encode() makes of that dict: the same keys, in the same order.
        encoded = (  # (ints: as {x:d} writes them, without its format call)
            f'{{"type":"delta","entry_id":{entry_id},"text":{_STRING(text)},'
            f'"seq":{seq},"conversation_id":{conversation_id}}}'
        )
        self._fan_out(conversation_id, seq, encoded)  # (watchers are never shown deltas)

    def _publish_in_order(self, conversation_id: int, event: Event) -> None:
        seq: int = event["seq"]
        with self.lock:
            shown = self._shown.get(conversation_id, seq - 1)
            if seq > shown + 1:  # an earlier number is still being stored
                self._held.setdefault(conversation_id, {})[seq] = event
                return
            ready = [event]
            shown = max(shown, seq)
            held = self._held.get(conversation_id)
            while held and shown + 1 in held:
                shown += 1
                ready.append(held.pop(shown))
            if held is not None and not held:
                del self._held[conversation_id]
            self._shown[conversation_id] = shown
        for each in ready:
            self._deliver(conversation_id, each)

    def _deliver(self, conversation_id: int, event: Event) -> None:
        """Fan an event out to this node's tabs, then show it to the watchers."""
        self._fan_out(conversation_id, event["seq"], encode(event))  # once, however many tabs
        if event.get("type") != "delta":
            self._watch(conversation_id, event)

    def _watch(self, conversation_id: int | None, event: Event) -> None:
        """Show the watchers an event this node published (once, on the node that made it)."""
        for watch in self.watchers:
            watch(conversation_id, event)

    def _fan_out(self, conversation_id: int, seq: int, text: str) -> None:
        """Keep an encoded event for replay and queue it for the conversation's tabs."""
        recent = self._recent.get(conversation_id)
        if recent is None:
            recent = self._recent[conversation_id] = Replay()
        recent.append(seq, text)
        if conversation_id in self._by_conversation:
            stream = self._streams[conversation_id]
            stream.append(text)  # once, however many tabs: each has its place in the stream
            if len(stream.texts) > 2 * SUBSCRIBER_QUEUE:
                self._trim(conversation_id)
            if conversation_id not in self._waking:  # (else a wake-up is held already)
                self._wake_soon(conversation_id)

    def emit(self, conversation_id: int, event: Event) -> Event:
        """Number an ephemeral event (not stored) and publish it."""
        event["seq"] = self.next_seq(conversation_id)
        return self.publish(conversation_id, event)

    def broadcast(self, event: Event) -> None:
        """Send an event to every connected tab (conversation list changes)."""
        self.soon(self._broadcast, event)

    def _broadcast(self, event: Event) -> None:
        self._broadcast_text(encode(event))
        self._watch(None, event)

    def _broadcast_text(self, text: str) -> None:
        self._fed += 1
        for subscriber in self._everyone:
            subscriber.offer(text)

    def feed(self) -> dict[str, Any]:
        """Where the global feed is now, on this process: {"id", "count"} (read on the loop).

        A tab registered (connect) when the count was c gets every global event counted after c;
        a conversation list read after the count was c holds every change counted up to c
        (an event is broadcast after its change is stored). So a tab whose list was read at c
        and whose socket was registered at h > c may have missed events c+1..h: it reads the
        list again. Same id and h <= c: nothing was missed.
        """
        return {"id": self._feed_id, "count": self._fed}

    def connect(self) -> Subscriber:
        """Register a new tab."""
        subscriber = Subscriber()
        self._everyone.add(subscriber)
        return subscriber

    def disconnect(self, subscriber: Subscriber) -> None:
        """Forget a tab."""
        self._everyone.discard(subscriber)
        self._leave(subscriber)

    async def start(self) -> None:
        """Start what the hub runs beside the loop (nothing in one process)."""

    async def stop(self) -> None:
        """Stop what start started."""

    async def prepare(self, conversation_id: int) -> None:
        """Get ready to replay and follow a conversation (a cluster node reads its stream)."""

    def missed(
        self, conversation_id: int, epoch: str | None, seq: int | None
    ) -> list[Published] | None:
        """Events after seq, or None when they cannot be replayed exactly.

        On the loop: a conversation whose numbering is not loaded here (released since the
        caller primed it) has nothing kept to replay, and loading it would read the database.
        """
        # (Not knows(): on a cluster node _seq holds what it read of the stream, which is what
        # a replay needs, while knows() says whether it set the shared counter.)
        if epoch != self.epoch or seq is None or conversation_id not in self._seq:
            return None
        current = self.shown_seq(conversation_id)
        if seq == current:
            return []
        if seq > current:
            return None
        recent = self._recent.get(conversation_id)
        if not recent or recent.events[0][0] > seq + 1:
            return None
        return [Published._make(kept) for kept in recent.events if kept[0] > seq]

    def follow(self, subscriber: Subscriber, conversation_id: int) -> None:
        """Make a tab receive a conversation's events from now on (and no other's)."""
        self._leave(subscriber)
        subscriber.conversation_id = conversation_id
        subscriber.overflowed = False
        stream = self._streams.get(conversation_id)
        if stream is None:
            stream = self._streams[conversation_id] = Stream()
        subscriber.stream = stream
        subscriber.cursor = stream.base + len(stream.texts)
        self._by_conversation.setdefault(conversation_id, set()).add(subscriber)

    def subscribers(self, conversation_id: int) -> int:
        """How many tabs follow a conversation."""
        return len(self._by_conversation.get(conversation_id, ()))

    def held(self) -> set[int]:
        """The conversations whose numbering or replay the hub holds in memory."""
        with self.lock:
            return set(self._seq) | set(self._recent)

    def replay_chars(self, conversation_id: int) -> int:
        """Characters of JSON kept for a conversation's reconnecting tabs."""
        recent = self._recent.get(conversation_id)
        return recent.chars if recent else 0

    def idle(self, before: float, also: Iterable[int] = ()) -> dict[int, int]:
        """Conversations untouched since `before` (monotonic), or in `also`, that no tab follows.

        Returns each one's last seq (what the caller stores before releasing it).
        """
        chosen = set(also)
        with self.lock:  # the writer thread may be numbering
            return {
                conversation_id: seq
                for conversation_id, seq in self._seq.items()
                if (conversation_id in chosen or self._touched.get(conversation_id, 0.0) < before)
                and conversation_id not in self._by_conversation
                and conversation_id not in self._waking
                and conversation_id not in self._held
            }

    def release(self, conversation_id: int) -> None:
        """Forget a conversation's numbering and replay; the caller stored its last seq first."""
        if conversation_id in self._waking or conversation_id in self._held:
            return  # a wake-up is pending (it reads the counters), or events wait
        with self.lock:
            self._seq.pop(conversation_id, None)
            self._shown.pop(conversation_id, None)
            self._recent.pop(conversation_id, None)
            self._touched.pop(conversation_id, None)

    def live_text(self, conversation_id: int) -> dict[int, str]:
        """Streaming entries' text as this hub delivered it (cluster; the runner has it here)."""
        return {}

    def state(self, conversation_id: int, kind: str) -> Any:
        """The last "agent" or "turn" value another node published (cluster; None here)."""
        return None

    def forget(self, conversation_id: int) -> None:
        """A deleted conversation: drop what is kept of it beyond this process (cluster)."""

    def _wake_soon(self, conversation_id: int) -> None:
        """Have the conversation's tabs woken when the current burst of events ends."""
        if conversation_id in self._waking:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop, no senders to wake (unit tests)
            self._wake(conversation_id)
            return
        self._waking[conversation_id] = loop.create_task(self._wake_after_burst(conversation_id))

    async def _wake_after_burst(self, conversation_id: int) -> None:
        clock = time.perf_counter  # the loop's clock may tick in whole milliseconds (uvloop)
        hold = HOLD
        # Kept while this runs (see release); a new cluster epoch forgets it, and tabs resync.
        recent = self._recent[conversation_id]
        try:
            while True:
                # Hold while each loop turn brings a new event, up to the hold.
                deadline = clock() + hold
                count = recent.published
                while True:
                    await asyncio.sleep(0)
                    if recent.published == count or clock() >= deadline:
                        break
                    count = recent.published
                started = clock()
                self._wake(conversation_id)
                await asyncio.sleep(0)  # the woken senders send before this task goes on
                if recent.published == count:
                    return
                # Still streaming: hold at least as long as the tabs' sending took.
                hold = max(HOLD, clock() - started)
        finally:
            del self._waking[conversation_id]

    def _wake(self, conversation_id: int) -> None:
        for subscriber in self._by_conversation.get(conversation_id, ()):
            subscriber.ready.set()
        self._trim(conversation_id)

    def _trim(self, conversation_id: int) -> None:
        """Forget the stream's texts every tab took, and those past what a tab may be behind."""
        stream = self._streams.get(conversation_id)
        if stream is None:
            return
        head = stream.base + len(stream.texts)
        keep = head
        for subscriber in self._by_conversation.get(conversation_id, ()):
            if subscriber.stream is stream and subscriber.cursor < keep:
                keep = subscriber.cursor
        keep = max(keep, head - SUBSCRIBER_QUEUE)  # a tab behind that far is told to resync
        if stream.texts and stream.chars_from(max(keep, stream.base)) > SOCKET_BUDGET:
            # And no more characters than a tab may be behind (the newest text always stays).
            past = bisect.bisect_left(stream.ends, stream.total - SOCKET_BUDGET) + 1
            keep = max(keep, min(stream.base + past, head - 1))
        if keep == head or keep - stream.base >= TRIM_EVERY:
            stream.trim(keep)

    def _leave(self, subscriber: Subscriber) -> None:
        subscriber.detach()
        if subscriber.conversation_id is None:
            return
        followers = self._by_conversation.get(subscriber.conversation_id)
        if followers is not None:
            followers.discard(subscriber)
            if not followers:
                del self._by_conversation[subscriber.conversation_id]
                self._streams.pop(subscriber.conversation_id, None)
        subscriber.conversation_id = None
