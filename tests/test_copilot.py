"""Tests of the SDK engine adapter: the real Copilot CLI against the fake OpenAI API.

The CLI must be installed (`make copilot-cli`, which `make test` runs); without it every test
that needs it fails, with the way to install it. The mapping tests at the end feed recorded
session events (trimmed, from real runs of this CLI against tests/fake_openai.py) to
EventMapper, without a process.
"""

# ruff: noqa: E501 — recorded events are kept one per line

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.agents import copilot as copilot_module
from app.agents.base import (
    Activity,
    AgentEvent,
    AgentSpec,
    CompactionFailed,
    CompactionFinished,
    CompactionStarted,
    MessageDone,
    Notice,
    PermissionDecision,
    PermissionRequest,
    SessionStarted,
    TextDelta,
    TurnDone,
    Usage,
)
from app.agents.common import DENIED
from app.agents.copilot import (
    INSTALL_HINT,
    OPENAI_HINT,
    RESUME_FAILED,
    CopilotAgent,
    EventMapper,
    compaction_failure_reason,
    copilot_available,
    copilot_cli_path,
    openai_available,
    openai_provider,
    permission_request,
)
from tests.agent_turns import TURN_TIMEOUT, allow_all, compactions, done, of, run_turn
from tests.fake_openai import SUMMARY_MARKER, FakeOpenAI

MODEL = "gpt-4.1"
WINDOW = 128_000  # the engine's token limit for gpt-4.1

MakeAgent = Callable[..., CopilotAgent]
Ask = Callable[[PermissionRequest], Awaitable[PermissionDecision]]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def make_agent(
    cli: str, fake: FakeOpenAI, shared_home: Path, tmp_path: Path
) -> AsyncIterator[MakeAgent]:
    agents: list[CopilotAgent] = []
    (tmp_path / "work").mkdir()

    def make(
        session_id: str | None = None,
        *,
        ask: Ask = allow_all,
        permission_mode: str = "default",
    ) -> CopilotAgent:
        spec = AgentSpec(
            conversation_id=1,
            cwd=tmp_path / "work",
            session_id=session_id,
            permission_mode=permission_mode,
            auto_compact_window=None,
            env={
                "HOME": str(shared_home),
                "PATH": os.environ["PATH"],
                "OARLOCK_AGENT_HOME": str(tmp_path / "agent"),
            },
            ask_permission=ask,
        )
        provider = openai_provider(fake.base_url, "sk-test")
        agent = CopilotAgent(spec, cli_path=cli, provider=provider, model=MODEL)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        await agent.close()


async def test_turn_streams_reply(make_agent: MakeAgent, fake: FakeOpenAI, tmp_path: Path) -> None:
    agent = make_agent()
    events = await run_turn(agent, "please repeat this rather long sentence back to me")

    expected = "You said: please repeat this rather long sentence back to me"
    assert events[0] == SessionStarted(agent.session_id or "")
    deltas = of(events, TextDelta)
    assert len(deltas) == 3
    assert "".join(d.text for d in deltas) == expected
    (message,) = of(events, MessageDone)
    assert message.text == expected and {d.message_id for d in deltas} == {message.message_id}
    assert events.index(deltas[-1]) < events.index(message)
    (usage,) = of(events, Usage)
    assert (usage.model, usage.model_window) == (MODEL, WINDOW)
    assert 5_000 < usage.context_tokens < 20_000  # system prompt + tools + the message
    turn_done = done(events)
    assert turn_done.error is None and not turn_done.interrupted
    assert turn_done.duration_ms is not None and turn_done.duration_ms > 0
    (body,) = fake.chat_bodies()
    assert body["model"] == MODEL and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert fake.requests[-1].headers["authorization"] == "Bearer sk-test"
    assert fake.user_texts_sent() == ["please repeat this rather long sentence back to me"]
    assert (tmp_path / "agent" / ".copilot" / "session-state" / agent.session_id).is_dir()
    report = await agent.context_usage()
    assert report == {
        "maxTokens": WINDOW,
        "autoCompactThreshold": 102_400,
        "autocompactSource": "model-default",
        "totalTokens": usage.context_tokens,
        "model": MODEL,
        "categories": [],
    }


