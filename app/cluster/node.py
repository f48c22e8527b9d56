"""A relay node of a cluster: which conversations it runs, and how work reaches their owner.

A message posted to any node is stored there (queued, as on one node) and that node asks for
the conversation's lease (leases.py). It runs the conversation if it gets it; otherwise it
sends a wake-up on the control channel (Redis pub/sub), and the owner delivers the queue from
the database. Stop, a permission answer and a warm-up reach the owner the same way; a Stop
(in Redis) and an answer (in the database) are recorded too, for the owner's heartbeat to
find when their notice is lost. Every third of OARLOCK_LEASE_SECONDS this node renews its
leases (in a task and a thread of their own: nothing else the node waits on holds a renewal
back), and a heartbeat gives back those of conversations with nothing live here and takes over
conversations with work whose lease expired (a dead node's): what it left open is closed as
after a restart, the queue is delivered, and the agent resumes its session, or starts a new
one seeded with the carry-over summary when the session's files are not reachable from this
node.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aioredis
from sqlalchemy.engine import Engine

from app import store
from app.agents.base import PermissionDecision
from app.agents.transcript import config_dir
from app.cluster import alive, leases, same_redis
from app.cluster.events import PREFIX, TIMEOUT, ClusterHub, cancel_all
from app.cluster.failures import SharedFailureLimiter
from app.cluster.held import Held
from app.cluster.outage import Outage
from app.cluster.presence import Presence
from app.config import Settings
from app.providers import agent_env
from app.questions import PLAN_MODES, decision_of
from app.summary import SummaryMessage, build_summary
from app.supervisor.pool import REFRESH_SECONDS
from app.workspace import WorkspaceError, usable_cwd

if TYPE_CHECKING:
    from app.models import Conversation, Entry
    from app.supervisor import Runner, Supervisor

log = logging.getLogger(__name__)

CONTROL = PREFIX + "control"
# + a conversation's id: the prompt id of the turn a Stop taken on another node is for. Kept
# for the owner's heartbeat (a control notice can be lost), an hour at most.
STOPS = PREFIX + "stop:"
STOP_KEPT = 3600
# + a random id: the list where a conversation's owner puts its answer to another node's
# question (the 🧠 modal's agent part), for ASK_SECONDS at most.
REPLIES = PREFIX + "reply:"
# The owner asks its agent for REFRESH_SECONDS at most. (Whole seconds: Redis 5's BLPOP.)
ASK_SECONDS = int(REFRESH_SECONDS) + 1
# Questions waiting at once: each holds one of the Redis client's connections while it waits
# (its pool has 100, and fails a command at once when all are taken).
ASKING = 8
FORGET_STOP = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end"
MOVED_LINE = (
    "This conversation moved to another relay node, which cannot reach the agent's session: "
    "a new session starts with a summary of the conversation."
)


def _logged(job: asyncio.Future[Any]) -> None:
    """Log a failed background job (its caller does not wait for it)."""
    if not job.cancelled() and job.exception() is not None:
        log.error("cluster job failed", exc_info=job.exception())


def default_node_id() -> str:
    """This process's name in the cluster: host, pid and a random part (never reused)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def can_run(cwd: str, roots: list[Path], running: int, max_agents: int | None) -> bool:
    """Whether a node may take a conversation: its directory is here and there is room."""
    if max_agents is not None and running >= max_agents:
        return False
    try:
        usable_cwd(cwd, roots)  # (the check an agent's start makes, without its error)
    except WorkspaceError:
        return False
    return True


def session_reachable(provider: str, session_id: str, env: dict[str, str]) -> bool:
    """Whether the agent's session can be resumed here (Claude Code: its transcript file)."""
    if not provider.startswith(("claude", "deepseek")):
        return True  # the demo keeps nothing; the SDK engine's sessions are its own business
    projects = config_dir(env) / "projects"
    return bool(glob.glob(str(projects / "*" / f"{glob.escape(session_id)}.jsonl")))


