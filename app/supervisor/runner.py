"""A conversation's live state (Runner, Streaming, TurnState) and what every part shares."""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError

from app.agents.base import Agent, Notice, PermissionDecision
from app.live_render import LiveRender
from app.models import Conversation, Entry
from app.tools import SAVE_HANDOFF

log = logging.getLogger(__name__)


COMPACT_COMMAND = "/compact"
RETRY_NOTICES = {"api_retry", "model_retry"}  # Claude Code's and Copilot's retry notices


class ConversationError(Exception):
    """A request the conversation's state does not allow (HTTP 409)."""


DELETING = "This conversation is being deleted."
READ_ONLY = "This conversation is archived; it can be read, not written."
ANNOUNCE_WAIT = 5.0  # the longest a question (or a handoff card) waits for its call's row
STILL_STOPPING = "This conversation's agent is still stopping; try again in a moment."


class Locked(Exception):
    """Another program holds SQLite's write lock: the runner's write waits, then tries again."""


class NotBegun(Exception):
    """A burst's job could not reach Redis or the database before it changed anything."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def is_retry(notice: Notice) -> bool:
    """True for a notice that the agent is retrying its API request."""
    return notice.data.get("type") in RETRY_NOTICES


def is_compact_command(text: str) -> bool:
    """True when the whole message is the /compact command."""
    return text.strip() == COMPACT_COMMAND


def _settle(future: asyncio.Future[PermissionDecision], decision: PermissionDecision) -> None:
    """Answer a permission question's future (on the loop) unless it has its answer."""
    if not future.done():
        future.set_result(decision)


def _logged(future: asyncio.Future[Any]) -> None:
    """Log the error of a storage job nobody awaits."""
    if not future.cancelled() and future.exception() is not None:
        log.error("a database job failed", exc_info=future.exception())


def failure_reason(error: BaseException) -> str:
    """A short reason for an error line: the driver's message, never the SQL and its data."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        return str(error.orig)
    return str(error) or type(error).__name__


@dataclass(frozen=True)
class Watched:
    """What a live Claude Code agent's folder was trusted with: looked at again while it lives."""

    cwd: Path
    trusted: list[str]
    env: dict[str, str]


@dataclass
class Streaming:
    """An agent message being written."""

    entry: Entry
    parts: list[str] = field(default_factory=list)  # joined only when read: no copy per delta
    seqs: list[int] = field(default_factory=list)  # each part's event seq (snapshot_text)
    checkpoint_at: float = field(default_factory=time.monotonic)
    live: LiveRender | None = None  # renders the text so far now and then (sanitized HTML)
    entry_id: int = field(init=False)  # readable even after a failed write expired entry

    def __post_init__(self) -> None:
        self.entry_id = self.entry.id or 0

    @property
    def text(self) -> str:
        """The text written so far."""
        return "".join(self.parts)

    def text_at(self, seq: int) -> str:
        """The text of the deltas numbered up to seq (what tabs at that seq have)."""
        count = bisect.bisect_right(self.seqs, seq)
        return "".join(self.parts[:count])


class TurnState(StrEnum):
    """A conversation's turn, as tabs are told it (a str: "idle" == TurnState.IDLE)."""

    IDLE = "idle"  # no turn, nothing queued (or the relay is stopping)
    RUNNING = "running"  # from a message's wake-up until the queue is empty
    COMPACTING = "compacting"  # the agent compacts its context, inside a running turn


