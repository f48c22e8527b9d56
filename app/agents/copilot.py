"""The SDK engine: the GitHub Copilot CLI driven through github-copilot-sdk, one per conversation.

The only module that imports the `copilot` SDK, and only inside the methods that need it (the
import takes a second; the relay imports this module to tell whether the provider can run).
`EventMapper` turns the SDK's session events, as plain dicts, into AgentEvents without I/O;
`CopilotAgent` owns the CLI process and its session.

The CLI keeps its data (session state for resuming, logs, config) in a base directory, given
to it as COPILOT_HOME: `<home>/.copilot`, where home is spec.env["OARLOCK_AGENT_HOME"] when
the agent's environment has it (OARLOCK_AGENT_ENV_PASSTHROUGH; the tests set it in the spec),
else spec.env["HOME"] (the CLI's usual ~/.copilot,
which also holds a Copilot login stored in plain text). HOME itself is left alone: the CLI
unpacks itself (~235 MB) under $HOME/.cache once per version.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.agents.base import (
    Activity,
    AgentError,
    AgentEvent,
    AgentSpec,
    CompactionFailed,
    CompactionFinished,
    CompactionStarted,
    MessageDone,
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
    one_line,
    shorten,
    summarize,
)
from app.agents.lifetime import die_with_relay
from app.attachments import Image
from app.tools import RelayTool
from app.window import engine_window

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = PROJECT_ROOT / ".tools" / "copilot"
INSTALL_HINT = "Install the Copilot CLI with `make copilot-cli` (or set OARLOCK_COPILOT_CLI)."
OPENAI_HINT = "Set OARLOCK_OPENAI_BASE_URL and OARLOCK_OPENAI_MODEL."
RESUME_FAILED = "Could not resume the previous Copilot session; started a new session."
SESSION_GONE = "Session not found"  # the CLI's answer when a session's state is gone
SUMMARY_KEYS = ("command", "path", "file_path", "pattern", "url", "query", "description")
START_TIMEOUT = 60.0
SEND_TIMEOUT = 30.0
CONTROL_TIMEOUT = 10.0
COMPACTION_WAIT = 90.0  # how long a turn stays open for a compaction still running at idle
POLL_SECONDS = 1.0  # how often a waiting turn checks that the CLI is still there
SHELL_MARKER = re.compile(r"\n?<shellId: [^>]*>\s*$")
INTERRUPT = {"type": "oarlock.interrupt", "data": {}}  # queued by interrupt() to wake a turn


def summarize_input(arguments: Any) -> str:
    """Return a one-line summary of a tool call's arguments (the command, the path...)."""
    return summarize(arguments, SUMMARY_KEYS)


def compaction_failure_reason(data: Mapping[str, Any]) -> str:
    """Return a short one-line reason for a failed compaction, never the nested error dump."""
    reason = str(data.get("failureReason") or "").replace("_", " ").strip()
    status = data.get("statusCode")
    if reason and status:
        return f"{reason} (HTTP {status})"
    if reason:
        return reason
    if status:
        return f"HTTP {status}"
    error = str(data.get("error") or "")
    head = error.split("{", 1)[0].split("(", 1)[0].rstrip(" :")  # before any nested dump
    return one_line(head, 120) or str(data.get("outcome") or "failed")


def tool_output(data: Mapping[str, Any]) -> str:
    """Return the shortened output (or error) of a finished tool execution."""
    if not data.get("success"):
        error = data.get("error") or {}
        text = error.get("message", "") if isinstance(error, dict) else str(error)
    else:
        result = data.get("result") or {}
        text = str(result.get("content") or "") if isinstance(result, dict) else str(result)
        text = SHELL_MARKER.sub("", text)
    return shorten(text.strip("\n"))