async def test_threshold_compaction_reports_start_and_finish(
    make_agent: MakeAgent, fake: FakeOpenAI
) -> None:
    agent = make_agent()
    first = await run_turn(agent, "turn one")
    fake.prompt_tokens = 120_000  # of 128k: past the 80% background threshold
    second = await run_turn(agent, "turn two")
    third = await run_turn(agent, "turn three")

    assert compactions(first) == compactions(second) == []
    started, finished = compactions(third)
    assert started == CompactionStarted(trigger="threshold")
    assert isinstance(finished, CompactionFinished) and finished.trigger == "threshold"
    assert finished.messages_removed == 3  # the engine's own accounting of the history
    assert finished.tokens_removed is not None and finished.tokens_removed > 0
    assert finished.pre_tokens is not None and finished.post_tokens is not None
    assert finished.pre_tokens - finished.post_tokens == finished.tokens_removed
    assert third.index(started) < third.index(finished) < len(third) - 1
    assert of(third, MessageDone)[0].text == "You said: turn three"
    assert done(third).error is None
    (summary,) = fake.summary_bodies()
    assert summary["tool_choice"] == "none"
    assert summary["messages"][-1]["content"].startswith(SUMMARY_MARKER)
    report = await agent.context_usage()
    assert report is not None and report["totalTokens"] == finished.post_tokens


async def test_failing_summarizer_reports_short_reason(
    make_agent: MakeAgent, fake: FakeOpenAI
) -> None:
    fake.prompt_tokens = 120_000
    fake.summary_status = 400  # rejected at once; a 5xx is retried for ~15 s first
    agent = make_agent()
    await run_turn(agent, "turn one")
    events = await run_turn(agent, "turn two")

    assert compactions(events) == [
        CompactionStarted(trigger="threshold"),
        CompactionFailed(reason="provider rejected (HTTP 400)"),
    ]
    assert of(events, MessageDone)[0].text == "You said: turn two"
    assert done(events).error is None
    assert len(fake.summary_bodies()) == 1


async def test_interrupt_mid_reply_ends_turn(make_agent: MakeAgent, fake: FakeOpenAI) -> None:
    agent = make_agent()
    stopping: list[asyncio.Task[None]] = []

    async def stop_on_first_delta(event: AgentEvent) -> None:
        if isinstance(event, TextDelta) and not stopping:
            stopping.append(asyncio.create_task(agent.interrupt()))

    events = await run_turn(agent, "talk [[LONG:400]]", stop_on_first_delta)
    await stopping[0]

    turn_done = done(events)
    assert turn_done.interrupted is True and turn_done.error is None
    (message,) = of(events, MessageDone)
    assert 0 < len(message.text.split()) < 400
    assert agent.is_alive()

    events = await run_turn(agent, "after the stop")
    assert of(events, MessageDone)[0].text == "You said: after the stop"
    assert done(events).interrupted is False and done(events).error is None


async def test_interrupt_while_waiting_for_reply(make_agent: MakeAgent) -> None:
    agent = make_agent()
    stopping: list[asyncio.Task[None]] = []

    async def stop_on_usage(event: AgentEvent) -> None:
        if isinstance(event, Usage) and not stopping:
            stopping.append(asyncio.create_task(agent.interrupt()))

    async with asyncio.timeout(8):  # the fake would answer after 20 s
        events = await run_turn(agent, "[[SLOW:20]] answer slowly", stop_on_usage)
    await stopping[0]

    assert done(events).interrupted is True
    assert of(events, MessageDone) == []


async def test_interrupt_before_sending_sends_nothing(
    make_agent: MakeAgent, fake: FakeOpenAI
) -> None:
    agent = make_agent()

    async def stop_at_start(event: AgentEvent) -> None:
        if isinstance(event, SessionStarted):
            await agent.interrupt()

    events = await run_turn(agent, "never sent", stop_at_start)

    assert events == [SessionStarted(agent.session_id or ""), TurnDone(interrupted=True)]
    assert fake.chat_bodies() == []
    events = await run_turn(agent, "sent")
    assert of(events, MessageDone)[0].text == "You said: sent"


async def test_a_stop_before_the_turn_is_read_sends_nothing(
    make_agent: MakeAgent, fake: FakeOpenAI
) -> None:
    # As for Claude Code: a Stop between asking for a turn and reading it was lost.
    agent = make_agent()
    await agent.start()
    turn = agent.turn("never sent")  # asked for, not read yet
    await agent.interrupt()
    events = [event async for event in turn]
    assert events[-1] == TurnDone(interrupted=True)
    assert of(events, MessageDone) == []
    assert fake.chat_bodies() == []
    events = await run_turn(agent, "sent")
    assert of(events, MessageDone)[0].text == "You said: sent"


