"""The Hub of a cluster node: each conversation's events go through one Redis Stream.

Numbers: one counter per conversation in Redis (INCR), taken before the database write,
so the unique (conversation_id, seq) index and every node agree. Events: appended (XADD,
MAXLEN ~ STREAM_RUNS) by the node that made them, after its commit, a run of one stream's
events packed in one entry (RUN_EVENTS, RUN_CHARS at most); every node reads the streams its
tabs follow (XREAD) and fans them out locally in seq order (ordering.py). The
epoch is shared (a Redis key), so a tab that reconnects to another node with (epoch, seq)
gets exactly what it missed from the stream, or a snapshot once it was trimmed.
The conversation list goes out on a pub/sub channel (no replay: a tab reloads it when it
reconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
import redis.asyncio as aioredis

from app.cluster.ordering import Orderer, contiguous_top
from app.hub import Event, Hub, encode

log = logging.getLogger(__name__)

PREFIX = "oarlock:"
EPOCH_KEY = PREFIX + "epoch"
BROADCAST = PREFIX + "broadcast"
# A stream entry packs a run of one conversation's events ("s": their seqs, space separated;
# "e": their JSON texts, newline separated: JSON text has no raw newline). A reader parses
# one entry per run, not one per event (redis-py: tens of microseconds an entry).
STREAM_RUNS = 1024  # entries kept per conversation stream (approximately: MAXLEN ~)
RUN_EVENTS = 64  # events per entry at most
RUN_CHARS = 16_384  # characters of event text per entry at most (one larger event: alone)
READ_COUNT = 256  # entries per stream an XREAD takes at most (the loop is not held longer)
READ_BLOCK_MS = 1000  # an XREAD waits this long at most (holes are checked in between)
OUTBOX_MAX = 100_000  # events waiting for Redis before the oldest are dropped (tabs resync)
TIMEOUT = 2.0  # seconds any Redis command may take


def stream_key(conversation_id: int) -> str:
    """The conversation's event stream."""
    return f"{PREFIX}events:{conversation_id}"


def seq_key(conversation_id: int) -> str:
    """The conversation's sequence counter."""
    return f"{PREFIX}seq:{conversation_id}"


def id_pair(text: bytes | str) -> tuple[int, int]:
    """A stream entry id ("1700000000000-3") as a pair that sorts as Redis orders them."""
    value = text.decode() if isinstance(text, bytes) else text
    millis, _, number = value.partition("-")
    return int(millis), int(number or 0)


def entry_time(stream_id: bytes | str) -> float:
    """When a stream entry was appended (its id's milliseconds), in seconds."""
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    return int(text.split("-", 1)[0]) / 1000


# INCRBY only a counter that exists: a missing one (new conversation, or Redis lost its data)
# is first set from the database's last_seq, never restarted at 1 under stored entries.
_TAKE = (
    "if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end "
    "return redis.call('INCRBY', KEYS[1], ARGV[1])"
)
# The id of the newest entry trimmed from a stream ("0-0": none; also for no stream).
_TRIMMED = (
    "local info = redis.pcall('XINFO', 'STREAM', KEYS[1]) "
    "if type(info) ~= 'table' or info.err then return '0-0' end "
    "for i = 1, #info, 2 do if info[i] == 'max-deleted-entry-id' then return info[i + 1] end end "
    "return '0-0'"
)


async def cancel_all(tasks: Iterable[asyncio.Task[Any]], seconds: float = 2) -> None:
    """Cancel tasks until each has ended, for at most `seconds` (then say which still run).

    A cancel that lands while redis-py sets up a connection can be lost: the task goes on
    (to read again, or to subscribe anew), and awaiting it once cancelled waits for ever (the
    likely cause of two cluster nodes, their control channel cut, not stopping within 30 s
    in tests).
    """
    pending = {task for task in tasks if not task.done()}
    deadline = time.monotonic() + seconds
    while pending and time.monotonic() < deadline:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=0.1)
    if pending:
        log.warning("cluster tasks still running after stop: %s", pending)