def permission_request(raw: Mapping[str, Any], tool_names: Mapping[str, str]) -> PermissionRequest:
    """Translate the SDK's permission request (as a dict) into the relay's PermissionRequest."""
    kind = str(raw.get("kind") or "tool")
    tool_id = raw.get("toolCallId")
    name = tool_names.get(tool_id or "") or raw.get("toolName") or kind
    intention = raw.get("intention")
    match kind:
        case "shell":
            tool_input: dict[str, Any] = {"command": raw.get("fullCommandText", "")}
        case "write":
            tool_input = {
                "file_path": raw.get("fileName", ""),
                "diff": shorten(raw.get("diff", "")),
            }
        case "read":
            tool_input = {"path": raw.get("path", "")}
        case "url":
            tool_input = {"url": raw.get("url", "")}
        case "mcp" | "custom-tool":
            args = raw.get("args")
            tool_input = dict(args) if isinstance(args, dict) else {"args": args}
        case _:
            tool_input = {k: v for k, v in raw.items() if k not in ("kind", "toolCallId")}
    if intention and "description" not in tool_input:
        tool_input["description"] = intention
    return PermissionRequest(str(name), tool_input, tool_id)


def _blobs(images: Sequence[Image]) -> list[Any] | None:
    """The images as the SDK's inline attachments (its BlobAttachment: base64), or None."""
    if not images:
        return None
    return [
        {
            "type": "blob",
            "data": base64.b64encode(image.content).decode("ascii"),
            "mimeType": image.media_type,
            "displayName": f"image-{n}.{image.media_type.split('/')[1]}",
        }
        for n, image in enumerate(images, 1)
    ]