async def test_permission_request_reaches_ask(make_agent: MakeAgent, tmp_path: Path) -> None:
    asked: list[PermissionRequest] = []

    async def ask(request: PermissionRequest) -> PermissionDecision:
        asked.append(request)
        return PermissionDecision(allow=True)

    agent = make_agent(ask=ask)
    args = '{"command": "touch created.txt", "description": "Create a file", "initial_wait": 30}'
    events = await run_turn(agent, f"[[TOOL:bash {args}]]")

    assert asked == [
        PermissionRequest(
            "bash",
            {"command": "touch created.txt", "description": "Create a file"},
            "call_fake_0001",
        )
    ]
    assert (tmp_path / "work" / "created.txt").exists()
    assert of(events, Activity) == [
        Activity("call_fake_0001", "bash", "call", summary="touch created.txt"),
        Activity("call_fake_0001", "bash", "result", output=""),
    ]
    assert [m.text for m in of(events, MessageDone)] == [
        "I will use a tool.",
        "The tool returned: \n<shellId: 0 completed with exit code 0>",
    ]
    assert done(events).error is None


async def test_permission_denied_fails_tool(make_agent: MakeAgent, tmp_path: Path) -> None:
    async def deny(request: PermissionRequest) -> PermissionDecision:
        return PermissionDecision(allow=False)

    agent = make_agent(ask=deny)
    events = await run_turn(agent, '[[TOOL:bash {"command": "touch nope.txt"}]]')

    result = of(events, Activity)[1]
    assert result.is_error is True
    assert result.output == f"The user rejected this tool call. User feedback: {DENIED}"
    assert not (tmp_path / "work" / "nope.txt").exists()
    assert done(events).error is None


async def test_bypass_permissions_never_asks(make_agent: MakeAgent, tmp_path: Path) -> None:
    async def never(request: PermissionRequest) -> PermissionDecision:
        raise AssertionError("asked")

    agent = make_agent(ask=never, permission_mode="bypassPermissions")
    events = await run_turn(agent, '[[TOOL:bash {"command": "echo made > made.txt"}]]')

    assert (tmp_path / "work" / "made.txt").read_text() == "made\n"
    assert of(events, Activity)[1].is_error is False


async def test_resume_in_new_agent_sends_history(make_agent: MakeAgent, fake: FakeOpenAI) -> None:
    agent = make_agent()
    await run_turn(agent, "remember the word pineapple")
    session_id = agent.session_id
    await agent.close()
    assert not agent.is_alive()

    resumed = make_agent(session_id)
    events = await run_turn(resumed, "which word?")

    assert events[0] == SessionStarted(session_id or "")
    assert of(events, MessageDone)[0].text == "You said: which word?"
    assert resumed.session_id == session_id
    assert fake.user_texts_sent() == ["remember the word pineapple", "which word?"]


async def test_resume_unknown_session_starts_fresh(make_agent: MakeAgent) -> None:
    gone = str(uuid.uuid4())
    agent = make_agent(gone)
    events = await run_turn(agent, "hello again")

    assert events[0] == Notice(RESUME_FAILED, level="warning", data={"session_id": gone})
    (started,) = of(events, SessionStarted)
    assert started.session_id != gone and agent.session_id == started.session_id
    assert of(events, MessageDone)[0].text == "You said: hello again"


async def test_api_error_ends_turn_with_error(make_agent: MakeAgent, fake: FakeOpenAI) -> None:
    agent = make_agent()
    fake.fail(400)
    events = await run_turn(agent, "this fails")

    assert done(events).error == "Copilot error: 400 fake invalid_request_error (400)"
    assert of(events, MessageDone) == []

    events = await run_turn(agent, "this works")
    assert of(events, MessageDone)[0].text == "You said: this works"
    assert done(events).error is None


async def test_killed_cli_ends_turn_then_resumes(make_agent: MakeAgent, fake: FakeOpenAI) -> None:
    agent = make_agent()
    await run_turn(agent, "my name is Bob")
    session_id = agent.session_id

    async def kill_on_first_delta(event: AgentEvent) -> None:
        if isinstance(event, TextDelta) and agent.pid is not None:
            os.kill(agent.pid, signal.SIGKILL)

    events = await run_turn(agent, "now talk [[LONG:400]]", kill_on_first_delta)

    assert done(events).error == "The Copilot CLI stopped unexpectedly."
    assert not agent.is_alive()
    events = await run_turn(agent, "what is my name?")
    assert events[0] == SessionStarted(session_id or "")
    assert of(events, MessageDone)[0].text == "You said: what is my name?"
    assert fake.user_texts_sent()[0] == "my name is Bob"