class ClusterHub(Hub):
    """Hub whose numbering and event log live in Redis; fan-out to this node's tabs as before."""

    def __init__(self, load_seq: Callable[[int], int], url: str, node: str) -> None:
        super().__init__(load_seq)
        self.url = url
        self.node = node
        self.sync = redis.Redis.from_url(
            url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT
        )
        self.aio = aioredis.Redis.from_url(url, socket_connect_timeout=TIMEOUT)
        self.epoch = self._shared_epoch()
        self._take = self.sync.register_script(_TAKE)
        self._local = threading.local()  # .spans: numbers taken ahead, {cid: [next, last]}
        self._order: dict[int, Orderer] = {}  # the conversations this node reads, in order
        self._last_id: dict[int, bytes | str] = {}  # the last stream id read, per conversation
        # Per conversation, a stream id up to which every entry was read and delivered (no hole
        # since): entries after it trimmed before this node read them are lost here.
        self._whole: dict[int, bytes | str] = {}
        self._epoch_checked = 0.0  # when the reader last looked at the epoch (monotonic)
        self._live: dict[int, dict[int, list[str]]] = {}  # streaming entries' text, delivered
        # Streaming entries whose text so far this node lacks (a delta came for one it never
        # saw begin, or after a lost hole): asked of the owner once, until it sends the text.
        self._asked: dict[int, set[int]] = {}
        self.on_lost: Callable[[int], None] | None = None  # ask the owner for the whole texts
        self._states: dict[int, dict[str, Any]] = {}  # the last agent and turn events delivered
        self._outbox: deque[tuple[str, Any]] = deque()  # ("x", (cid, seq, text)) | ("b", text)
        self._ready = asyncio.Event()  # set: the outbox has something
        self._drained = asyncio.Event()  # set: the outbox is empty
        self._drained.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._pubsub: Any = None  # the broadcast subscription (closed when lost, and by stop)
        self._nudge = f"{PREFIX}nudge:{node}"
        self._reader_aio: aioredis.Redis | None = None
        self._counted: set[int] = set()  # conversations whose Redis counter is known to exist
        # Numbers for events made on the loop are taken here: an INCR is network I/O, never
        # on the loop. One thread, so they are numbered in the order they were made.
        self._numbering = ThreadPoolExecutor(1, thread_name_prefix="oarlock-seq")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._background: set[asyncio.Task[Any]] = set()

    def _shared_epoch(self) -> str:
        """The cluster's epoch: made by the first node, read by the others."""
        self.sync.set(EPOCH_KEY, secrets.token_hex(6), nx=True)
        value = self.sync.get(EPOCH_KEY)
        return value.decode() if isinstance(value, bytes) else str(value)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer, the stream reader and the broadcast listener."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._reader_aio = aioredis.Redis.from_url(self.url, socket_connect_timeout=TIMEOUT)
        self._tasks = [
            asyncio.create_task(self._write(), name="cluster-write"),
            asyncio.create_task(self._read(), name="cluster-read"),
            asyncio.create_task(self._listen(), name="cluster-listen"),
        ]

    async def stop(self) -> None:
        """Send what is still queued (briefly), stop the tasks, close the connections."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await self.flush()
        self._numbering.shutdown(wait=False, cancel_futures=True)
        await cancel_all(self._tasks)
        await self._close_pubsub()
        for client in (self.aio, self._reader_aio):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()
        self.sync.close()

    # -- numbering ---------------------------------------------------------------------------

    def next_seq(self, conversation_id: int) -> int:
        """Take the conversation's next number from its counter in Redis (every node's).

        One taken ahead by this thread (`reserved`) is used first, without a round trip.
        """
        span = getattr(self._local, "spans", {}).get(conversation_id)
        if span is not None and span[0] <= span[1]:
            span[0] += 1
            self._touched[conversation_id] = time.monotonic()
            return span[0] - 1
        return self._take_numbers(conversation_id, 1)

    def _take_numbers(self, conversation_id: int, count: int) -> int:
        """Take count numbers from the conversation's counter; the last of them."""
        key = seq_key(conversation_id)
        value = int(self._take(keys=[key], args=[count]))
        if value < 0:
            self.sync.set(key, self._load_seq(conversation_id), nx=True)
            value = int(self._take(keys=[key], args=[count]))
        self._counted.add(conversation_id)
        self._touched[conversation_id] = time.monotonic()
        return value

    @contextlib.contextmanager
    def reserved(self, conversation_id: int, count: int) -> Iterator[None]:
        """Take count numbers in one round trip for this thread's next_seq calls meanwhile.

        For a storage job about to number a burst of deltas: one INCRBY, not one INCR each;
        taken before the job changes anything, so that a Redis out of reach fails it first.
        Numbers left unused at the end are filled as holes (`rewind`).
        """
        if count < 1:
            yield
            return
        last = self._take_numbers(conversation_id, count)
        spans: dict[int, list[int]] = self._local.__dict__.setdefault("spans", {})
        spans[conversation_id] = span = [last - count + 1, last]
        try:
            yield
        finally:
            del spans[conversation_id]
            for seq in range(span[0], span[1] + 1):
                self.rewind(conversation_id, seq)

    def knows(self, conversation_id: int) -> bool:
        """Whether this node set the conversation's counter already (prime would do nothing)."""
        return conversation_id in self._counted

    def prime(self, conversation_id: int) -> None:
        """In a storage thread: set a missing counter from the database now, not on the loop."""
        if conversation_id in self._counted:
            return
        self.sync.set(seq_key(conversation_id), self._load_seq(conversation_id), nx=True)
        self._counted.add(conversation_id)

    def shown_seq(self, conversation_id: int) -> int:
        """The seq a snapshot may claim (every event up to it delivered here or stored)."""
        return self.current_seq(conversation_id)

    def emit(self, conversation_id: int, event: Event) -> Event:
        """Number and publish an ephemeral event; without Redis it is dropped (tabs resync).

        Made on the loop, it is numbered in the numbering thread and published from there
        (it carries its seq only then); made in a storage job, at once.
        """
        if self._loop_thread is not None and threading.get_ident() == self._loop_thread:
            self._numbering.submit(self._number_then_publish, conversation_id, event)
            return event
        try:
            event["seq"] = self.next_seq(conversation_id)
        except (redis.RedisError, OSError) as error:  # what was stored before it stays stored
            log.warning("event of conversation %s not sent: %s", conversation_id, error)
            return event
        return self.publish(conversation_id, event)

    def _number_then_publish(self, conversation_id: int, event: Event) -> None:
        """In the numbering thread: take the event's number, publish it on the loop."""
        try:
            event["seq"] = self.next_seq(conversation_id)
        except (redis.RedisError, OSError) as error:
            log.warning("event of conversation %s not sent: %s", conversation_id, error)
            return
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (stopping)
            self._loop.call_soon_threadsafe(self.publish, conversation_id, event)

    async def flush(self) -> None:
        """Wait until every event made so far is numbered and appended to its stream."""
        with contextlib.suppress(RuntimeError):  # the numbering thread was shut down
            await asyncio.wrap_future(self._numbering.submit(lambda: None))
        await asyncio.sleep(0)  # the publishing it handed to the loop runs first
        await self._drained.wait()

    def rewind(self, conversation_id: int, seq: int) -> None:
        """A number taken but not used: another node may hold the next, so fill the hole."""
        self.publish(conversation_id, {"type": "skip", "seq": seq})

    def current_seq(self, conversation_id: int) -> int:
        """The seq a snapshot taken now may claim: every event up to it is stored or sent."""
        order = self._order.get(conversation_id)
        if order is not None:
            return order.delivered
        return self._stream_top(conversation_id)

    def _stream_top(self, conversation_id: int) -> int:
        tail = self.sync.xrevrange(stream_key(conversation_id), count=64)
        top = contiguous_top(
            [
                (int(seq), entry_time(stream_id))
                for stream_id, fields in tail
                for seq in fields[b"s"].split()
            ],
            time.time(),
        )
        if top is not None:
            return top
        counter = self.sync.get(seq_key(conversation_id))
        return int(counter) if counter is not None else self._load_seq(conversation_id)

    # -- publishing --------------------------------------------------------------------------

    def publish(self, conversation_id: int, event: Event) -> Event:
        """Queue an event (which carries its seq) for the conversation's stream.

        From a storage job it goes once the job has committed, on the loop (`soon`).
        """
        event["conversation_id"] = conversation_id
        self._touched[conversation_id] = time.monotonic()
        self.soon(self._append, conversation_id, event)
        return event

    def publish_delta(self, conversation_id: int, seq: int, entry_id: int, text: str) -> None:
        """Publish a streamed piece of text through the shared stream, as any event."""
        self.publish(
            conversation_id, {"type": "delta", "entry_id": entry_id, "text": text, "seq": seq}
        )

    def _append(self, conversation_id: int, event: Event) -> None:
        self._send(("x", (conversation_id, event["seq"], encode(event))))
        self._watch(conversation_id, event)

    def broadcast(self, event: Event) -> None:
        """Send a conversation-list event to every node's tabs."""
        self.soon(self._broadcast, event)

    def _broadcast(self, event: Event) -> None:
        self._send(("b", encode(event)))
        self._watch(None, event)

    def _send(self, item: tuple[str, Any]) -> None:
        if len(self._outbox) >= OUTBOX_MAX:
            self._outbox.popleft()  # Redis has been away long: its tabs will resync
        self._outbox.append(item)
        self._drained.clear()
        self._ready.set()

    async def _write(self) -> None:
        """Append queued events in the order they were made (one pipeline per burst)."""
        delay = 0.1
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._outbox:
                batch = list(self._outbox)
                try:
                    async with self.aio.pipeline(transaction=False) as pipe:
                        for kind, key, args in _commands(batch):
                            if kind == "x":
                                pipe.xadd(
                                    key,
                                    {"s": args[0], "e": args[1]},
                                    maxlen=STREAM_RUNS,
                                    approximate=True,
                                )
                            else:
                                pipe.publish(BROADCAST, args[0])
                        await pipe.execute()
                except (redis.RedisError, OSError) as error:
                    log.warning("cannot reach Redis (%s); retrying in %.1f s", error, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                delay = 0.1
                for _ in batch:
                    if self._outbox:
                        self._outbox.popleft()
            self._drained.set()

    # -- reading -----------------------------------------------------------------------------

    async def prepare(self, conversation_id: int) -> None:
        """Read the conversation's stream so far and follow it from now on (once)."""
        if not isinstance(conversation_id, int) or conversation_id in self._order:
            return
        key = stream_key(conversation_id)
        base = await self.aio.get(seq_key(conversation_id))
        entries = await self.aio.xrange(key)
        if conversation_id in self._order:  # prepared meanwhile
            return
        if entries:
            first = min(int(seq) for _, fields in entries for seq in fields[b"s"].split())
            order = Orderer(first - 1)
        else:  # the database is read in a thread, never on the loop
            loaded = int(base) if base is not None else await self._load_in_thread(conversation_id)
            order = Orderer(loaded)
        with self.lock:  # (the idle sweep reads and releases these in the writer thread)
            self._order[conversation_id] = order
            self._seq[conversation_id] = order.delivered
            self._last_id[conversation_id] = entries[-1][0] if entries else "0-0"
            self._whole[conversation_id] = self._last_id[conversation_id]
            self._touched[conversation_id] = time.monotonic()
        now = time.monotonic()
        for _stream_id, fields in entries:
            self._arrive(conversation_id, fields, now)
        with contextlib.suppress(redis.RedisError, OSError):
            await self.aio.xadd(self._nudge, {"n": "1"}, maxlen=8, approximate=False)

    async def _load_in_thread(self, conversation_id: int) -> int:
        return await asyncio.to_thread(self._load_seq, conversation_id)

    def _arrive(self, conversation_id: int, fields: dict[bytes, bytes], at: float) -> None:
        """Hand on the events of one stream entry (a packed run) that are now in order.

        Those at or below what was delivered are dropped (Orderer.add): an entry that
        straddles a tab's seq gives it only the events after it.
        """
        order = self._order.get(conversation_id)
        if order is None:
            return
        texts = fields[b"e"].decode().split("\n")
        for seq, text in zip(fields[b"s"].split(), texts, strict=True):
            for ready_seq, ready_text in order.add(int(seq), text, at):
                self._fan_out(conversation_id, ready_seq, ready_text)
        self._delivered(conversation_id, order)

    def _fan_out(self, conversation_id: int, seq: int, text: str) -> None:
        """Hand an event on to this node's tabs, keeping streaming text as the owner has it."""
        if text.startswith(('{"type":"delta"', '{"type":"entry"')):
            self._follow_text(conversation_id, json.loads(text))
        elif text.startswith(('{"type":"agent"', '{"type":"turn"')):
            event = json.loads(text)
            self._states.setdefault(conversation_id, {})[event["type"]] = event[event["type"]]
        super()._fan_out(conversation_id, seq, text)

    def state(self, conversation_id: int, kind: str) -> Any:
        """The last "agent" or "turn" value delivered here for a conversation (or None)."""
        return self._states.get(conversation_id, {}).get(kind)

    def _follow_text(self, conversation_id: int, event: Event) -> None:
        live = self._live.setdefault(conversation_id, {})
        if event["type"] == "entry":
            entry = event.get("entry") or {}
            self._asked.get(conversation_id, set()).discard(entry.get("id"))
            if entry.get("state") == "streaming":
                live[entry["id"]] = [entry.get("text") or ""]
            else:
                live.pop(entry.get("id"), None)
        elif event.get("text") and event.get("entry_id") in live:
            live[event["entry_id"]].append(event["text"])
        elif event.get("text"):  # more text of a message whose text so far is not known here
            asked = self._asked.setdefault(conversation_id, set())
            if event.get("entry_id") not in asked and self.on_lost is not None:
                asked.add(event.get("entry_id"))
                self.on_lost(conversation_id)  # its owner sends it whole (an "entry" event)

    def live_text(self, conversation_id: int) -> dict[int, str]:
        """The text streamed so far of the conversation's streaming entries, as delivered here.

        Read in a reader thread (a snapshot) while the loop adds to them: copied at once.
        """
        live = list(self._live.get(conversation_id, {}).items())
        return {eid: "".join(parts) for eid, parts in live}

    def _delivered(self, conversation_id: int, order: Orderer) -> None:
        """Note how far a followed conversation's events were handed on (unless released).

        The idle sweep releases conversations in the writer thread: a number noted after that
        would bring a released conversation back into the numbering, in the middle of the
        sweep's look at it.
        """
        with self.lock:
            if self._order.get(conversation_id) is order:
                self._seq[conversation_id] = order.delivered

    def _mark_whole(self, conversation_id: int) -> None:
        """Everything read of the conversation's stream so far arrived (no hole behind it)."""
        with self.lock:
            last = self._last_id.get(conversation_id)
            if last is not None:
                self._whole[conversation_id] = last

    async def _read(self) -> None:
        """XREAD every followed stream (and this node's nudge stream) from where it was left."""
        assert self._reader_aio is not None
        nudge_id: bytes | str = "$"
        delay = 0.1
        while True:
            streams: dict[Any, Any] = {self._nudge: nudge_id}
            with self.lock:  # the idle sweep (writer thread) releases conversations meanwhile
                streams |= {stream_key(cid): self._last_id[cid] for cid in self._order}
            try:
                answer = await self._reader_aio.xread(
                    streams, count=READ_COUNT, block=READ_BLOCK_MS
                )
            except (redis.RedisError, OSError) as error:
                log.warning("cannot read the event streams (%s)", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            for key, entries in answer or []:
                name = key.decode() if isinstance(key, bytes) else key
                if name == self._nudge:
                    nudge_id = entries[-1][0]
                    continue
                cid = int(name.rsplit(":", 1)[1])
                if cid not in self._order:
                    continue
                now = time.monotonic()
                for _stream_id, fields in entries:
                    self._arrive(cid, fields, now)
                with self.lock:
                    if cid in self._order:  # (not released meanwhile)
                        self._last_id[cid] = entries[-1][0]
                await self._look_for_loss(cid)
            if not answer or time.monotonic() - self._epoch_checked >= READ_BLOCK_MS / 1000:
                await self._check_epoch()  # each round trip delays the events read next
            now = time.monotonic()
            for cid, order in list(self._order.items()):
                expired = order.expire(now)
                if expired:  # a number taken and never appended (its node died): tabs reload
                    self._resync(cid)
                for seq, text in expired:
                    self._fan_out(cid, seq, text)
                self._delivered(cid, order)

    async def _look_for_loss(self, conversation_id: int) -> None:
        """Behind a hole, see whether Redis trimmed entries this node had not read yet.

        Such events are gone (MAXLEN): the hole is skipped now and the conversation's tabs here
        told to resync (a snapshot), instead of waiting for events that cannot come.
        """
        order = self._order.get(conversation_id)
        if order is None:
            return
        if not order.waiting:
            self._mark_whole(conversation_id)
            return
        assert self._reader_aio is not None
        try:
            trimmed = await self._reader_aio.eval(_TRIMMED, 1, stream_key(conversation_id))
        except (redis.RedisError, OSError):
            return  # looked at again with the next entries; the hole expires meanwhile anyway
        if order is not self._order.get(conversation_id):
            return
        if id_pair(trimmed) <= id_pair(self._whole.get(conversation_id, "0-0")):
            return
        log.warning(
            "conversation %s: events trimmed from its stream before this node read them; "
            "its tabs here resync",
            conversation_id,
        )
        self._resync(conversation_id)
        for seq, text in order.skip():
            self._fan_out(conversation_id, seq, text)
        self._delivered(conversation_id, order)
        self._mark_whole(conversation_id)

    def _resync(self, conversation_id: int) -> None:
        """Tell this node's tabs of a conversation that events they follow are lost: reload.

        Streaming texts followed here may lack lost deltas: forgotten, so that the next delta
        of each asks its owner for the whole text (`on_lost`).
        """
        self._live.pop(conversation_id, None)
        for subscriber in self._by_conversation.get(conversation_id, ()):
            subscriber._overflow()  # the one message that makes a tab reload

    async def _check_epoch(self) -> None:
        """Redis lost its data (restart without persistence): a new epoch, tabs get snapshots.

        The counters start again from the database, so numbers this node handed on before
        may come again: the tabs are told the new epoch and resubscribe (a snapshot each).
        """
        assert self._reader_aio is not None
        self._epoch_checked = time.monotonic()
        try:
            await self._reader_aio.set(EPOCH_KEY, secrets.token_hex(6), nx=True)
            value = await self._reader_aio.get(EPOCH_KEY)
        except (redis.RedisError, OSError):
            return
        epoch = value.decode() if isinstance(value, bytes) else str(value)
        if epoch == self.epoch:
            return
        log.warning("new cluster epoch %s (Redis lost its data): tabs get snapshots", epoch)
        self.epoch = epoch
        with self.lock:  # (the idle sweep reads _seq in the writer thread)
            for cid in list(self._order):
                self._recent.pop(cid, None)
                self._seq.pop(cid, None)
                self._forget_reading(cid)
        self._counted.clear()
        self._broadcast_text(encode({"type": "hello", "epoch": epoch}))

    async def _listen(self) -> None:
        """Pass the conversation-list events of every node to this node's tabs."""
        while True:
            try:
                self._pubsub = pubsub = self.aio.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(BROADCAST)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        data = message["data"]
                        self._broadcast_text(data.decode() if isinstance(data, bytes) else data)
            except (redis.RedisError, OSError) as error:
                log.warning("broadcast channel lost (%s); listening again", error)
                await self._close_pubsub()  # its connection, before a new one is made
                await asyncio.sleep(1)

    async def _close_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    # -- memory ------------------------------------------------------------------------------

    def missed(self, conversation_id: int, epoch: str | None, seq: int | None) -> Any:
        """Events after seq, or None when they cannot be replayed exactly (a skipped hole)."""
        found = super().missed(conversation_id, epoch, seq)
        if found and seq is not None:
            expected = range(seq + 1, seq + 1 + len(found))
            if any(p.seq != n for p, n in zip(found, expected, strict=True)):
                return None
        return found

    def release(self, conversation_id: int) -> None:
        """Stop reading a conversation's stream on this node and forget what was read."""
        if conversation_id in self._waking:
            return
        super().release(conversation_id)
        self._forget_reading(conversation_id)

    def _forget_reading(self, conversation_id: int) -> None:
        """Forget what this node read of a conversation's stream.

        Under the lock the loop's reader takes to go through these: the idle sweep releases
        in the writer thread (before, a release in the middle of the reader's look could end
        the reader, and the node's tabs got no more events).
        """
        with self.lock:
            self._order.pop(conversation_id, None)
            self._last_id.pop(conversation_id, None)
            self._whole.pop(conversation_id, None)
            self._live.pop(conversation_id, None)
            self._asked.pop(conversation_id, None)
            self._states.pop(conversation_id, None)
            self._counted.discard(conversation_id)

    def forget(self, conversation_id: int) -> None:
        """A deleted conversation: its stream and counter go too (ids are never reused)."""
        self._counted.discard(conversation_id)
        keys = (stream_key(conversation_id), seq_key(conversation_id))
        if self._loop_thread is not None and threading.get_ident() == self._loop_thread:
            task = asyncio.get_running_loop().create_task(self._delete(*keys))  # not on the loop
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return
        with contextlib.suppress(redis.RedisError, OSError):
            self.sync.delete(*keys)

    async def _delete(self, *keys: str) -> None:
        with contextlib.suppress(redis.RedisError, OSError):
            await self.aio.delete(*keys)


def _commands(batch: list[tuple[str, Any]]) -> Iterator[tuple[str, str, list[Any]]]:
    """The outbox's items as commands, in order: each run of one stream's events packed.

    ("x", stream key, [seqs, texts]) (one entry: RUN_EVENTS, RUN_CHARS at most) or
    ("b", BROADCAST, [text]).
    """
    key: str | None = None
    seqs: list[str] = []
    texts: list[str] = []
    chars = 0
    for kind, payload in batch:
        if kind == "x" and stream_key(payload[0]) == key:
            size = len(payload[2])
            if len(seqs) < RUN_EVENTS and chars + size <= RUN_CHARS:
                seqs.append(str(payload[1]))
                texts.append(payload[2])
                chars += size
                continue
        if key is not None:
            yield "x", key, [" ".join(seqs), "\n".join(texts)]
            key = None
        if kind == "x":
            key, seqs, texts = stream_key(payload[0]), [str(payload[1])], [payload[2]]
            chars = len(payload[2])
        else:
            yield "b", BROADCAST, [payload]
    if key is not None:
        yield "x", key, [" ".join(seqs), "\n".join(texts)]