class ClusterNode:
    """This node's leases and its side of the control channel."""

    def __init__(self, settings: Settings, engine: Engine, supervisor: Supervisor) -> None:
        assert settings.redis_url is not None
        self.settings = settings
        self.engine = engine
        self.supervisor = supervisor
        self.node = settings.node_id or default_node_id()
        self.seconds = settings.lease_seconds
        self.held = Held()  # the conversations this node runs (their leases)
        self.redis = aioredis.Redis.from_url(settings.redis_url, socket_connect_timeout=TIMEOUT)
        self.presence = Presence(self.redis, self.node, self.seconds)
        self.alive = alive.instance(settings.token)  # its node's key's value (alive.py)
        self._named = False  # its first write takes the name over (a dead namesake's key)
        self.limiter = SharedFailureLimiter(self.redis)
        self._tasks: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[Any]] = set()  # one-off tasks (_background)
        self._chores: asyncio.Task[None] | None = None  # the heartbeat's Redis part
        self._stopping: set[tuple[int, str | None]] = set()  # Stops being carried out here
        self._asking = asyncio.Semaphore(ASKING)  # context questions waiting for an answer
        self._claiming: set[int] = set()
        # Live nodes seen on another Redis: since when (monotonic), None once logged.
        self._elsewhere: dict[str, float | None] = {}
        self._wrote: str | None = None  # the epoch this node last wrote in its row
        self.renewed_at = 0.0  # when the last renewal of this node's leases began (monotonic)
        if isinstance(supervisor.hub, ClusterHub):
            supervisor.hub.on_lost = self.resend_text

    def numbers(self, conversation_id: int, count: int) -> contextlib.AbstractContextManager[None]:
        """Take a burst's count numbers in one Redis round trip (a storage job, before it)."""
        hub = self.supervisor.hub
        assert isinstance(hub, ClusterHub)
        return hub.reserved(conversation_id, count)

    async def reachable(self) -> bool:
        """Whether Redis answers a PING within TIMEOUT (a burst waiting on it asks first)."""
        try:
            async with asyncio.timeout(TIMEOUT):
                return bool(await self.redis.ping())
        except (redis.RedisError, OSError, TimeoutError):
            return False

    def holds(self, conversation_id: int) -> bool:
        """Whether this node runs the conversation (holds its lease)."""
        return conversation_id in self.held

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on the control channel, start the heartbeat (which takes orphans at once)."""
        self._tasks = [
            asyncio.create_task(self._listen(), name="cluster-control"),
            asyncio.create_task(
                self._repeat(self._renew_now, "renewing the cluster leases"), name="cluster-leases"
            ),
            asyncio.create_task(
                self._repeat(self._beat, "the cluster heartbeat"), name="cluster-heartbeat"
            ),
        ]

    async def stop(self) -> None:
        """Stop the tasks and give every lease back: other nodes take the work at once."""
        await cancel_all([*self._tasks, *self._running, *([self._chores] if self._chores else [])])
        self.held.clear()
        with contextlib.suppress(Exception):
            await self.supervisor.storage.write(leases.release_all, self.engine, self.node)
        with contextlib.suppress(Exception):  # the name is free at once for a restart
            async with asyncio.timeout(TIMEOUT):
                key = alive.KEY + self.node
                if await self.redis.get(key) == self.alive.encode():
                    await self.redis.delete(key)
        with contextlib.suppress(Exception):
            await self.redis.aclose()

    # -- work reaching the owner -------------------------------------------------------------

    def wake(self, conversation_id: int) -> None:
        """Queued work for a conversation this node does not hold: take it, or wake its owner."""
        self.supervisor.storage.soon(
            self._task, partial(self._claim_or_send, "wake", conversation_id)
        )

    def warm(self, conversation_id: int) -> None:
        """Someone types in a conversation this node does not hold: warm it here or there."""
        self.supervisor.storage.soon(self._task, partial(self._warm, conversation_id))

    def resend_text(self, conversation_id: int) -> None:
        """This node lacks a streaming message's text so far: its owner publishes it whole."""
        if conversation_id in self.held:
            self._resend_here(conversation_id)
        else:
            self.send("text", conversation_id)

    def _resend_here(self, conversation_id: int) -> None:
        # In the writer, after the deltas stored before: the text has every delta numbered
        # below the event's number, and every later delta gets a higher one.
        job = self.supervisor.storage.submit(self.supervisor.publish_live_text, conversation_id)
        job.add_done_callback(_logged)

    def _task(self, start: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Start a task (on the loop: `storage.soon` brings it there from a storage thread)."""
        self._background(start())

    def _background(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run work in a task of its own, kept until it ends; its failure is logged."""
        task = asyncio.get_running_loop().create_task(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        task.add_done_callback(_logged)

    def still_owner(self, session: Any, runner: Runner) -> bool:
        """In the writer thread, before a turn begins: whether this node still holds the lease.

        A node that stalled (SIGSTOP, a long pause) past its lease may have lost the
        conversation to another node: then it gives the runner up instead of starting a turn.
        """
        cid = runner.conversation_id
        if leases.still_held(session.connection(), cid, self.node, self.seconds):
            return True
        log.warning("node %s lost the lease of conversation %s", self.node, cid)
        self.held.discard(cid)  # first: its runner starts no other turn
        self.supervisor.storage.soon(self._task, partial(self.supervisor.drop_agent, cid))
        return False

    def may_write(self, session: Any, runner: Runner) -> bool:
        """In the writer thread, before a burst of agent events is stored: whether it may be.

        Leases renewed less than half a lease ago still run (no query); after longer (this
        node stalled: SIGSTOP, a long pause) the database says, as before a turn.
        """
        if runner.conversation_id not in self.held:  # the heartbeat found the lease lapsed
            return False
        if time.monotonic() - self.renewed_at < self.seconds / 2:
            return True
        return self.still_owner(session, runner)

    def _find(self, conversation_id: int) -> Conversation | None:
        """A conversation (in a storage thread)."""
        with self.supervisor.session() as session:
            return store.get_conversation(session=session, conversation_id=conversation_id)

    async def _warm(self, conversation_id: int) -> None:
        if not await self.claim(conversation_id):
            await self._publish("warm", conversation_id)
            return
        conversation = await self.supervisor.storage.read(self._find, conversation_id)
        if conversation is not None and conversation.status == "active":
            self.supervisor.warm(conversation)

    def send(self, op: str, conversation_id: int, **fields: Any) -> None:
        """Pass a command (interrupt, answer, warm) to the conversation's owner."""
        self.supervisor.storage.soon(
            self._task, partial(self._publish, op, conversation_id, **fields)
        )

    async def request_stop(self, conversation_id: int, turn: str | None) -> None:
        """Stop a turn another node runs: recorded for its heartbeat, then its owner is told.

        turn: the prompt id of the turn (only that turn stops, however late the Stop comes);
        None when no turn had begun (a notice only: it stops the turn running when it lands).
        Raises redis.RedisError when the Stop cannot be recorded.
        """
        if turn is not None:
            await self.redis.set(STOPS + str(conversation_id), turn, ex=STOP_KEPT)
        await self._publish("interrupt", conversation_id, turn=turn)

    async def ask_context(self, conversation_id: int) -> tuple[dict[str, Any] | None, bool]:
        """The agent's context report and background work, from the conversation's owner.

        (None, False), as for an agent that is not running, when no node runs it, or its owner
        does not answer within ASK_SECONDS, or Redis fails.
        """
        owner = await self.supervisor.storage.read(leases.owner, self.engine, conversation_id)
        if owner is None or owner == self.node:
            return None, False
        reply = REPLIES + uuid.uuid4().hex
        try:
            async with asyncio.timeout(ASK_SECONDS + 1), self._asking:
                if not await self._publish("context", conversation_id, owner=owner, reply=reply):
                    return None, False
                answer = await self.redis.blpop([reply], timeout=ASK_SECONDS)
        except (redis.RedisError, OSError, TimeoutError) as error:
            log.warning("no context report for conversation %s: %r", conversation_id, error)
            return None, False
        if answer is None:
            log.info(
                "node %s did not tell conversation %s's context in time", owner, conversation_id
            )
            return None, False
        told = json.loads(answer[1])
        return told.get("report"), bool(told.get("background_work"))

    async def _tell_context(self, conversation_id: int, reply: str) -> None:
        """Answer another node's question about a conversation's context (its 🧠 modal)."""
        report = await self.supervisor.refresh_context(conversation_id)
        told = {
            "report": report,
            "background_work": self.supervisor.background_work(conversation_id),
        }
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.rpush(reply, json.dumps(told))
            pipe.expire(reply, ASK_SECONDS + 1)  # unread (the asker gave up): gone
            await pipe.execute()

    def _stop_soon(self, conversation_id: int, turn: str | None) -> None:
        """Stop a turn here that a Stop taken on another node is for, in a task of its own.

        An agent may take seconds to stop (Claude Code: up to 15 s): neither the control
        channel's listener nor the heartbeat (which renews the leases) waits for it.
        """
        if (conversation_id, turn) in self._stopping:
            return  # the notice and a heartbeat found the same Stop
        self._stopping.add((conversation_id, turn))
        self._background(self._stop(conversation_id, turn))

    async def _stop(self, conversation_id: int, turn: str | None) -> None:
        try:
            stopped = await self.supervisor.stop_turn(conversation_id, turn)
            log.info(
                "conversation %s: a Stop from another node %s",
                conversation_id,
                "stopped its turn" if stopped else "found no such turn running",
            )
            if turn is not None:
                # Only this turn's request: a newer one recorded meanwhile stays.
                await self.redis.eval(FORGET_STOP, 1, STOPS + str(conversation_id), turn)
        finally:
            self._stopping.discard((conversation_id, turn))

    async def _publish(self, op: str, conversation_id: int, **fields: Any) -> bool:
        """Send a control message; False (logged) when Redis refuses it."""
        message = json.dumps({"op": op, "cid": conversation_id, "from": self.node, **fields})
        try:
            await self.redis.publish(CONTROL, message)
        except (redis.RedisError, OSError) as error:  # the heartbeat's scan is the fallback
            log.warning("cannot send %s for conversation %s: %s", op, conversation_id, error)
            return False
        return True

    async def _claim_or_send(self, op: str, conversation_id: int) -> None:
        if await self.claim(conversation_id):
            return
        try:  # named, so that only the owner acts (or, with no owner, whoever can take it)
            owner = await self.supervisor.storage.read(leases.owner, self.engine, conversation_id)
        except Exception:  # the heartbeats' scans find the work all the same
            log.exception("no owner known for conversation %s", conversation_id)
            return
        await self._publish(op, conversation_id, owner=owner)

    async def claim(self, conversation_id: int, cwd: str | None = None) -> bool:
        """Take a conversation's lease when this node can run it; True once it runs here."""
        if conversation_id in self.held:
            return True
        if conversation_id in self._claiming:
            return False
        self._claiming.add(conversation_id)
        try:
            if cwd is None:
                found = await self.supervisor.storage.read(self._find, conversation_id)
                if found is None:
                    return False
                cwd = found.cwd
            if not can_run(cwd, self.settings.roots, len(self.held), self.settings.max_agents):
                return False
            taken = await self.supervisor.storage.write(
                leases.acquire, self.engine, conversation_id, self.node, self.seconds
            )
            if not taken:
                return False
            self.held.add(conversation_id)
            log.info("node %s runs conversation %s", self.node, conversation_id)
            try:
                await self.supervisor.storage.write(self._take_over, conversation_id)
            except Exception:  # the lease goes back: another node (or a later scan) tries
                log.exception("taking over conversation %s failed", conversation_id)
                self.held.discard(conversation_id)
                await self.supervisor.storage.write(
                    leases.release, self.engine, conversation_id, self.node
                )
                return False
            return True
        except Exception:  # a database that fails now: the heartbeat tries again
            log.exception("claiming conversation %s failed", conversation_id)
            return False
        finally:
            self._claiming.discard(conversation_id)

    def claim_here(self, conversation_id: int, cwd: str) -> None:
        """Before a message is stored here: take the conversation's lease if it is free.

        Taken first, so that no other node's scan sees the queued message without a lease
        and takes it meanwhile: the node a message reaches runs it when it can.
        """
        if conversation_id in self.held or conversation_id in self._claiming:
            return
        if not can_run(cwd, self.settings.roots, len(self.held), self.settings.max_agents):
            return
        try:
            if not leases.acquire(self.engine, conversation_id, self.node, self.seconds):
                return
        except Exception:  # the message is stored all the same; the owner is found later
            log.exception("claiming conversation %s failed", conversation_id)
            return
        self.held.add(conversation_id)
        log.info("node %s runs conversation %s", self.node, conversation_id)
        self._take_over(conversation_id)

    def _take_over(self, conversation_id: int) -> None:
        """Close what an earlier owner left open, move to a new session if need be, deliver."""
        supervisor = self.supervisor
        with supervisor.session() as session:
            conversation = store.get_conversation(session=session, conversation_id=conversation_id)
            if conversation is None:
                return
            if conversation.session_id is not None and not self._reachable(conversation):
                self._new_session(session, conversation)
            supervisor.recover(session, conversation)

    def _reachable(self, conversation: Conversation) -> bool:
        env = agent_env(conversation.provider, self.settings, conversation.auto_compact_window)
        return session_reachable(conversation.provider, conversation.session_id or "", env)

    def _new_session(self, session: Any, conversation: Conversation) -> None:
        """Start the conversation over in a new session, carrying a summary (SPEC §2)."""
        messages = store.recent_messages(session=session, conversation_id=conversation.id or 0)
        summary = build_summary(
            conversation.title,
            [SummaryMessage("user" if m.kind == "user" else "agent", m.text) for m in messages],
        )
        changes: dict[str, Any] = {"session_id": None}
        if conversation.pending_summary is None:
            changes["pending_summary"] = summary
        store.update_conversation(session=session, conversation=conversation, **changes)
        self.supervisor.add_line(
            session, conversation, MOVED_LINE, level="warning", data={"type": "moved"}
        )

    # -- the control channel -----------------------------------------------------------------

    async def _listen(self) -> None:
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(CONTROL)
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        await self._on_control(json.loads(message["data"]))
                    except Exception:
                        log.exception("control message failed: %r", message.get("data"))
            except (redis.RedisError, OSError) as error:
                log.warning("control channel lost (%s); listening again", error)
                await asyncio.sleep(1)
            finally:  # its connection, before a new one is made (each retry made one more)
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _on_control(self, message: dict[str, Any]) -> None:
        op, cid = message.get("op"), message.get("cid")
        if not isinstance(cid, int) or message.get("from") == self.node:
            return
        supervisor = self.supervisor
        if op == "wake":
            if cid in self.held:
                supervisor.wake(cid)
            elif message.get("owner") is None:
                await self.claim(cid)  # nobody runs it (yet): whoever gets the lease does
        elif op == "warm" and await self.claim(cid):
            conversation = await supervisor.storage.read(self._find, cid)
            if conversation is not None and conversation.status == "active":
                supervisor.warm(conversation)
        elif op == "retire" and cid in self.held:  # compacted on another node
            supervisor.retire_here(cid)
        elif op == "mode" and cid in self.held:  # changed on another node: the agent follows
            self._background(supervisor.apply_mode_here(cid))
        elif op == "model" and cid in self.held:  # chosen on another node: the agent follows
            self._background(supervisor.apply_model_here(cid))
        elif op == "deleted" and cid in self.held:  # deleted on another node
            self.held.discard(cid)
            await supervisor.forget_here(cid)
        elif op == "context" and cid in self.held:  # answered from a task: the agent may be slow
            reply = message.get("reply")
            if isinstance(reply, str) and reply.startswith(REPLIES):
                self._background(self._tell_context(cid, reply))
        elif op == "text" and cid in self.held:  # a node lost some of a streaming text
            self._resend_here(cid)
        elif op == "interrupt" and cid in self.held:
            turn = message.get("turn")
            self._stop_soon(cid, turn if isinstance(turn, str) else None)
        elif op == "answer" and cid in self.held:
            entry_id = message.get("entry_id")
            if isinstance(entry_id, int) and entry_id:
                allow = bool(message.get("allow"))
                answers, mode = message.get("answers"), message.get("mode")
                decision = PermissionDecision(
                    allow,
                    str(message.get("message") or ""),
                    answers=answers if isinstance(answers, dict) else None,
                    mode=mode if mode in PLAN_MODES else None,
                )
                supervisor.settle_question(cid, entry_id, decision)

    # -- the leases' renewal and the heartbeat ------------------------------------------------

    async def _repeat(self, step: Callable[[], Awaitable[None]], what: str) -> None:
        """Run step every third of a lease; its outages logged once (outage.py)."""
        outage = Outage(log, what)
        while True:
            try:
                await step()
            except Exception as error:  # noqa: BLE001 - logged; the next one tries again
                outage.failed(error)
            else:
                outage.worked()
            await asyncio.sleep(self.seconds / 3)

    async def _renew_now(self) -> None:
        """Renew the leases this node holds; drop the agents of those that lapsed.

        Not a writer job, nor a step of the heartbeat: both wait behind jobs that wait on Redis
        (TIMEOUT each) while it answers nothing, and a lease lapsed under a turn still running
        on this node, which another node then took over (a Redis pause longer than a lease).
        """
        began = time.monotonic()
        lost = await self.supervisor.storage.write_aside(self._renew)
        self.renewed_at = began
        for cid in lost:  # expired under us (a stall longer than the lease)
            self._background(self.supervisor.drop_agent(cid))

    async def _beat(self) -> None:
        storage = self.supervisor.storage
        await storage.write(self._release_idle)
        for cid, cwd in await storage.read(leases.orphans, self.engine):
            await self.claim(cid, cwd)
        # Pub/sub delivers at most once: a wake-up lost on the way is made up for here.
        for cid in await storage.read(leases.waiting, self.engine, self.node):
            if cid in self.held and not self.supervisor.delivering(cid):
                self.supervisor.wake(cid)
        await self._settle_answered()
        if self._chores is None or self._chores.done():  # beside the beat: never holding it
            self._chores = asyncio.create_task(self._redis_chores(), name="cluster-chores")
        await self._same_redis()

    async def _same_redis(self) -> None:
        """Write this node's Redis epoch; log a live node that keeps naming another (another
        Redis database: same_redis.py), once it outlasts SETTLE leases, once per node."""
        hub = self.supervisor.hub
        epoch = hub.epoch if isinstance(hub, ClusterHub) else ""
        found = await self.supervisor.storage.read(
            same_redis.beat, self.engine, self.node, epoch, self._wrote, self.seconds
        )
        self._wrote = epoch
        now = time.monotonic()
        for name in list(self._elsewhere):
            if name not in found:
                del self._elsewhere[name]
        for name in found:
            since = self._elsewhere.setdefault(name, now)
            if since is not None and now - since >= self.seconds * same_redis.SETTLE:
                log.error("%s", same_redis.other_redis(self.node, [name]))  # (name: a twin)
                self._elsewhere[name] = None  # said: not again while it lasts

    async def _redis_chores(self) -> None:
        """The heartbeat's Redis part, in a task of its own, bounded: this client waits on
        Redis without limit (its control channel listens for good)."""
        try:
            async with asyncio.timeout(TIMEOUT):
                await self._still_alive()
                await self.presence.write()  # renewed: a node that stops is forgotten after a lease
                await self._settle_stops()
        except TimeoutError:
            log.warning("cluster heartbeat: Redis did not answer within %.0f s", TIMEOUT)
        except Exception:  # the next beat tries again
            log.exception("cluster heartbeat: Redis chores failed")

    async def _still_alive(self) -> None:
        """Renew this node's key; say so when another process wrote it (the same name twice)."""
        key = alive.KEY + self.node
        found = await self.redis.set(key, self.alive, ex=math.ceil(self.seconds), get=True)
        named, self._named = self._named, True
        if named and found is not None and found.decode() != self.alive:
            log.error(
                "another live relay runs as node %r: OARLOCK_NODE_ID must differ on every node "
                "(both run the same conversations' agents)",
                self.node,
            )

    def _renew(self) -> set[int]:
        """In write_aside's thread: renew the leases held; the lapsed leave `held`, returned.

        Judged against what was held when the renewal looked (Held.lapsed): a lease taken
        meanwhile (a message's claim_here in the writer) is not lost. Judged against what is
        held afterwards, it was: the node forgot it while its row stayed the node's.
        """
        asked = self.held.marks()
        renewed = leases.renew(self.engine, self.node, self.seconds, set(asked))
        lost = self.held.lapsed(asked, renewed)  # first: their runners start no other turn
        for cid in lost:
            log.warning("node %s lost the lease of conversation %s", self.node, cid)
        return lost

    def _release_idle(self) -> None:
        """In the writer: give back the leases of conversations with nothing live here.

        Judged here, in order with the jobs that store messages: a message stored before keeps
        the lease (judged on the loop, it was given back under the message's feet, which then
        waited for another node's scan).
        """
        for cid in list(self.held):
            if self._idle(cid):
                self.held.discard(cid)  # first: from now on a warm-up here claims it anew
                if not leases.release_idle(self.engine, cid, self.node):
                    self.held.add(cid)  # a message waits: kept

    async def _settle_answered(self) -> None:
        """Settle open questions here that were answered on a node whose notice was lost."""
        asked = self.supervisor.open_questions(set(self.held))  # (a copy: jobs change it)
        if not asked:
            return
        for entry in await self.supervisor.storage.read(self._answered, list(asked)):
            decision = decision_of(entry.state, entry.data)
            self.supervisor.settle_question(asked[entry.id or 0], entry.id or 0, decision)

    async def _settle_stops(self) -> None:
        """Stop turns here that a Stop taken on a node whose notice was lost was for."""
        running = self.supervisor.running_prompts(set(self.held))
        if not running:
            return
        cids = list(running)
        asked = await self.redis.mget([STOPS + str(cid) for cid in cids])
        for cid, turn in zip(cids, asked, strict=True):
            if turn is not None and turn.decode() == running[cid]:
                self._stop_soon(cid, running[cid])

    def _answered(self, entry_ids: list[int]) -> list[Entry]:
        """The stored answers of these questions (in a storage thread)."""
        with self.supervisor.session() as session:
            return store.answered_questions(session=session, entry_ids=entry_ids)

    def _idle(self, conversation_id: int) -> bool:
        """Nothing of the conversation is live here: its lease can go back."""
        return self.supervisor.holds_nothing(conversation_id)