async def test_abandoned_turn_is_settled_before_next(make_agent: MakeAgent) -> None:
    agent = make_agent()
    turn = agent.turn("talk [[LONG:400]]")
    async with asyncio.timeout(TURN_TIMEOUT):
        async for event in turn:
            if isinstance(event, TextDelta):
                break
    await turn.aclose()

    events = await run_turn(agent, "fresh start")

    assert [m.text for m in of(events, MessageDone)] == ["You said: fresh start"]
    assert of(events, TextDelta)[0].text == "You said: fresh star"
    assert done(events) == TurnDone(duration_ms=done(events).duration_ms)


async def test_close_mid_turn_is_quick(make_agent: MakeAgent) -> None:
    agent = make_agent()
    closing: list[asyncio.Task[None]] = []

    async def close_on_usage(event: AgentEvent) -> None:
        if isinstance(event, Usage) and not closing:
            closing.append(asyncio.create_task(agent.close()))

    async with asyncio.timeout(15):
        events = await run_turn(agent, "[[SLOW:30]] answer slowly", close_on_usage)
        await closing[0]
        await agent.close()

    assert done(events).interrupted is True
    assert not agent.is_alive() and agent.pid is None


async def test_start_failure_becomes_turn_error(
    fake: FakeOpenAI, tmp_path: Path, shared_home: Path
) -> None:
    spec = AgentSpec(
        conversation_id=1,
        cwd=tmp_path,
        session_id=None,
        permission_mode="default",
        auto_compact_window=None,
        env={"HOME": str(shared_home), "PATH": os.environ["PATH"]},
        ask_permission=allow_all,
    )
    missing = str(tmp_path / "no-such-copilot")
    agent = CopilotAgent(
        spec, cli_path=missing, provider=openai_provider(fake.base_url, None), model=MODEL
    )
    events = [e async for e in agent.turn("hello")]

    (turn_done,) = events
    assert isinstance(turn_done, TurnDone)
    assert turn_done.error is not None
    assert turn_done.error.startswith("Could not start the Copilot CLI: ")
    await agent.close()


# The fake OpenAI server ------------------------------------------------------------------------


def post_chat(fake: FakeOpenAI, body: dict[str, Any]) -> tuple[int, str]:
    request = urllib.request.Request(
        fake.base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": "Bearer sk-test"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": text}], **extra}


def sse_chunks(body: str) -> list[Any]:
    lines = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


def test_fake_answers_json_and_records(fake: FakeOpenAI) -> None:
    fake.configure(prompt_tokens="1234")
    status, body = post_chat(fake, chat("<current_datetime>now</current_datetime>\n\nhello"))

    reply = json.loads(body)
    assert status == 200 and reply["id"] == "chatcmpl-fake-000001"
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "You said: hello"}
    assert reply["usage"] == {"prompt_tokens": 1234, "completion_tokens": 10, "total_tokens": 1244}
    assert fake.user_texts_sent() == ["hello"]


def test_fake_streams_chunks_usage_and_done(fake: FakeOpenAI) -> None:
    _, body = post_chat(
        fake, chat("hi [[TOOL:bash {}]]", stream=True, stream_options={"include_usage": True})
    )

    chunks = sse_chunks(body)
    assert chunks[-1] == "[DONE]" and chunks[-2]["usage"]["prompt_tokens"] == 1000
    deltas = [c["choices"][0]["delta"] for c in chunks[:-2]]
    assert "".join(d.get("content", "") for d in deltas) == "I will use a tool."
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls == [
        {
            "id": "call_fake_0001",
            "type": "function",
            "function": {"name": "bash", "arguments": "{}"},
            "index": 0,
        }
    ]
    assert chunks[-3]["choices"][0]["finish_reason"] == "tool_calls"
    _, plain = post_chat(fake, chat("no usage", stream=True))
    assert all("usage" not in c for c in sse_chunks(plain)[:-1])


def test_fake_errors_summaries_and_delays(fake: FakeOpenAI) -> None:
    fake.fail(500)
    assert post_chat(fake, chat("x"))[0] == 500
    fake.configure(summary_status=413)
    summary = chat(SUMMARY_MARKER + ". The history is long.")
    assert post_chat(fake, summary)[0] == 413
    fake.configure(summary_status=None, summary_text="S")
    status, body = post_chat(fake, summary)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "S"
    began = time.monotonic()
    post_chat(fake, chat("[[SLOW:0.3]] wait"))
    assert time.monotonic() - began >= 0.3
    assert len(fake.summary_bodies()) == 2 and len(fake.turn_bodies()) == 2


