"""The agent protocol: normalized events every provider emits, and the Agent interface.

The supervisor only ever sees these types; each provider module translates its
outside system (the Claude Code CLI, the built-in demo) into them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from app.attachments import Image
    from app.tools import RelayTool


@dataclass(frozen=True)
class SessionStarted:
    """The agent's own session id is known (store it; resume with it later)."""

    session_id: str


@dataclass(slots=True)  # (not frozen: a frozen one is built at twice the cost, per delta)
class TextDelta:
    """A piece of an agent message's text, as it is written."""

    message_id: str
    text: str


@dataclass(frozen=True)
class MessageDone:
    """One agent message is complete; text is its text blocks only (may be empty)."""

    message_id: str
    text: str


@dataclass(frozen=True)
class Activity:
    """A tool call (phase "call") or its result (phase "result"), shown in the turn."""

    tool_id: str
    name: str
    phase: Literal["call", "result"]
    summary: str = ""
    output: str = ""
    is_error: bool = False
    # The call's input (phase "call"), for backups; not part of what the event is equal to.
    input: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Usage:
    """Context now used by the agent (input + cache read + cache creation tokens)."""

    context_tokens: int
    model: str | None = None
    model_window: int | None = None


@dataclass(frozen=True)
class CompactionStarted:
    """The agent began compacting its own context."""

    trigger: str | None = None


@dataclass(frozen=True)
class CompactionFinished:
    """The agent's compaction succeeded; token counts (and more) when it reports them."""

    trigger: str | None = None
    pre_tokens: int | None = None
    post_tokens: int | None = None
    messages_removed: int | None = None
    tokens_removed: int | None = None
    duration_ms: int | None = None  # the agent's own figure (the relay times start to end too)
    summary: str | None = None  # the agent's summary, when its event carries it
    # Where the agent's own record of this compaction is (Claude Code: the boundary's uuid
    # in its transcript), for agents that write the summary there: see CompactionSummaries.
    record_id: str | None = None


@dataclass(frozen=True)
class CompactionFailed:
    """The agent's compaction ended without a result (failed or aborted)."""

    reason: str = ""


@dataclass(frozen=True)
class ModeChanged:
    """The agent's permission mode is now this one: its own change (Claude Code leaves plan
    mode when its plan is approved), or the echo of one the relay asked for."""

    mode: str


@dataclass(frozen=True)
class Notice:
    """A full-width line for the timeline (an API retry, a resumed session...)."""

    text: str
    level: Literal["info", "warning", "error"] = "info"
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnDone:
    """The turn ended: normally, interrupted, or with an error."""

    interrupted: bool = False
    error: str | None = None
    cost_usd: float | None = None
    duration_ms: int | None = None


AgentEvent = (
    SessionStarted
    | TextDelta
    | MessageDone
    | Activity
    | Usage
    | CompactionStarted
    | CompactionFinished
    | CompactionFailed
    | ModeChanged
    | Notice
    | TurnDone
)


@dataclass(frozen=True)
class PermissionRequest:
    """An agent asks whether it may run a tool."""

    tool_name: str
    tool_input: dict[str, Any]
    tool_id: str | None = None
    # The agent announced this call (an Activity "call" event) before asking: the question
    # is stored after that call's row, so it follows what the agent said before the call.
    announced: bool = False
    # Asked by work that may outlive the turn (a background subagent): the turn's end does
    # not answer it; it waits for the user (or a Stop) as one asked between turns does.
    lasting: bool = False


@dataclass(frozen=True)
class PermissionDecision:
    """The user's answer to a PermissionRequest."""

    allow: bool
    message: str = ""
    # The user's answers to the agent's own questions (AskUserQuestion): question → answer.
    answers: dict[str, str] | None = None
    # An approved plan's permission mode (ExitPlanMode): the agent goes on in it.
    mode: str | None = None


AskPermission = Callable[[PermissionRequest], Awaitable[PermissionDecision]]