class EventMapper:
    """Translate one session's events (SessionEvent.to_dict() form) into AgentEvents; no I/O.

    Call begin_turn() before sending a prompt and feed every event in order; the turn is over
    once a TurnDone comes out. A compaction still running when the session goes idle keeps the
    turn open until its result arrives; finish() ends a turn that cannot wait any longer.
    """

    def __init__(self, model: str | None = None) -> None:
        self.model = model
        self.token_limit: int | None = None
        self.current_tokens: int | None = None
        self.interrupt_requested = False
        self.in_turn = False
        self.compacting = False
        self._idle = False
        self._aborted = False
        self._error: str | None = None
        self._open: dict[str, list[str]] = {}
        self._tools: dict[str, str] = {}
        self._last_usage: Usage | None = None
        self._compaction_trigger: str | None = None

    @property
    def waiting_for_compaction(self) -> bool:
        """The session is idle but its compaction has not reported back yet."""
        return self.in_turn and self._idle and self.compacting

    def begin_turn(self) -> None:
        """Reset what belongs to one turn."""
        self.in_turn = True
        self.interrupt_requested = False
        self._idle = self._aborted = False
        self._error = None

    def feed(self, event: Mapping[str, Any]) -> list[AgentEvent]:
        """Return the events one session event means (often none)."""
        kind = event.get("type")
        data = event.get("data") or {}
        if event.get("agentId") or data.get("parentToolCallId"):
            return []  # a sub-agent's inner events: its task tool call and result are shown
        match kind:
            case "assistant.message_start":
                self._open.setdefault(data.get("messageId", ""), [])
            case "assistant.message_delta":
                return self._delta(data)
            case "assistant.message":
                return self._message(data)
            case "assistant.usage":
                self.model = data.get("model") or self.model
            case "session.model_change":
                self.model = data.get("newModel") or self.model
            case "session.usage_info":
                return self._usage(data.get("currentTokens"), data.get("tokenLimit"))
            case "tool.execution_start":
                return self._tool_start(data)
            case "tool.execution_complete":
                return self._tool_complete(data)
            case "session.compaction_start":
                return self._compaction_start(data)
            case "session.compaction_complete":
                return self._compaction_complete(data)
            case "session.error":
                return self._session_error(data)
            case "session.warning":
                text = one_line(str(data.get("message") or ""), 500)
                return [Notice(text, level="warning", data={"type": data.get("warningType")})]
            case "session.info" if data.get("infoType") == "model_retry":
                text = one_line(str(data.get("message") or "Retrying the model request."), 500)
                return [Notice(text, level="warning", data={"type": "model_retry"})]
            case "abort":
                self._aborted = True
            case "session.idle":
                self._aborted = self._aborted or bool(data.get("aborted"))
                if not self.in_turn:
                    return []
                self._idle = True
                return [] if self.compacting else self.finish()
        return []

    def finish(self, error: str | None = None) -> list[AgentEvent]:
        """End the turn: close what is open, then TurnDone."""
        events: list[AgentEvent] = []
        for message_id, pieces in list(self._open.items()):
            if pieces:
                events.append(MessageDone(message_id, "".join(pieces)))
        self._open.clear()
        interrupted = self.interrupt_requested or self._aborted
        for tool_id, name in list(self._tools.items()):
            output = "Interrupted." if interrupted else "The tool did not finish."
            events.append(Activity(tool_id, name, "result", output=output, is_error=True))
        self._tools.clear()
        error = None if interrupted else (error or self._error)
        self.in_turn = self.compacting = False
        return [*events, TurnDone(interrupted=interrupted, error=error)]

    def _delta(self, data: Mapping[str, Any]) -> list[AgentEvent]:
        message_id = data.get("messageId", "")
        text = data.get("deltaContent") or ""
        if not text:
            return []
        self._open.setdefault(message_id, []).append(text)
        return [TextDelta(message_id, text)]

    def _message(self, data: Mapping[str, Any]) -> list[AgentEvent]:
        message_id = data.get("messageId", "")
        streamed = self._open.pop(message_id, None)
        content = data.get("content") or ""
        self.model = data.get("model") or self.model
        if not content and not streamed:
            return []  # a reply that only calls tools: the tool calls are shown
        return [MessageDone(message_id, content or "".join(streamed or []))]

    def _usage(self, current: Any, limit: Any) -> list[AgentEvent]:
        if not isinstance(current, int):
            return []
        self.current_tokens = current
        if isinstance(limit, int) and limit > 0:
            self.token_limit = limit
        usage = Usage(context_tokens=current, model=self.model, model_window=self.token_limit)
        if usage == self._last_usage:
            return []
        self._last_usage = usage
        return [usage]

    def _tool_start(self, data: Mapping[str, Any]) -> list[AgentEvent]:
        tool_id = data.get("toolCallId", "")
        name = data.get("toolName") or "tool"
        self._tools[tool_id] = name
        events = self._close_messages()
        arguments = data.get("arguments")
        summary = summarize_input(arguments)
        called = dict(arguments) if isinstance(arguments, Mapping) else {}
        return [*events, Activity(tool_id, name, "call", summary=summary, input=called)]

    def _tool_complete(self, data: Mapping[str, Any]) -> list[AgentEvent]:
        tool_id = data.get("toolCallId", "")
        name = self._tools.pop(tool_id, None) or "tool"
        is_error = not data.get("success")
        return [Activity(tool_id, name, "result", output=tool_output(data), is_error=is_error)]

    def _close_messages(self) -> list[AgentEvent]:
        """Finish streamed messages the engine left open (it never says more of them)."""
        done: list[AgentEvent] = [
            MessageDone(mid, "".join(p)) for mid, p in self._open.items() if p
        ]
        self._open = {mid: p for mid, p in self._open.items() if not p}
        return done

    def _compaction_start(self, data: Mapping[str, Any]) -> list[AgentEvent]:
        self.compacting = True
        self._compaction_trigger = data.get("trigger")
        if isinstance(data.get("tokenLimit"), int):
            self.token_limit = data["tokenLimit"]
        return [CompactionStarted(trigger=self._compaction_trigger)]

    def _compaction_complete(self, data: Mapping[str, Any]) -> list[AgentEvent]:
        self.compacting = False
        trigger = data.get("trigger") or self._compaction_trigger
        events: list[AgentEvent]
        if data.get("success"):
            post, summary = data.get("postCompactionTokens"), data.get("summaryContent")
            if isinstance(post, int):
                self.current_tokens = post
            events = [
                CompactionFinished(
                    trigger=trigger,
                    pre_tokens=data.get("preCompactionTokens"),
                    post_tokens=post,
                    messages_removed=data.get("messagesRemoved"),
                    tokens_removed=data.get("tokensRemoved"),
                    summary=summary if isinstance(summary, str) else None,
                )
            ]
        else:
            events = [CompactionFailed(reason=compaction_failure_reason(data))]
        if self.in_turn and self._idle:
            events += self.finish()
        return events

    def _session_error(self, data: Mapping[str, Any]) -> list[AgentEvent]:
        text = one_line(str(data.get("message") or data.get("errorType") or "error"), 500)
        status = data.get("statusCode")
        if self.in_turn:
            if not (self.interrupt_requested or self._aborted):
                self._error = f"Copilot error: {text}"
            return []
        return [Notice(f"Copilot error: {text}", level="error", data={"status": status})]