# Availability ---------------------------------------------------------------------------------


def test_cli_path_prefers_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copilot_module, "TOOLS_DIR", tmp_path / "tools")
    assert copilot_cli_path("/opt/copilot") == "/opt/copilot"
    assert copilot_cli_path(None) is None
    binary = (
        tmp_path / "tools/node_modules/@github" / copilot_module._platform_package() / "copilot"
    )
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    assert copilot_cli_path(None) == str(binary)
    assert copilot_available({}) == (
        False,
        f"The Copilot CLI at {binary} is missing or not executable. {INSTALL_HINT}",
    )
    binary.chmod(0o755)
    assert copilot_available({}) == (True, "")


def test_availability_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copilot_module, "TOOLS_DIR", tmp_path / "tools")
    assert copilot_available({}) == (False, INSTALL_HINT)
    assert openai_available(None, "gpt-4.1") == (False, OPENAI_HINT)
    assert openai_available("http://127.0.0.1:1/v1", "") == (False, OPENAI_HINT)
    assert openai_available("http://127.0.0.1:1/v1", "gpt-4.1") == (False, INSTALL_HINT)
    assert openai_available("http://127.0.0.1:1/v1", "gpt-4.1", cli="/bin/sh") == (True, "")
    assert openai_provider("http://h/v1", None) == {
        "type": "openai",
        "base_url": "http://h/v1",
        "wire_api": "completions",
    }
    assert openai_provider("http://h/v1", "k")["api_key"] == "k"


# Recorded mapping sequences ---------------------------------------------------------------------

STREAMED = [
    {
        "type": "user.message",
        "data": {
            "content": "hello there, how are you doing today?",
            "transformedContent": "<current_datetime>2026-11-30T13:00:56.948+00:00</current_datetime>\n\nhello there, how are you doing today?",
            "turnId": "0",
        },
    },
    {"type": "assistant.turn_start", "data": {"turnId": "0"}},
    {
        "type": "session.usage_info",
        "data": {
            "currentTokens": 8910,
            "messagesLength": 2,
            "tokenLimit": 128000,
            "conversationTokens": 39,
            "isInitial": True,
            "systemTokens": 4533,
            "toolDefinitionsTokens": 4338,
        },
    },
    {"type": "model.call_start", "data": {"turnId": "0", "model": "gpt-4.1"}},
    {"type": "assistant.streaming_delta", "data": {"totalResponseSizeBytes": 20}},
    {"type": "assistant.message_start", "data": {"messageId": "2b44ce6f"}},
    {
        "type": "assistant.message_delta",
        "data": {"deltaContent": "You said: hello ther", "messageId": "2b44ce6f"},
    },
    {
        "type": "assistant.message_delta",
        "data": {"deltaContent": "e, how are you doing", "messageId": "2b44ce6f"},
    },
    {
        "type": "assistant.message_delta",
        "data": {"deltaContent": " today?", "messageId": "2b44ce6f"},
    },
    {
        "type": "assistant.usage",
        "data": {
            "model": "gpt-4.1",
            "apiCallId": "chatcmpl-fake-000001",
            "inputTokens": 1000,
            "outputTokens": 10,
            "maxPromptTokens": 128000,
        },
    },
    {
        "type": "assistant.message",
        "data": {
            "content": "You said: hello there, how are you doing today?",
            "messageId": "2b44ce6f",
            "model": "gpt-4.1",
            "toolRequests": [],
            "turnId": "0",
        },
    },
    {"type": "assistant.turn_end", "data": {"turnId": "0"}},
    {"type": "assistant.idle", "data": {}},
    {"type": "session.idle", "data": {"mode": "interactive"}},
]