@dataclass(frozen=True)
class AgentSpec:
    """Everything a provider needs to start (or resume) one conversation's agent."""

    conversation_id: int
    cwd: Path
    session_id: str | None
    permission_mode: str
    auto_compact_window: int | None
    env: dict[str, str]  # the agent process's whole environment (built by the relay)
    ask_permission: AskPermission
    context_tokens: int | None = None  # what the relay last knew (lets the demo resume)
    model: str | None = None  # the user's choice (Claude Code's --model); None: the default
    tools: tuple[RelayTool, ...] = ()  # the relay's own tools (save_handoff...), never asked about
    # Called (on the loop) when the agent begins a turn of its own between the relay's
    # turns (OwnTurns): a background task or subagent ended.
    on_own_turn: Callable[[], None] | None = None


class AgentError(Exception):
    """The agent could not start or crashed; the message is shown as an error line."""


class Agent(Protocol):
    """One live agent session. One turn at a time; the supervisor guarantees that."""

    async def start(self) -> None:
        """Start the agent (spawn its process, resume its session)."""

    def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Run one turn for prompt, yielding events; the last one is TurnDone."""

    async def interrupt(self) -> None:
        """Ask the running turn to stop; the turn still ends with TurnDone."""

    async def context_usage(self) -> dict[str, Any] | None:
        """What the agent reports about its context window, when it can say."""

    def background_work(self) -> bool:
        """True while the agent still runs work of its own between turns (background tasks)."""

    async def close(self) -> None:
        """Stop the agent and release its process."""


@runtime_checkable
class WarmsUp(Protocol):
    """An agent that can pre-pay its first turn's own work without asking the model."""

    async def warm_up(self) -> None:
        """Do what the first turn of a fresh process would do, short of the model."""


@runtime_checkable
class Exits(Protocol):
    """An agent in a process of its own, which can end (crash, kill) between two turns."""

    def is_alive(self) -> bool:
        """Whether its process still runs."""


@runtime_checkable
class SwitchesMode(Protocol):
    """An agent whose permission mode can change while it runs (else it is restarted)."""

    async def switch_mode(self, mode: str) -> bool:
        """Apply mode now, from its next tool call on; False when only a restart can."""


@runtime_checkable
class SwitchesModel(Protocol):
    """An agent whose model can change while it runs (Claude Code: from its next request)."""

    async def switch_model(self, model: str | None) -> None:
        """Use model (None: the provider's default) from the next request on."""


@runtime_checkable
class OwnTurns(Protocol):
    """An agent that runs turns by itself between the relay's (spec.on_own_turn says when)."""

    def own_turn_waiting(self) -> bool:
        """Whether a turn the agent began by itself waits to be read with own_turn()."""

    def own_turn(self) -> AsyncIterator[AgentEvent]:
        """That turn's events, those so far then the rest as they come; the last is TurnDone."""


@runtime_checkable
class Receipts(Protocol):
    """An agent whose session records each prompt's id: after a crash it can say what it got.

    Such an agent's turn() also takes prompt_id, the id the prompt is sent with.
    """

    def turn(self, prompt: str, prompt_id: str | None = None) -> AsyncIterator[AgentEvent]:
        """Run one turn for prompt, sent with the id prompt_id."""

    def received(self, session_id: str | None, prompt_id: str, since: float) -> bool | None:
        """Whether the session got the prompt sent with prompt_id (sent after the time since).

        None when it cannot know (e.g. an agent process of the session still runs).
        """


@runtime_checkable
class SeesImages(Protocol):
    """An agent whose turns can carry the images the user attached to the message."""

    def turn_with_images(
        self, prompt: str, images: Sequence[Image], prompt_id: str | None = None
    ) -> AsyncIterator[AgentEvent]:
        """Run one turn for prompt with its images (sent before the text)."""


@runtime_checkable
class CompactionSummaries(Protocol):
    """An agent that records the summary of each of its compactions where it can be read."""

    def compaction_summary(self, record_id: str) -> str | None:
        """The summary of the compaction record_id (CompactionFinished), None if not (yet) found."""


def received(agent: Agent, session_id: str | None, prompt_id: str, since: float) -> bool | None:
    """Whether the agent got a prompt; None when it cannot know (or keeps no record)."""
    if not isinstance(agent, Receipts):
        return None
    return agent.received(session_id, prompt_id, since)