@dataclass
class Runner:
    """A conversation's live state: its agent, its turn, its open questions."""

    conversation_id: int
    agent: Agent | None = None
    agent_mode: str | None = None  # the permission mode the live agent runs with
    agent_model: str | None = None  # the model the user chose that the live agent runs with
    # Modes the relay switched the live agent to, whose echo (ModeChanged) has not come yet:
    # an echo is the relay's own change, any other report the agent's (an approved plan).
    mode_echoes: deque[str] = field(default_factory=lambda: deque(maxlen=16))
    switching: asyncio.Lock = field(default_factory=asyncio.Lock)  # one mode/model switch at a time
    changed_while_starting: bool = False  # a mode or model chosen as the agent started
    task: asyncio.Task[None] | None = None
    state: TurnState = TurnState.IDLE
    streaming: dict[str, Streaming] = field(default_factory=dict)
    tools: dict[str, Entry] = field(default_factory=dict)
    compaction: Entry | None = None
    compaction_began: float | None = None  # time.monotonic() at the compaction's first sign
    questions: dict[int, asyncio.Future[PermissionDecision]] = field(default_factory=dict)
    lasting: set[int] = field(default_factory=set)  # questions the turn's end leaves open
    last_agent_entry: Entry | None = None
    context_report: dict[str, Any] | None = None  # what the agent last said of its window
    reporting: asyncio.Task[None] | None = None
    reported_agent: Agent | None = None  # the agent process the last report came from
    lines_shown: set[str] = field(default_factory=set)  # this turn's notice lines
    prompt_id: str | None = None  # the uuid the current turn's prompt is sent with
    image_ids: list[int] = field(default_factory=list)  # the images the prompt goes with
    retry_line: Entry | None = None  # this turn's API-retry line, updated at each attempt
    figure: int | None = None  # a context figure whose backup check waits for its message
    last_used: float = field(default_factory=time.monotonic)
    stop_requested: bool = False  # Stop came for this turn (maybe while its agent started)
    # The settings watch stopped this turn's agent: its own line says why (not "Interrupted
    # by the user.").
    stopped_untrusted: bool = False
    carried_summary: str | None = None  # the /compact summary this turn's prompt carries
    # An error line the database refused (its text and data): written when it can.
    failure: tuple[str, dict[str, Any] | None] | None = None
    ending: bool = False  # _end_turn failed (database): finished before the next turn
    archived: bool = False  # the conversation is archived: its agent stops after its turn
    retiring: bool = False  # ... and it is being stopped now (runner.task waits for that)
    warming: asyncio.Task[None] | None = None  # an agent started before its message (warm)
    starting: bool = False  # the agent's process is being started
    watched: Watched | None = None  # the project settings the live agent was trusted with
    again: bool = False  # a message was queued while the runner was looking at the queue
    own_turn: bool = False  # the agent began a turn by itself: run it once nothing is queued
    turn_conversation: Conversation | None = None  # as _begin_turn left it (read once a turn)
    ended: bool = False  # the job that stored the turn's last event also ended the turn
    looked: bool = False  # ... and looked at the queue: its answer is `upcoming`
    upcoming: str | None = None
    idle_shown: bool = False  # ... and, the queue being empty, told the tabs the turn is idle
    # Stopped by the relay's shutdown before the agent answered: the turn stays active until
    # the agent's record, read once it has stopped, says the message arrived (Recovery).
    cut_by_shutdown: bool = False
    calls: set[str] = field(default_factory=set)  # this turn's tool calls with a stored row
    call_waiters: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    # save_handoff calls stored and not yet followed by their card, and a wake-up for a wait.
    handoff_calls: deque[str] = field(default_factory=deque)
    handoff_stored: asyncio.Event = field(default_factory=asyncio.Event)

    def call_stored(self, tool_id: str) -> None:
        """A tool call's row is stored (on the loop, after its job): its question may follow."""
        self.calls.add(tool_id)
        waiter = self.call_waiters.pop(tool_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        entry = self.tools.get(tool_id)
        if entry is not None and str(entry.data.get("tool", "")).endswith(SAVE_HANDOFF):
            self.handoff_calls.append(tool_id)
            self.handoff_stored.set()

    async def until_handoff_call(self) -> None:
        """Return once a save_handoff call's row is stored: its "Handoff saved" card (which
        the tool writes) then comes after it, and after every event before it."""
        while not self.handoff_calls:
            self.handoff_stored.clear()
            await self.handoff_stored.wait()
        self.handoff_calls.popleft()

    async def until_call_stored(self, tool_id: str) -> None:
        """Return once the call's row is stored (every event before it is then stored too)."""
        if tool_id in self.calls:
            return
        waiter = self.call_waiters.get(tool_id)
        if waiter is None:
            waiter = self.call_waiters[tool_id] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.shield(waiter)
        finally:
            if self.call_waiters.get(tool_id) is waiter and not waiter.done():
                del self.call_waiters[tool_id]