TOOL_CALL = [
    {
        "type": "session.usage_info",
        "data": {"currentTokens": 8974, "messagesLength": 4, "tokenLimit": 128000},
    },
    {"type": "assistant.message_start", "data": {"messageId": "b06eaa2e"}},
    {
        "type": "assistant.message_delta",
        "data": {"deltaContent": "I will use a tool.", "messageId": "b06eaa2e"},
    },
    {
        "type": "assistant.message",
        "data": {
            "content": "I will use a tool.",
            "messageId": "b06eaa2e",
            "model": "gpt-4.1",
            "toolRequests": [
                {
                    "name": "bash",
                    "toolCallId": "call_fake_0002",
                    "arguments": {
                        "command": "echo hi there",
                        "description": "say hi",
                        "initial_wait": 30,
                    },
                }
            ],
        },
    },
    {
        "type": "tool.execution_start",
        "data": {
            "toolCallId": "call_fake_0002",
            "toolName": "bash",
            "arguments": {"command": "echo hi there", "description": "say hi", "initial_wait": 30},
            "toolTitle": "Running command",
        },
    },
    {
        "type": "permission.requested",
        "data": {
            "permissionRequest": {
                "kind": "shell",
                "fullCommandText": "echo hi there",
                "intention": "say hi",
                "toolCallId": "call_fake_0002",
            },
            "requestId": "edc27cbd",
        },
    },
    {
        "type": "permission.completed",
        "data": {
            "requestId": "edc27cbd",
            "result": {"kind": "approved"},
            "toolCallId": "call_fake_0002",
        },
    },
    {
        "type": "tool.execution_partial_result",
        "data": {"partialOutput": "hi there\n", "toolCallId": "call_fake_0002"},
    },
    {
        "type": "tool.execution_complete",
        "data": {
            "success": True,
            "toolCallId": "call_fake_0002",
            "result": {
                "content": "hi there\n<shellId: 0 completed with exit code 0>",
                "detailedContent": "hi there\n",
            },
        },
    },
    {
        "type": "session.usage_info",
        "data": {"currentTokens": 9010, "messagesLength": 6, "tokenLimit": 128000},
    },
    {"type": "assistant.message_start", "data": {"messageId": "9f7ef7eb"}},
    {
        "type": "assistant.message_delta",
        "data": {"deltaContent": "The tool returned: hi there", "messageId": "9f7ef7eb"},
    },
    {
        "type": "assistant.message",
        "data": {
            "content": "The tool returned: hi there",
            "messageId": "9f7ef7eb",
            "model": "gpt-4.1",
            "toolRequests": [],
        },
    },
    {"type": "session.idle", "data": {"mode": "interactive"}},
]

DENIED_TOOL = {
    "type": "tool.execution_complete",
    "data": {
        "success": False,
        "toolCallId": "call_fake_0002",
        "error": {
            "message": "The user rejected this tool call. User feedback: nope from user",
            "code": "denied",
        },
    },
}

COMPACTED = [
    {
        "type": "session.compaction_start",
        "data": {
            "compactionAttemptId": "184b1705",
            "conversationTokens": 116,
            "currentTokens": 120042,
            "model": "gpt-4.1",
            "systemTokens": 4534,
            "tokenLimit": 128000,
            "toolDefinitionsTokens": 4338,
            "trigger": "threshold",
        },
    },
    {
        "type": "session.usage_info",
        "data": {"currentTokens": 8988, "messagesLength": 6, "tokenLimit": 128000},
    },
    {"type": "assistant.message_start", "data": {"messageId": "c1"}},
    {
        "type": "assistant.message_delta",
        "data": {"deltaContent": "You said: third message", "messageId": "c1"},
    },
    {
        "type": "assistant.message",
        "data": {"content": "You said: third message", "messageId": "c1", "model": "gpt-4.1"},
    },
    {"type": "session.idle", "data": {"mode": "interactive"}},
    {
        "type": "session.compaction_complete",
        "data": {
            "success": True,
            "compactionAttemptId": "184b1705",
            "messagesRemoved": 3,
            "outcome": "applied",
            "postCompactionTokens": 8977,
            "preCompactionMessagesLength": 6,
            "preCompactionTokens": 9001,
            "summaryContent": "FAKE SUMMARY of the conversation.",
            "tokenLimit": 128000,
            "tokensRemoved": 24,
            "trigger": "threshold",
        },
    },
]

COMPACTION_REJECTED = {
    "type": "session.compaction_complete",
    "data": {
        "success": False,
        "compactionAttemptId": "a2b43deb",
        "error": 'compaction model call failed: HostRethrow { message: "400 fake invalid_request_error (400)", api_error_payload_json: Some("{\\"kind\\":\\"api_error\\",\\"status\\":400}"), js_thrown_error_id: None }',
        "failureReason": "provider_rejected",
        "model": "gpt-4.1",
        "outcome": "failed",
        "statusCode": 400,
        "tokenLimit": 128000,
        "trigger": "threshold",
    },
}

