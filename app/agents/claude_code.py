"""The Claude Code agent: one long-lived `claude` CLI process per conversation.

The only module that imports claude_agent_sdk. `EventMapper` turns the SDK's messages into
AgentEvents without I/O; `ClaudeCodeAgent` owns the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from subprocess import PIPE
from typing import Any, cast

import anyio
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream, TextSendStream
from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    HookContext,
    HookInput,
    HookJSONOutput,
    HookMatcher,
    PermissionMode,
    PermissionResultAllow,
    PermissionResultDeny,
    PermissionUpdate,
    RateLimitEvent,
    ResultMessage,
    SdkMcpTool,
    StreamEvent,
    SystemMessage,
    TextBlock,
    ToolPermissionContext,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
    create_sdk_mcp_server,
)
from claude_agent_sdk import __version__ as sdk_version
from claude_agent_sdk._errors import CLIConnectionError, ProcessError
from claude_agent_sdk._internal._task_compat import spawn_detached
from claude_agent_sdk._internal.message_parser import parse_message
from claude_agent_sdk._internal.transport.subprocess_cli import (
    _ACTIVE_CHILDREN,
    SubprocessCLITransport,
)
from claude_agent_sdk.types import TERMINAL_TASK_STATUSES

from app.agents.base import (
    Activity,
    AgentError,
    AgentEvent,
    AgentSpec,
    CompactionFailed,
    CompactionFinished,
    CompactionStarted,
    MessageDone,
    ModeChanged,
    Notice,
    PermissionRequest,
    SessionStarted,
    TextDelta,
    TurnDone,
    Usage,
)
from app.agents.common import (
    TurnFlags,
    ask_user,
    exit_status,
    one_line,
    shorten,
    summarize,
)
from app.agents.lifetime import die_with_relay
from app.agents.transcript import compaction_summary, prompt_received, restored_cost
from app.attachments import Image, content_blocks
from app.config import PERMISSION_MODES
from app.questions import asked
from app.tools import MCP_PREFIX, MCP_SERVER, RelayTool, is_relay_tool

log = logging.getLogger(__name__)

RESUME_FAILED = (
    "Could not resume the previous Claude Code session (its transcript is gone); "
    "started a new session."
)
# What a tool row shows of a call: the first of these its input has (a subagent's: its
# description; a shell command's description is the model's words, the command comes first).
SUMMARY_KEYS = (
    "command",
    "file_path",
    "notebook_path",
    "path",
    "pattern",
    "url",
    "query",
    "description",
    "plan",  # ExitPlanMode: its plan, not the plan and its file as JSON
)
NOTED = (SessionStarted, ModeChanged)  # what the CLI says of itself that the adapter keeps
START_TIMEOUT = 90.0
CLOSE_TIMEOUT = 10.0
SHELL_TASK = "local_bash"  # the CLI's task_type of a background shell
CONTROL_TIMEOUT = 15.0
WARM_UP_REASON = "oarlock warm-up: stopped before the model"
STDERR_DRAIN = 2.0  # seconds to wait for an ended CLI's last stderr lines
STDERR_LINES = 3  # how many of them an error line quotes
STACK_FRAME = re.compile(r"^\s*at\s")  # a JavaScript stack line says nothing to a user
# The CLI's own commands that would change what the agent remembers behind the relay's back:
# /compact (in place, with the rest as instructions) and /clear with its aliases (the history
# wiped without a line; measured with the bundled CLI). The relay's /compact and /clear are
# whole messages it never sends; any other prompt that starts so is text for the model
# (SPEC §2), kept from the CLI's command parser by a leading space (the model reads it as
# typed). The CLI's other commands (/context, a project's own) still run.
CLI_HISTORY_COMMAND = re.compile(r"\s*/(?:compact|clear|reset|new)(?![\w-])")


def summarize_input(tool_input: dict[str, Any]) -> str:
    """Return a one-line summary of a tool call's input (the command, the path...)."""
    if questions := asked(tool_input):  # AskUserQuestion: what it asks
        return one_line(" · ".join(questions))
    return summarize(tool_input, SUMMARY_KEYS)