def _session_tool(tool: RelayTool) -> Any:
    """A relay tool as a session tool of the SDK (the SDK is imported only when used)."""
    from copilot.tools import Tool, ToolInvocation, ToolResult

    async def handler(invocation: ToolInvocation) -> ToolResult:
        arguments = invocation.arguments if isinstance(invocation.arguments, dict) else {}
        result = await tool.call(arguments)
        if result.is_error:
            return ToolResult(
                text_result_for_llm=result.text, result_type="failure", error=result.text
            )
        return ToolResult(text_result_for_llm=result.text)

    return Tool(
        name=tool.name,
        description=tool.description,
        handler=handler,
        parameters=tool.schema,
        skip_permission=True,
    )


class CopilotAgent(TurnFlags):
    """One conversation's Copilot CLI process and session, driven through github-copilot-sdk.

    provider None runs on the user's Copilot login; otherwise it is a BYOK provider config
    such as {"type": "openai", "base_url": ..., "api_key": ..., "wire_api": "completions"}.
    turn() starts the CLI when needed and resumes spec.session_id; a session that cannot be
    resumed is replaced by a new one, with a warning line.
    """

    def __init__(
        self,
        spec: AgentSpec,
        *,
        cli_path: str,
        provider: dict[str, Any] | None,
        model: str | None,
    ) -> None:
        self.spec = spec
        self.session_id = spec.session_id
        self._cli_path = cli_path
        self._provider = provider
        self._model = model
        self._client: Any = None
        self._session: Any = None
        self._unsubscribe: Any = None
        self._mapper = EventMapper(model)
        self._queue: asyncio.Queue[Mapping[str, Any]] = asyncio.Queue()
        self._init_turn_flags()
        self._tool_names: dict[str, str] = {}

    @property
    def base_directory(self) -> Path:
        """The CLI's data directory (COPILOT_HOME) for this conversation."""
        home = self.spec.env.get("OARLOCK_AGENT_HOME") or self.spec.env.get("HOME")
        return Path(home or Path.home()) / ".copilot"

    def background_work(self) -> bool:
        """The engine has no window to apply, so nothing waits on its background work."""
        return False

    def is_alive(self) -> bool:
        """Whether the CLI is connected."""
        return self._session is not None and getattr(self._client, "_state", "") == "connected"

    @property
    def pid(self) -> int | None:
        """The CLI process id while one runs."""
        process = getattr(self._client, "_cli_process", None)
        return process.pid if process is not None and process.poll() is None else None

    async def start(self) -> None:
        """Start the CLI and create or resume the session."""
        if self.is_alive():
            return
        await self.close()
        self._closing = False
        if self._provider is not None and not self._model:
            raise AgentError(f"A model is needed for a custom provider. {OPENAI_HINT}")
        try:
            async with asyncio.timeout(START_TIMEOUT):
                await self._connect()
        except AgentError:
            await self.close()
            raise
        except Exception as e:
            await self.close()
            raise AgentError(f"Could not start the Copilot CLI: {one_line(str(e), 300)}") from e

    async def _connect(self) -> None:
        from copilot import CopilotClient, RuntimeConnection

        env = {**self.spec.env, "COPILOT_AUTO_UPDATE": "false"}  # never download at run time
        # the SDK spawns program + args; a missing CLI is left for the SDK to report
        found = shutil.which(self._cli_path)
        program, *args = die_with_relay([found]) if found else [self._cli_path]
        self._client = CopilotClient(
            connection=RuntimeConnection.for_stdio(path=program, args=args),
            working_directory=str(self.spec.cwd),
            env=env,
            base_directory=str(self.base_directory),
            use_logged_in_user=self._provider is None,
            log_level="warning",
        )
        await self._client.start()
        options: dict[str, Any] = {
            "on_permission_request": self._on_permission,
            "model": self._model,
            "working_directory": str(self.spec.cwd),
            "streaming": True,
            "client_name": "oarlock",
        }
        if self.spec.tools:  # the relay's own tools: session tools, never asked about
            options["tools"] = [_session_tool(tool) for tool in self.spec.tools]
        if self._provider is not None:
            options["provider"] = self._provider
        session = None
        if self.session_id:
            try:
                session = await self._client.resume_session(self.session_id, **options)
            except Exception as e:
                if not self._session_gone(e):  # its history may still be there: keep it
                    raise AgentError(
                        f"Could not resume the Copilot session: {one_line(str(e), 300)}"
                    ) from e
                log.warning("Copilot session %s cannot be resumed: %s", self.session_id, e)
                self._pending.append(
                    Notice(RESUME_FAILED, level="warning", data={"session_id": self.session_id})
                )
        if session is None:
            session = await self._client.create_session(**options)
        self._session = session
        self.session_id = session.session_id
        self._queue = asyncio.Queue()
        self._mapper = EventMapper(self._model)
        self._unsubscribe = session.on(self._on_event)
        self._pending.append(SessionStarted(session.session_id))
        self._dirty = False

    def _session_gone(self, error: Exception) -> bool:
        """Whether a failed resume means the session's state is gone (not a passing fault)."""
        state = self.base_directory / "session-state" / (self.session_id or "")
        return SESSION_GONE in str(error) or not state.exists()

    def _on_event(self, event: Any) -> None:
        """Queue a session event for the running (or next) turn; called on the event loop."""
        try:
            raw = event.to_dict()
        except Exception:
            log.warning("unreadable Copilot event %r", getattr(event, "type", None), exc_info=True)
            return
        if raw.get("type") == "tool.execution_start":
            data = raw.get("data") or {}
            self._tool_names[data.get("toolCallId", "")] = data.get("toolName", "")
        self._queue.put_nowait(raw)

    async def _on_permission(self, request: Any, invocation: Any) -> Any:
        from copilot.generated.rpc import PermissionDecisionApproveOnce, PermissionDecisionReject

        raw = request.to_dict()
        mode = self.spec.permission_mode
        if mode == "bypassPermissions" or (
            mode == "acceptEdits" and raw.get("kind") in ("write", "read")
        ):
            return PermissionDecisionApproveOnce()
        decision = await ask_user(self.spec, permission_request(raw, self._tool_names))
        if decision.allow:
            return PermissionDecisionApproveOnce()
        return PermissionDecisionReject(feedback=decision.message)

    def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Run one turn: send prompt, yield events until TurnDone.

        A plain method: a Stop from this call on stops the turn, even one that comes before
        its first event is asked for (the relay reads it in a task of its own, a step later).
        """
        return self.turn_with_images(prompt, ())

    def turn_with_images(
        self, prompt: str, images: Sequence[Image], prompt_id: str | None = None
    ) -> AsyncIterator[AgentEvent]:
        """As turn(), the images sent with the prompt (the SDK's inline blob attachments)."""
        self._in_turn, self._stop_early = True, False
        return self._turn(prompt, images)

    async def _turn(self, prompt: str, images: Sequence[Image] = ()) -> AsyncIterator[AgentEvent]:
        began = time.monotonic()
        finished = False
        try:
            if not self.is_alive():
                try:
                    await self.start()
                except AgentError as e:
                    finished = True
                    for event in self._take_pending():
                        yield event
                    yield TurnDone(error=str(e))
                    return
            if self._dirty:
                await self._settle()
            for event in self._take_pending():
                yield event
            mapper = self._mapper
            for event in self._between_turns():
                yield event
            if self._stop_early:  # interrupted while the CLI was starting: send nothing
                finished = True
                yield TurnDone(interrupted=True)
                return
            mapper.begin_turn()
            self._tool_names.clear()
            try:
                async with asyncio.timeout(SEND_TIMEOUT):
                    await self._session.send(prompt, attachments=_blobs(images))
            except Exception as e:
                log.warning("sending to Copilot failed", exc_info=True)
                finished = True
                yield TurnDone(error=f"Could not send the message to Copilot: {one_line(str(e))}")
                return
            async for event in self._turn_events(mapper):
                if isinstance(event, TurnDone):
                    finished = True
                    event = replace(event, duration_ms=int((time.monotonic() - began) * 1000))
                yield event
        finally:
            self._in_turn = False
            self._dirty = self._dirty or not finished

    async def _turn_events(self, mapper: EventMapper) -> AsyncIterator[AgentEvent]:
        deadline: float | None = None
        while True:
            try:
                raw = await asyncio.wait_for(self._queue.get(), timeout=POLL_SECONDS)
            except TimeoutError:
                if not self.is_alive():
                    if self._closing:
                        mapper.interrupt_requested = True
                    for event in mapper.finish(error="The Copilot CLI stopped unexpectedly."):
                        yield event
                    return
                if deadline is not None and time.monotonic() > deadline:
                    for event in mapper.finish():
                        yield event
                    return
                continue
            if raw is INTERRUPT:
                if mapper.waiting_for_compaction:  # the reply is over; stop waiting
                    for event in mapper.finish():
                        yield event
                    return
                continue
            for event in mapper.feed(raw):
                yield event
                if isinstance(event, TurnDone):
                    return
            if mapper.waiting_for_compaction and deadline is None:
                deadline = time.monotonic() + COMPACTION_WAIT

    def _between_turns(self) -> list[AgentEvent]:
        """What arrived while no turn ran (a late compaction result...), without stale ends."""
        events: list[AgentEvent] = []
        while not self._queue.empty():
            raw = self._queue.get_nowait()
            if raw is not INTERRUPT:
                events += [e for e in self._mapper.feed(raw) if not isinstance(e, TurnDone)]
        return events

    async def _settle(self) -> None:
        """Stop what an abandoned turn left running, and drop its events."""
        try:
            async with asyncio.timeout(CONTROL_TIMEOUT):
                await self._session.abort()
                while True:
                    raw = await self._queue.get()
                    if raw.get("type") == "session.idle":
                        break
        except Exception:  # the next turn goes on; its events start after this point
            log.warning("settling the abandoned Copilot turn failed", exc_info=True)
        self._mapper = EventMapper(self._mapper.model)
        while not self._queue.empty():
            self._queue.get_nowait()
        self._dirty = False

    async def interrupt(self) -> None:
        """Abort the running turn; it ends with TurnDone(interrupted=True)."""
        if not self._in_turn:
            return
        self._stop_early = True
        if self._session is None or not self._mapper.in_turn:
            return
        self._mapper.interrupt_requested = True
        self._queue.put_nowait(INTERRUPT)
        try:
            async with asyncio.timeout(CONTROL_TIMEOUT):
                await self._session.abort()
        except Exception:
            log.warning("aborting the Copilot turn failed", exc_info=True)

    async def context_usage(self) -> dict[str, Any] | None:
        """Report the engine's context window as Claude Code's get_context_usage does."""
        mapper = self._mapper
        if mapper.token_limit is None:
            return None
        return {
            "maxTokens": mapper.token_limit,
            "autoCompactThreshold": engine_window(mapper.token_limit).threshold,
            "autocompactSource": "model-default",
            "totalTokens": mapper.current_tokens,
            "model": mapper.model,
            "categories": [],
        }

    async def close(self) -> None:
        """Detach the session and stop the CLI (killed if it lingers); never hangs."""
        self._closing = True
        client, session, unsubscribe = self._client, self._session, self._unsubscribe
        self._client = self._session = self._unsubscribe = None
        if unsubscribe is not None:
            with contextlib.suppress(Exception):
                unsubscribe()
        if client is None:
            return
        process = getattr(client, "_cli_process", None)  # the SDK leaves its pipes open
        try:
            if getattr(client, "_state", "") == "connected":  # else its requests would hang
                async with asyncio.timeout(CONTROL_TIMEOUT):
                    if session is not None:
                        await session.disconnect()
                    await client.stop()
            else:
                await _force_stop(client)
        except Exception:
            log.warning("stopping the Copilot CLI did not finish cleanly", exc_info=True)
            await _force_stop(client)
        finally:
            await _release(process)


async def _force_stop(client: Any) -> None:
    """Drop the SDK client's connection without asking the CLI anything."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CONTROL_TIMEOUT / 2):
            await client.force_stop()


async def _release(process: subprocess.Popen[bytes] | None) -> None:
    """Kill the CLI process if it still runs, and close its pipes."""
    if process is None:
        return
    if process.poll() is None:
        with contextlib.suppress(OSError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(process.wait, 5)
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError, ValueError):
                pipe.close()


def _platform_package() -> str:
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    system = {"darwin": "darwin", "win32": "win32"}.get(sys.platform, "linux")
    return f"copilot-{system}-{arch}"


def copilot_cli_path(configured: str | None) -> str | None:
    """The Copilot CLI to run: the configured one, else the one `make copilot-cli` installed."""
    if configured:
        return configured
    binary = TOOLS_DIR / "node_modules" / "@github" / _platform_package() / "copilot"
    return str(binary) if binary.is_file() else None


def _cli_problem(cli: str | None) -> str:
    """Why the CLI cannot run ("" when it can)."""
    path = copilot_cli_path(cli)
    if path is None:
        return INSTALL_HINT
    if not os.access(path, os.X_OK):
        return f"The Copilot CLI at {path} is missing or not executable. {INSTALL_HINT}"
    return ""


def copilot_available(environ: Mapping[str, str], cli: str | None = None) -> tuple[bool, str]:
    """Whether the Copilot provider (the user's Copilot login) can run here, and why not.

    The login itself (system keychain or ~/.copilot) cannot be checked without starting the
    CLI; a missing login shows as an error line on the first turn.
    """
    del environ  # the CLI reads COPILOT_GITHUB_TOKEN / GH_TOKEN / GITHUB_TOKEN itself
    problem = _cli_problem(cli)
    return (not problem, problem)


def openai_available(
    base_url: str | None, model: str | None, cli: str | None = None
) -> tuple[bool, str]:
    """Whether the OpenAI-compatible provider (BYOK) can run here, and why not."""
    if not base_url or not model:
        return False, OPENAI_HINT
    problem = _cli_problem(cli)
    return (not problem, problem)


def openai_provider(base_url: str, api_key: str | None) -> dict[str, Any]:
    """The BYOK provider config for an OpenAI-compatible Chat Completions server."""
    provider: dict[str, Any] = {"type": "openai", "base_url": base_url, "wire_api": "completions"}
    if api_key:
        provider["api_key"] = api_key
    return provider