ABORTED = [
    {
        "type": "session.usage_info",
        "data": {"currentTokens": 8950, "messagesLength": 4, "tokenLimit": 128000},
    },
    {"type": "assistant.message_start", "data": {"messageId": "cd32d295"}},
    {
        "type": "assistant.message_delta",
        "data": {"deltaContent": "lorem ", "messageId": "cd32d295"},
    },
    {
        "type": "assistant.message_delta",
        "data": {"deltaContent": "ipsum ", "messageId": "cd32d295"},
    },
    {"type": "abort", "data": {"reason": "user_initiated"}},
    {"type": "agent.interrupted", "data": {"activity": "model_call", "cancelPhase": "mid_stream"}},
    {"type": "assistant.turn_end", "data": {"turnId": "0"}},
    {"type": "assistant.idle", "data": {"aborted": True}},
    {"type": "session.idle", "data": {"aborted": True, "mode": "interactive"}},
]

FAILED = [
    {
        "type": "session.usage_info",
        "data": {"currentTokens": 9020, "messagesLength": 6, "tokenLimit": 128000},
    },
    {"type": "assistant.turn_end", "data": {"turnId": "0"}},
    {
        "type": "session.error",
        "data": {
            "errorType": "query",
            "message": "400 fake invalid_request_error (400)",
            "statusCode": 400,
        },
    },
    {"type": "assistant.idle", "data": {}},
    {"type": "session.idle", "data": {"mode": "interactive"}},
]

RETRIED = [
    {
        "type": "assistant.turn_retry",
        "data": {"turnId": "0", "model": "gpt-4.1", "reason": "api_error"},
    },
    {
        "type": "session.info",
        "data": {
            "infoType": "model_retry",
            "message": "Request failed due to a transient API error. Retrying...",
        },
    },
]


def feed_all(mapper: EventMapper, events: list[dict[str, Any]]) -> list[AgentEvent]:
    return [out for event in events for out in mapper.feed(event)]


def test_mapper_streamed_reply() -> None:
    mapper = EventMapper("gpt-4.1")
    mapper.begin_turn()
    out = feed_all(mapper, STREAMED)

    text = "You said: hello there, how are you doing today?"
    assert out == [
        Usage(8910, "gpt-4.1", 128_000),
        TextDelta("2b44ce6f", "You said: hello ther"),
        TextDelta("2b44ce6f", "e, how are you doing"),
        TextDelta("2b44ce6f", " today?"),
        MessageDone("2b44ce6f", text),
        TurnDone(),
    ]
    assert not mapper.in_turn


def test_mapper_tool_call_and_result() -> None:
    mapper = EventMapper("gpt-4.1")
    mapper.begin_turn()
    out = feed_all(mapper, TOOL_CALL)

    assert out == [
        Usage(8974, "gpt-4.1", 128_000),
        TextDelta("b06eaa2e", "I will use a tool."),
        MessageDone("b06eaa2e", "I will use a tool."),
        Activity("call_fake_0002", "bash", "call", summary="echo hi there"),
        Activity("call_fake_0002", "bash", "result", output="hi there"),
        Usage(9010, "gpt-4.1", 128_000),
        TextDelta("9f7ef7eb", "The tool returned: hi there"),
        MessageDone("9f7ef7eb", "The tool returned: hi there"),
        TurnDone(),
    ]


def test_mapper_denied_tool_is_error() -> None:
    mapper = EventMapper()
    mapper.begin_turn()
    mapper.feed(TOOL_CALL[4])
    assert mapper.feed(DENIED_TOOL) == [
        Activity(
            "call_fake_0002",
            "bash",
            "result",
            output="The user rejected this tool call. User feedback: nope from user",
            is_error=True,
        )
    ]


def test_mapper_waits_for_compaction_after_idle() -> None:
    mapper = EventMapper("gpt-4.1")
    mapper.begin_turn()
    before_idle = feed_all(mapper, COMPACTED[:-1])

    assert before_idle == [
        CompactionStarted(trigger="threshold"),
        Usage(8988, "gpt-4.1", 128_000),
        TextDelta("c1", "You said: third message"),
        MessageDone("c1", "You said: third message"),
    ]
    assert mapper.waiting_for_compaction
    assert mapper.feed(COMPACTED[-1]) == [
        CompactionFinished(
            trigger="threshold",
            pre_tokens=9001,
            post_tokens=8977,
            messages_removed=3,
            tokens_removed=24,
            summary="FAKE SUMMARY of the conversation.",
        ),
        TurnDone(),
    ]
    assert mapper.current_tokens == 8977 and not mapper.waiting_for_compaction