def result_text(content: Any) -> str:
    """Return the text of a tool_result's content (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [b.get("text", "") if isinstance(b, dict) else str(b) for b in content]
        return "\n".join(p for p in parts if p)
    return "" if content is None else str(content)


def retry_text(data: dict[str, Any]) -> str:
    """The line for an `api_retry` event: its HTTP status, or a connection error when the
    request got no answer (the CLI sends `error_status: null`, `error: "unknown"` then)."""
    status = data.get("error_status")
    what = f"API error {status} ({data.get('error')})" if status else "API connection error"
    return f"{what}, retrying (attempt {data.get('attempt')} of {data.get('max_retries')})"


def context_tokens(usage: dict[str, Any]) -> int:
    """Return the context size an API usage reports (input + cache read + cache creation)."""
    keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    return sum(int(usage.get(k) or 0) for k in keys)


class _Message:
    """One assistant message (one API reply) while its content arrives."""

    def __init__(self) -> None:
        self.streamed: list[str] = []
        self.blocks: list[str] = []
        self.seen_assistant = False
        self.text_blocks_started = 0

    def text(self) -> str:
        return "\n\n".join(self.blocks) if self.seen_assistant else "".join(self.streamed)


class EventMapper:
    """Translate one CLI process's SDK messages into AgentEvents; pure, no I/O.

    Feed every message of a turn in order; `finish()` closes what a crash left open.
    """

    def __init__(self, session_id: str | None = None, cost_so_far: float = 0.0) -> None:
        """cost_so_far: the session's cost the CLI's counter starts from (a resumed one's)."""
        self.session_id = session_id
        self.interrupt_requested = False
        self._open: dict[str, _Message] = {}
        self._done: set[str] = set()
        self._current: str | None = None
        self._tools: dict[str, str] = {}
        self._usage_seen: set[str] = set()
        self._last_usage: tuple[int, str | None] | None = None
        self._compacted_without_boundary = False
        self._retry_status: int | None = None
        self._cost_so_far = cost_so_far
        self.tasks: set[str] = set()  # tasks started and not known to have ended
        self._task_kinds: dict[str, tuple[str, str]] = {}  # task id: (type, description)

    def begin_turn(self) -> None:
        """Reset what belongs to one turn."""
        self.interrupt_requested = False
        self._retry_status = None

    def feed(self, message: Any) -> list[AgentEvent]:
        """Return the events one SDK message means (often none)."""
        if getattr(message, "parent_tool_use_id", None):
            return []  # a subagent's inner messages: its tool call and result are shown
        if isinstance(message, StreamEvent):
            return self._stream_event(message.event)
        if isinstance(message, AssistantMessage):
            return self._assistant(message)
        if isinstance(message, UserMessage):
            return self._user(message)
        if isinstance(message, SystemMessage):
            return self._system(message.subtype, message.data)
        if isinstance(message, ResultMessage):
            return self._result(message)
        if isinstance(message, RateLimitEvent):
            info = message.rate_limit_info
            if info.status != "allowed":
                text = f"Rate limit status: {info.status}"
                return [Notice(text, level="warning", data={"rate_limit": info.raw})]
        return []

    def _track_task(self, subtype: str, data: dict[str, Any]) -> None:
        """Remember which of the CLI's tasks (background shells, agents) still run."""
        task_id = data.get("task_id")
        if not task_id:
            return
        status = data.get("status") or (data.get("patch") or {}).get("status")
        if subtype == "task_started":
            self.tasks.add(task_id)
            self._task_kinds[task_id] = (
                str(data.get("task_type") or ""),
                str(data.get("description") or ""),
            )
        elif subtype == "task_notification" or status in TERMINAL_TASK_STATUSES:
            self.tasks.discard(task_id)

    def _task_ended(self, data: dict[str, Any]) -> Notice:
        """The line for a task's end (the model is told of it next, in a turn of its own).

        A shell's is the CLI's own sentence: 'Background command "Wait" completed (exit code
        0)'. Another task's (a subagent's) summary is its own first words, which could read
        as anything: the line says which task ended and how instead.
        """
        status = str(data["status"])
        kind, name = self._task_kinds.pop(str(data.get("task_id")), ("", ""))
        summary = str(data.get("summary") or "")
        if kind != SHELL_TASK or not summary:
            summary = f'Background task "{name}" {status}' if name else f"A task {status}"
        level = "warning" if status == "failed" else "info"
        text = one_line(summary, 300)
        return Notice(text, level=level, data={"type": "task", "status": status})

    def feed_json(self, data: dict[str, Any]) -> list[AgentEvent]:
        """Return the events one raw stream-json line of the CLI means (for recorded runs)."""
        message = parse_message(data)
        return self.feed(message) if message is not None else []

    def is_open(self, message_id: str) -> bool:
        """Whether a message was begun and is not done yet."""
        return message_id in self._open

    def finish(self) -> list[AgentEvent]:
        """The process ended without a result: what its open messages become.

        One whose text streamed was cut (no message_stop): no MessageDone, so the relay keeps
        its streamed text as interrupted. One known only whole (an assistant message without
        stream events) is closed with that text.
        """
        cut = [mid for mid, message in self._open.items() if message.streamed]
        for message_id in cut:
            self._open.pop(message_id)
            self._done.add(message_id)
        self._current = None
        return self._finalize_all()

    def _finalize(self, message_id: str) -> list[AgentEvent]:
        message = self._open.pop(message_id, None)
        if message is None:
            return []
        self._done.add(message_id)
        if self._current == message_id:
            self._current = None
        return [MessageDone(message_id, message.text())]

    def _finalize_all(self, keep: str | None = None) -> list[AgentEvent]:
        return [e for mid in list(self._open) if mid != keep for e in self._finalize(mid)]

    def _open_message(self, message_id: str) -> tuple[list[AgentEvent], _Message | None]:
        if message_id in self._done:
            return [], None
        events = self._finalize_all(keep=message_id)
        return events, self._open.setdefault(message_id, _Message())

    def _usage(
        self, message_id: str, usage: dict[str, Any] | None, model: str | None
    ) -> list[AgentEvent]:
        if not usage or message_id in self._usage_seen:
            return []
        self._usage_seen.add(message_id)
        self._last_usage = (context_tokens(usage), model)
        return [Usage(context_tokens=self._last_usage[0], model=model)]

    def _stream_event(self, event: dict[str, Any]) -> list[AgentEvent]:
        kind = event.get("type")
        if kind == "message_start":
            raw = event.get("message") or {}
            message_id = raw.get("id")
            if not message_id:
                return []
            events, _ = self._open_message(message_id)
            self._current = message_id
            return events + self._usage(message_id, raw.get("usage"), raw.get("model"))
        current = self._current
        message = self._open.get(current) if current else None
        if current is None or message is None:
            return []
        if kind == "content_block_start" and event.get("content_block", {}).get("type") == "text":
            message.text_blocks_started += 1
            if message.text_blocks_started > 1 and message.streamed:
                message.streamed.append("\n\n")  # the separator MessageDone puts between blocks
                return [TextDelta(current, "\n\n")]
        if kind == "content_block_delta" and event.get("delta", {}).get("type") == "text_delta":
            text = event["delta"].get("text", "")
            message.streamed.append(text)
            return [TextDelta(current, text)] if text else []
        if kind == "message_stop":
            return self._finalize(current)
        return []

    def _assistant(self, message: AssistantMessage) -> list[AgentEvent]:
        text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
        if message.model == "<synthetic>":
            return self._api_error(text, message.error)
        message_id = message.message_id or message.uuid or "assistant"
        events, current = self._open_message(message_id)
        events += self._usage(message_id, message.usage, message.model)
        if current is not None:
            current.seen_assistant = True
            current.blocks += [b.text for b in message.content if isinstance(b, TextBlock)]
        for block in message.content:
            if isinstance(block, ToolUseBlock):
                self._tools[block.id] = block.name
                summary = summarize_input(block.input)
                events.append(
                    Activity(block.id, block.name, "call", summary=summary, input=block.input)
                )
        return events

    def _api_error(self, text: str, error: str | None) -> list[AgentEvent]:
        status = self._retry_status
        if status is None and (found := re.search(r"\b([45]\d\d)\b", text)):
            status = int(found[1])
        events = self._finalize_all()
        return [*events, Notice(text, level="error", data={"status": status, "error": error})]

    def _user(self, message: UserMessage) -> list[AgentEvent]:
        if not isinstance(message.content, list):
            return []  # a compaction summary or a replayed prompt: not a message of the turn
        results = [b for b in message.content if isinstance(b, ToolResultBlock)]
        events = self._finalize_all() if results else []
        for block in results:
            events.append(
                Activity(
                    block.tool_use_id,
                    self._tools.get(block.tool_use_id, "tool"),
                    "result",
                    output=shorten(result_text(block.content)),
                    is_error=bool(block.is_error),
                )
            )
        return events

    def _system(self, subtype: str, data: dict[str, Any]) -> list[AgentEvent]:
        events = self._system_event(subtype, data)
        # A status line says the permission mode after each change (set_permission_mode's,
        # and the CLI's own: plan mode left when the plan is approved).
        mode = data.get("permissionMode")
        if subtype == "status" and isinstance(mode, str) and mode in PERMISSION_MODES:
            return [ModeChanged(mode), *events]
        return events

    def _system_event(self, subtype: str, data: dict[str, Any]) -> list[AgentEvent]:
        self._track_task(subtype, data)
        if subtype == "init":
            session_id = data.get("session_id")
            if session_id and session_id != self.session_id:
                self.session_id = session_id
                return [SessionStarted(session_id)]
        elif subtype == "task_notification" and isinstance(data.get("status"), str):
            return [self._task_ended(data)]
        elif subtype == "api_retry":
            self._retry_status = data.get("error_status")
            text = retry_text(data)
            keys = ("attempt", "max_retries", "retry_delay_ms", "error")
            return [
                Notice(
                    text,
                    level="warning",
                    data={"type": "api_retry", "status": data.get("error_status")}
                    | {k: data.get(k) for k in keys},
                )
            ]
        elif subtype == "status" and data.get("status") == "compacting":
            self._compacted_without_boundary = False
            return [CompactionStarted()]
        elif subtype == "status" and data.get("compact_result") == "failed":
            return [CompactionFailed(reason=data.get("compact_error") or "failed")]
        elif subtype == "status" and data.get("compact_result") == "success":
            self._compacted_without_boundary = True
        elif subtype == "compact_boundary":
            self._compacted_without_boundary = False
            meta = data.get("compact_metadata") or {}
            return [
                CompactionFinished(
                    trigger=meta.get("trigger"),
                    pre_tokens=meta.get("pre_tokens"),
                    post_tokens=meta.get("post_tokens"),
                    duration_ms=meta.get("duration_ms"),
                    record_id=data.get("uuid"),  # its summary follows it in the transcript
                )
            ]
        return []

    def _result(self, result: ResultMessage) -> list[AgentEvent]:
        events = self._finalize_all()
        if result.session_id and self.session_id is None:
            self.session_id = result.session_id
            events.append(SessionStarted(result.session_id))
        if self._compacted_without_boundary:
            self._compacted_without_boundary = False
            events.append(CompactionFinished())
        if self._last_usage is not None:
            tokens, model = self._last_usage
            usage = (result.model_usage or {}).get(model or "") or next(
                iter((result.model_usage or {}).values()), {}
            )
            window = usage.get("contextWindow") if isinstance(usage, dict) else None
            events.append(Usage(context_tokens=tokens, model=model, model_window=window))
        aborted = (result.terminal_reason or "").startswith("aborted")
        interrupted = result.subtype == "error_during_execution" and (
            self.interrupt_requested or aborted
        )
        error = None
        if result.is_error and not interrupted:
            error = "; ".join(result.errors or []) or result.result or result.subtype
        cost = None
        if result.total_cost_usd is not None:  # cumulative over the process: report this turn's
            cost = round(max(result.total_cost_usd - self._cost_so_far, 0.0), 6)
            self._cost_so_far = result.total_cost_usd
        done = TurnDone(interrupted, error, cost_usd=cost, duration_ms=result.duration_ms)
        return [*events, done]


def as_text(prompt: str) -> str:
    """The prompt as the CLI must take it: text for the model, never its /compact or /clear."""
    return " " + prompt if CLI_HISTORY_COMMAND.match(prompt) else prompt


async def _user_message(
    prompt: str, prompt_id: str, images: Sequence[Image] = ()
) -> AsyncIterator[dict[str, Any]]:
    """The prompt (with its images) as the one user message of a query, with its own uuid."""
    yield {
        "type": "user",
        "message": {"role": "user", "content": content_blocks(as_text(prompt), images)},
        "parent_tool_use_id": None,
        "uuid": prompt_id,
    }


def stderr_reason(lines: Iterable[str], limit: int = 300) -> str:
    """Return what an ended CLI's last stderr lines say, on one line (stack frames left out)."""
    said = [" ".join(line.split()) for line in lines if not STACK_FRAME.match(line)]
    return one_line(" ".join([s for s in said if s][-STDERR_LINES:]), limit)


def _answers(result: ResultMessage, prompt_id: str) -> bool:
    """True unless the result is another turn's than the prompt's (sent with uuid prompt_id).

    A turn the CLI began on its own (a background task's end) names no prompt of ours and
    says where it came from; ours names ours, or nothing (an interrupted turn's may not).
    """
    taken = result.user_message_uuids or (
        [result.user_message_uuid] if result.user_message_uuid else []
    )
    if taken:
        return prompt_id in taken
    origin = result.origin or {}
    return origin.get("kind") in (None, "human")


class _ExactEnvTransport(SubprocessCLITransport):
    """The SDK's subprocess transport, spawning the CLI with exactly the given environment.

    SubprocessCLITransport.connect() merges os.environ under ClaudeAgentOptions.env, which
    would hand the relay's own variables (its token, unrelated secrets) to the agent. Only
    the spawn is replaced; command line, stream framing and shutdown stay the SDK's.
    """

    def __init__(self, options: ClaudeAgentOptions, env: dict[str, str]) -> None:
        super().__init__(prompt="", options=options)
        self.env = {
            "CLAUDE_CODE_ENTRYPOINT": "sdk-py",
            # the SDK asks for these frames to know when a run is over; it drops them
            "CLAUDE_CODE_SDK_READS_SESSION_STATE": "1",
            **{k: v for k, v in env.items() if k != "CLAUDECODE"},
            "CLAUDE_AGENT_SDK_VERSION": sdk_version,
        }
        if self._cwd:
            self.env["PWD"] = self._cwd
        self.process: Process | None = None

    async def connect(self) -> None:
        if self._process:
            return
        if self._cli_path is None:
            self._cli_path = await anyio.to_thread.run_sync(self._find_cli)
        try:
            process = await anyio.open_process(
                die_with_relay(self._build_command()), stdin=PIPE, stdout=PIPE, stderr=PIPE,
                cwd=self._cwd, env=self.env,
            )  # fmt: skip
        except OSError as e:
            self._exit_error = CLIConnectionError(f"Failed to start Claude Code: {e}")
            raise self._exit_error from e
        self._process = self.process = process
        _ACTIVE_CHILDREN.add(process)
        assert process.stdout and process.stdin and process.stderr
        self._stdout_stream = TextReceiveStream(process.stdout)
        self._stdin_stream = TextSendStream(process.stdin)
        self._stderr_stream = TextReceiveStream(process.stderr)
        self._stderr_task = spawn_detached(self._handle_stderr())
        self._ready = True

    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def exited(self) -> bool:
        """True once the process has ended (by itself, unless kill() was called)."""
        return self.process is not None and self.process.returncode is not None

    async def drain_stderr(self) -> None:
        """Wait (briefly) until every line the ended process wrote to stderr was handed on."""
        task = self._stderr_task
        if task is not None:
            with contextlib.suppress(Exception), anyio.move_on_after(STDERR_DRAIN):
                await task.wait()  # a grandchild holding the pipe open would block: bounded

    async def kill(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self.process.wait()
                _ACTIVE_CHILDREN.discard(self.process)


def _mcp_tool(tool: RelayTool) -> SdkMcpTool[Any]:
    """A relay tool as a tool of the SDK's in-process MCP server."""

    async def handler(arguments: dict[str, Any]) -> dict[str, Any]:
        result = await tool.call(arguments)
        return {"content": [{"type": "text", "text": result.text}], "is_error": result.is_error}

    return SdkMcpTool(tool.name, tool.description, tool.schema, handler)


def _tool_server(tools: tuple[RelayTool, ...]) -> dict[str, Any]:
    """The mcp_servers option: the relay's tools as one in-process server (none: no server)."""
    if not tools:
        return {}
    server = create_sdk_mcp_server(MCP_SERVER, tools=[_mcp_tool(t) for t in tools])
    # alwaysLoad: the tools sit in the model's tool list from the first turn, not deferred
    # behind the CLI's tool search (the context note names save_handoff; it must be there).
    return {MCP_SERVER: {**server, "alwaysLoad": True}}


def _transcript_exists(env: dict[str, str], session_id: str) -> bool:
    """Whether any project directory holds this session's transcript."""
    config = env.get("CLAUDE_CONFIG_DIR") or str(Path(env.get("HOME", "~")) / ".claude")
    projects = Path(config).expanduser() / "projects"
    return any(projects.glob(f"*/{session_id}.jsonl"))


class ClaudeCodeAgent(TurnFlags):
    """One conversation's Claude Code CLI, driven through claude_agent_sdk.

    The process gets exactly spec.env (which carries CLAUDE_CODE_AUTO_COMPACT_WINDOW when a
    window is set). turn() starts the process when needed: after a crash it resumes the
    session, and when the session's transcript is gone it starts a new one and says so.
    """

    def __init__(
        self, spec: AgentSpec, *, cli_path: str | None = None, model: str | None = None
    ) -> None:
        self.spec = spec
        self.session_id = spec.session_id
        self._cli_path = cli_path
        self._model = model
        self._client: ClaudeSDKClient | None = None
        self._transport: _ExactEnvTransport | None = None
        self._mapper = EventMapper()
        # Between turns, what the CLI says on its own (a background task's end, the turn it
        # then runs) is read at once: the task state stays current, the events wait for the
        # relay to run that turn as one of its own (own_turn), or for the next turn.
        self._idle: asyncio.Task[None] | None = None
        self._backlog: list[AgentEvent] = []  # its TurnDone marks where such a turn ended
        self._own_open = False  # the CLI began a turn by itself; its result is not read yet
        self._init_turn_flags()
        self._stderr: deque[str] = deque(maxlen=20)
        self._starting = False  # turn() is (re)starting the CLI
        # Never typed by anyone: the hook stops exactly this prompt before the model.
        self._warm_up_prompt = f"oarlock warm-up {uuid.uuid4()}"
        self._stops_warm_up = False  # the live CLI has the hook that stops that prompt

    @property
    def pid(self) -> int | None:
        """The CLI process id while one runs."""
        transport = self._transport
        return transport.process.pid if transport and transport.process else None

    def background_work(self) -> bool:
        """True while a task the CLI started (e.g. a background shell) has not ended."""
        return self.is_alive() and bool(self._mapper.tasks)

    def is_alive(self) -> bool:
        """Whether the CLI process is running."""
        return self._transport is not None and self._transport.running()

    async def start(self) -> None:
        """Spawn the CLI, resuming the session; start afresh if its transcript is gone."""
        if self._client is not None and self.is_alive():
            return
        await self.close()
        try:
            await self._connect(self.session_id)
        except Exception as e:
            if not self.session_id or not self._resume_refused(e):
                raise AgentError(f"Could not start Claude Code: {e}") from e
            log.warning("session %s cannot be resumed: %s", self.session_id, e)
            self._pending.append(
                Notice(RESUME_FAILED, level="warning", data={"session_id": self.session_id})
            )
            self.session_id = None
            try:
                await self._connect(None)
            except Exception as e2:
                raise AgentError(f"Could not start Claude Code: {e2}") from e2

    def _resume_refused(self, error: Exception) -> bool:
        if "No conversation found" in str(error):
            return True
        return self.session_id is not None and not _transcript_exists(
            self.spec.env, self.session_id
        )

    async def _connect(self, resume: str | None) -> None:
        spec = self.spec
        ask = spec.permission_mode != "bypassPermissions"  # the CLI would never ask
        options = ClaudeAgentOptions(
            cwd=str(spec.cwd),
            resume=resume,
            permission_mode=spec.permission_mode,  # type: ignore[arg-type]
            can_use_tool=self._can_use_tool if ask else None,
            include_partial_messages=True,
            cli_path=self._cli_path,
            model=spec.model or self._model,
            system_prompt={"type": "preset", "preset": "claude_code"},
            env=dict(spec.env),
            stderr=self._stderr.append,
            mcp_servers=_tool_server(spec.tools),
            # The relay's own tools are never asked about: _can_use_tool allows them (the SDK
            # refuses an allowed_tools entry that would shadow the callback).
            allowed_tools=[] if ask else [MCP_PREFIX + tool.name for tool in spec.tools],
            # Only a resumed CLI is ever warmed up: on the others the hook would cost every
            # prompt a control round trip for nothing.
            hooks={"UserPromptSubmit": [HookMatcher(hooks=[self._stop_warm_up])]}
            if resume
            else None,
        )
        # a custom transport gets no option rewriting: route permission prompts here ourselves
        wire = replace(options, permission_prompt_tool_name="stdio") if ask else options
        transport = _ExactEnvTransport(wire, spec.env)
        client = ClaudeSDKClient(options, transport=transport)
        self._transport = transport
        self._stderr.clear()  # only this process's lines explain what happens to it
        # Where a resumed CLI's cost count starts (its last exit's): read while it starts.
        cost = (
            asyncio.ensure_future(asyncio.to_thread(restored_cost, spec.env, resume))
            if resume
            else None
        )
        try:
            async with asyncio.timeout(START_TIMEOUT):
                await client.connect()
        except BaseException as e:
            exited = transport.exited()  # the CLI refused to run (bad option, root...)
            await transport.kill()
            if exited and isinstance(e, Exception):
                await transport.drain_stderr()
                if reason := stderr_reason(self._stderr):
                    code = transport.process.returncode if transport.process else None
                    raise CLIConnectionError(f"the CLI exited (code {code}): {reason}") from e
            raise
        self._client = client
        self._stops_warm_up = resume is not None
        self._mapper = EventMapper(resume, await cost if cost is not None else 0.0)
        self._dirty = self._closing = False

    async def _can_use_tool(
        self, tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        if is_relay_tool(tool_name, self.spec.tools):
            return PermissionResultAllow()
        # Claude Code writes the call's assistant message before this request (a subagent's
        # calls are not shown: EventMapper.feed).
        subagent = context.agent_id is not None  # (it may run on after the turn: lasting)
        request = PermissionRequest(
            tool_name, tool_input, context.tool_use_id, announced=not subagent, lasting=subagent
        )
        decision = await ask_user(self.spec, request)
        if decision.allow and decision.answers is not None:  # AskUserQuestion's, answered
            return PermissionResultAllow(updated_input={**tool_input, "answers": decision.answers})
        if decision.allow and decision.mode is not None:  # a plan approved: plan mode ends in it
            mode = cast(PermissionMode, decision.mode)
            change = PermissionUpdate(type="setMode", mode=mode, destination="session")
            return PermissionResultAllow(updated_permissions=[change])
        if decision.allow:
            return PermissionResultAllow()
        return PermissionResultDeny(message=decision.message)

    async def _stop_warm_up(
        self, hook_input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        """UserPromptSubmit hook: block the warm-up prompt (nothing reaches the model)."""
        if hook_input.get("prompt") == self._warm_up_prompt:
            return {"decision": "block", "reason": WARM_UP_REASON}
        return {}

    async def switch_mode(self, mode: str) -> bool:
        """Change the live CLI's permission mode (a control request; from its next tool call).

        Not to or from bypassPermissions: the CLI is started without the permission callback
        in that mode, with it in the others; those switches need a restart (False).
        """
        client, old = self._client, self.spec.permission_mode
        if client is None or not self.is_alive() or "bypassPermissions" in (mode, old):
            return False
        await client.set_permission_mode(mode)  # type: ignore[arg-type]
        self.spec = replace(self.spec, permission_mode=mode)  # and for a restart after a crash
        return True

    async def switch_model(self, model: str | None) -> None:
        """Use model (None: the relay's default) from the CLI's next request (a control
        request: no restart, the session goes on)."""
        client = self._client
        self.spec = replace(self.spec, model=model)  # and for a restart after a crash
        if client is not None and self.is_alive():
            await client.set_model(model or self._model)

    async def warm_up(self) -> None:
        """Run a resumed CLI's prompt path once, stopped by a hook before the model.

        A fresh CLI's first prompt costs ~100 ms more than the next (skills, CLAUDE.md,
        hooks, first-run code; bench/README.md "Warming"): paid here, while the user types.
        The model never sees it; the transcript gets one "blocked by hook" system line.
        A CLI started without the hook (a new session) is never sent it.
        """
        client = self._client
        if client is None or not self._stops_warm_up or not self.session_id:
            return
        if self._in_turn or not self.is_alive():
            return
        self._in_turn = True
        try:
            await self._quiet()
            async with asyncio.timeout(CONTROL_TIMEOUT):
                await client.query(self._warm_up_prompt)
                async with contextlib.aclosing(client.receive_messages()) as messages:
                    async for message in messages:
                        if isinstance(message, ResultMessage):
                            break
        except Exception:  # its messages may still come: the next turn starts a new CLI
            log.warning("Claude Code warm-up failed", exc_info=True)
            self._dirty = True
        finally:
            self._in_turn = False
            self._listen()

    def received(self, session_id: str | None, prompt_id: str, since: float) -> bool | None:
        """Whether the session's transcript records the prompt sent with prompt_id."""
        return prompt_received(self.spec.env, self.spec.cwd, session_id, prompt_id, since)

    def compaction_summary(self, record_id: str) -> str | None:
        """The summary the CLI wrote after its compact_boundary record_id, from the transcript."""
        if not self.session_id:
            return None
        return compaction_summary(self.spec.env, self.session_id, record_id)

    def turn(self, prompt: str, prompt_id: str | None = None) -> AsyncIterator[AgentEvent]:
        """Run one turn: send prompt (with the uuid prompt_id), yield events until TurnDone.

        A plain method: a Stop from this call on stops the turn, even one that comes before
        its first event is asked for (the relay reads it in a task of its own, a step later).
        """
        return self.turn_with_images(prompt, (), prompt_id)

    def turn_with_images(
        self, prompt: str, images: Sequence[Image], prompt_id: str | None = None
    ) -> AsyncIterator[AgentEvent]:
        """As turn(), the images sent before the text in the same user message."""
        self._stop_early, self._turn_asked = False, True
        return self._turn(prompt, prompt_id, images)

    async def _turn(
        self, prompt: str, prompt_id: str | None, images: Sequence[Image] = ()
    ) -> AsyncIterator[AgentEvent]:
        try:
            if self._dirty or not self.is_alive():
                self._starting = True
                try:
                    if self._dirty:  # a turn abandoned midway left its messages in the stream
                        await self.close()
                    await self.start()
                except AgentError as e:
                    for event in self._take_pending():
                        yield event
                    yield TurnDone(error=str(e))
                    return
                finally:
                    self._starting = False
            await self._quiet()
            for event in self._take_pending():
                yield event
            backlog, self._backlog, self._own_open = self._backlog, [], False
            for event in backlog:  # said by the CLI on its own since the last turn
                if not isinstance(event, TurnDone):  # (shown as part of this turn)
                    yield event
            if self._stop_early:  # Stop came before the prompt was sent: send nothing
                yield TurnDone(interrupted=True)
                return
        finally:
            self._turn_asked = False  # (the prompt goes next, with no await before _in_turn)
        client = self._client
        assert client is not None
        self._mapper.begin_turn()
        prompt_id = prompt_id or str(uuid.uuid4())
        message = _user_message(prompt, prompt_id, images)
        # Closed with this one (a turn abandoned midway leaves the CLI dirty at once).
        reading = self._reading(prompt_id, send=partial(client.query, message))
        async with contextlib.aclosing(reading) as events:
            async for event in events:
                yield event

    def own_turn_waiting(self) -> bool:
        """Whether a turn the CLI began by itself waits to be read (own_turn)."""
        return self._own_open or any(isinstance(e, TurnDone) for e in self._backlog)

    async def own_turn(self) -> AsyncIterator[AgentEvent]:
        """The turn the CLI began by itself between the relay's turns (a background task
        or subagent ended): the events read so far, then the rest until its
        result. Without one waiting, only TurnDone."""
        await self._quiet()
        ended = next((i for i, e in enumerate(self._backlog) if isinstance(e, TurnDone)), None)
        if ended is not None or not self._own_open:  # read whole already, or none begun
            cut = len(self._backlog) if ended is None else ended + 1
            events, self._backlog = self._backlog[:cut], self._backlog[cut:]
            self._listen()
            for event in events:
                yield event
            if ended is None:
                yield TurnDone()
            return
        events, self._backlog, self._own_open = self._backlog, [], False
        async with contextlib.aclosing(self._reading(None, before=events)) as rest:
            async for event in rest:
                yield event

    async def _reading(
        self,
        prompt_id: str | None,
        *,
        send: Callable[[], Awaitable[None]] | None = None,
        before: list[AgentEvent] | None = None,
    ) -> AsyncIterator[AgentEvent]:
        """One turn read until its result, after events read before (before) or the prompt
        sent with prompt_id (send). Without a prompt: the turn the CLI runs by itself."""
        client, mapper = self._client, self._mapper
        assert client is not None
        self._in_turn, finished = True, False
        try:
            for event in before or ():
                yield event
            if send is not None:
                await send()
            async with contextlib.aclosing(client.receive_messages()) as messages:
                async for message in messages:
                    # The CLI also runs turns of its own (background-task notifications...): a
                    # result that names other messages than our prompt's is such a turn's.
                    injected = (
                        prompt_id is not None
                        and isinstance(message, ResultMessage)
                        and not _answers(message, prompt_id)
                    )
                    for event in mapper.feed(message):
                        if isinstance(event, NOTED):  # (not a delta: one check on the hot path)
                            self._note(event)
                        if injected and isinstance(event, TurnDone):
                            continue  # shown as part of this turn; ours goes on
                        finished = isinstance(event, TurnDone)
                        yield event
                    if finished:
                        break
            if not finished:
                raise CLIConnectionError("the message stream ended without a result")
        except Exception as e:
            finished = True
            for event in mapper.finish():
                yield event
            if self._closing:  # close() stopped the process under this turn
                yield TurnDone(interrupted=True)
            else:
                log.warning("Claude Code turn failed", exc_info=True)
                yield TurnDone(error=self._failure_text(e))
        finally:
            self._in_turn = False
            self._dirty = self._dirty or not finished
            self._listen()

    def _note(self, event: AgentEvent) -> None:
        """Keep what the CLI says of itself: its session, and its mode (a restart after a
        crash resumes in the mode it had, not the one it was started with)."""
        if isinstance(event, SessionStarted):
            self.session_id = event.session_id
        elif isinstance(event, ModeChanged):
            self.spec = replace(self.spec, permission_mode=event.mode)

    def _listen(self) -> None:
        """Read the CLI between turns (a task, until the next turn or warm-up stops it)."""
        client = self._client
        if client is None or self._dirty or self._closing or not self.is_alive():
            return
        if self._idle is None or self._idle.done():
            self._idle = asyncio.create_task(self._read_idle(client), name="claude-idle")

    async def _read_idle(self, client: ClaudeSDKClient) -> None:
        """What the CLI says on its own: its task state now, its events for own_turn (the
        relay is told when such a turn begins) or the next turn.
        """
        try:
            async with contextlib.aclosing(client.receive_messages()) as messages:
                async for message in messages:
                    began = isinstance(message, SystemMessage) and message.subtype == "init"
                    if began:  # (a turn's first message: the last turn's flags are done)
                        self._mapper.begin_turn()
                    for event in self._mapper.feed(message):
                        if isinstance(event, NOTED):
                            self._note(event)
                        if isinstance(event, TurnDone):
                            self._own_open = False
                        self._backlog.append(event)
                    if began and not self._own_open:
                        self._own_open = True
                        if self.spec.on_own_turn is not None:
                            self.spec.on_own_turn()
        except Exception:  # the process ended: the next turn finds it gone and starts anew
            log.info("Claude Code stopped while idle", exc_info=True)

    async def _quiet(self) -> None:
        """Stop reading between turns (a turn or a warm-up reads now)."""
        task, self._idle = self._idle, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _failure_text(self, error: Exception) -> str:
        if self.is_alive() and not isinstance(error, ProcessError):
            return f"Claude Code failed: {error}"
        process = self._transport.process if self._transport else None
        code = process.returncode if process else getattr(error, "exit_code", None)
        text = "The Claude Code process exited unexpectedly"
        text += f" ({exit_status(code)})." if code is not None else "."
        if self._stderr:
            text += f" Its last output: {one_line(self._stderr[-1], 300)}"
        return text

    async def interrupt(self) -> None:
        """Ask the running turn to stop; the process stays alive."""
        if self._starting or self._turn_asked:
            self._stop_early = True
            return
        await self._interrupt_cli()

    async def _interrupt_cli(self) -> None:
        if self._client is None or not (self._in_turn or self._dirty):
            return
        self._mapper.interrupt_requested = True
        try:
            async with asyncio.timeout(CONTROL_TIMEOUT):
                await self._client.interrupt()
        except Exception:
            log.warning("interrupt failed", exc_info=True)

    async def context_usage(self) -> dict[str, Any] | None:
        """Return the CLI's context-window report, or None when it cannot say."""
        if self._client is None or not self.is_alive():
            return None
        try:
            async with asyncio.timeout(CONTROL_TIMEOUT):
                return dict(await self._client.get_context_usage())
        except Exception:
            log.warning("get_context_usage failed", exc_info=True)
            return None

    async def close(self) -> None:
        """Stop the CLI (stdin closed, then killed if it lingers); never hangs.

        With background work it is killed first: closed gracefully, the CLI would wait for its
        tasks, then run a turn of its own about them, unread.
        """
        client, transport = self._client, self._transport
        lingers = self.background_work()
        self._closing = True
        await self._quiet()
        if client is not None and self.is_alive():
            with contextlib.suppress(TimeoutError):  # a turn in flight would delay the exit
                async with asyncio.timeout(3):
                    await self._interrupt_cli()
        self._client, self._transport = None, None
        if lingers and transport is not None:
            await transport.kill()
        if client is not None:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await client.disconnect()
            except Exception:
                log.warning("closing Claude Code did not finish cleanly", exc_info=True)
        if transport is not None:
            await transport.kill()