def test_mapper_compaction_failure_reason_is_one_short_line() -> None:
    mapper = EventMapper()
    mapper.begin_turn()
    mapper.feed(COMPACTED[0])
    assert mapper.feed(COMPACTION_REJECTED) == [
        CompactionFailed(reason="provider rejected (HTTP 400)")
    ]


def test_compaction_failure_reason_variants() -> None:
    nested = COMPACTION_REJECTED["data"]["error"]
    assert compaction_failure_reason({"failureReason": "provider_server_error"}) == (
        "provider server error"
    )
    assert compaction_failure_reason({"statusCode": 413, "error": nested}) == "HTTP 413"
    assert (
        compaction_failure_reason({"error": nested}) == "compaction model call failed: HostRethrow"
    )
    assert compaction_failure_reason({"outcome": "failed"}) == "failed"


def test_mapper_abort_closes_partial_message() -> None:
    mapper = EventMapper("gpt-4.1")
    mapper.begin_turn()
    out = feed_all(mapper, ABORTED)

    assert out[-2:] == [MessageDone("cd32d295", "lorem ipsum "), TurnDone(interrupted=True)]


def test_mapper_interrupt_closes_running_tool() -> None:
    mapper = EventMapper()
    mapper.begin_turn()
    mapper.feed(TOOL_CALL[4])
    mapper.interrupt_requested = True
    assert mapper.feed({"type": "session.idle", "data": {"aborted": True}}) == [
        Activity("call_fake_0002", "bash", "result", output="Interrupted.", is_error=True),
        TurnDone(interrupted=True),
    ]


def test_mapper_session_error_ends_turn_with_error() -> None:
    mapper = EventMapper()
    mapper.begin_turn()
    out = feed_all(mapper, FAILED)

    assert out[-1] == TurnDone(error="Copilot error: 400 fake invalid_request_error (400)")
    assert of(out, Notice) == []


def test_mapper_error_between_turns_is_notice() -> None:
    mapper = EventMapper()
    assert mapper.feed(FAILED[2]) == [
        Notice("Copilot error: 400 fake invalid_request_error (400)", "error", {"status": 400})
    ]
    assert mapper.feed(FAILED[-1]) == []


def test_mapper_retry_is_warning() -> None:
    mapper = EventMapper()
    mapper.begin_turn()
    assert feed_all(mapper, RETRIED) == [
        Notice(
            "Request failed due to a transient API error. Retrying...",
            "warning",
            {"type": "model_retry"},
        )
    ]


def test_mapper_skips_sub_agent_events_and_repeated_usage() -> None:
    mapper = EventMapper("gpt-4.1")
    mapper.begin_turn()
    sub = {
        "type": "assistant.message_delta",
        "agentId": "task-1",
        "data": {"deltaContent": "x", "messageId": "s"},
    }
    usage = STREAMED[2]
    assert mapper.feed(sub) == []
    assert len(mapper.feed(usage)) == 1
    assert mapper.feed(usage) == []


def test_mapper_finish_reports_error_and_closes() -> None:
    mapper = EventMapper()
    mapper.begin_turn()
    feed_all(mapper, ABORTED[:3])
    assert mapper.finish(error="The Copilot CLI stopped unexpectedly.") == [
        MessageDone("cd32d295", "lorem "),
        TurnDone(error="The Copilot CLI stopped unexpectedly."),
    ]


def test_permission_request_translation() -> None:
    names = {"call_1": "bash"}
    shell = {
        "kind": "shell",
        "fullCommandText": "touch x",
        "intention": "touch",
        "toolCallId": "call_1",
    }
    assert permission_request(shell, names) == PermissionRequest(
        "bash", {"command": "touch x", "description": "touch"}, "call_1"
    )
    read = {
        "kind": "read",
        "path": "/etc/hostname",
        "intention": "Read file: /etc/hostname",
        "toolCallId": "call_2",
    }
    assert permission_request(read, {}) == PermissionRequest(
        "read", {"path": "/etc/hostname", "description": "Read file: /etc/hostname"}, "call_2"
    )
    write = {
        "kind": "write",
        "fileName": "/w/a.py",
        "diff": "+x",
        "intention": "Edit",
        "toolCallId": "c3",
    }
    assert permission_request(write, {"c3": "edit"}) == PermissionRequest(
        "edit", {"file_path": "/w/a.py", "diff": "+x", "description": "Edit"}, "c3"
    )
    mcp = {"kind": "mcp", "toolName": "search", "serverName": "gh", "args": {"q": "x"}}
    assert permission_request(mcp, {}) == PermissionRequest("search", {"q": "x"}, None)
