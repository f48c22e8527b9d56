"""Tests of the Claude Code adapter: the real `claude` CLI against the fake Messages API.

The mapping tests at the end feed recorded stream-json lines (trimmed, from real runs of this
CLI against tests/fake_anthropic.py) to EventMapper, without a process.
"""

# ruff: noqa: E501 — recorded stream-json lines are kept one per line

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk._internal.message_parser import parse_message

from app.agents.base import (
    Activity,
    AgentEvent,
    AgentSpec,
    CompactionFailed,
    CompactionFinished,
    CompactionStarted,
    MessageDone,
    ModeChanged,
    Notice,
    PermissionDecision,
    PermissionRequest,
    SessionStarted,
    TextDelta,
    TurnDone,
    Usage,
)
from app.agents.claude_code import (
    RESUME_FAILED,
    ClaudeCodeAgent,
    EventMapper,
    _answers,
    as_text,
    shorten,
    summarize_input,
)
from app.agents.common import DENIED
from app.agents.transcript import config_dir, restored_cost
from tests.agent_turns import TURN_TIMEOUT, allow_all, done, of, run_turn
from tests.fake_anthropic import DROP, SUMMARY_MARKER, FakeAnthropic

MODEL = "claude-opus-5-5"  # the bundled CLI's default model
SDK_VARS = {
    "CLAUDE_CODE_ENTRYPOINT",
    "CLAUDE_CODE_SDK_READS_SESSION_STATE",
    "CLAUDE_AGENT_SDK_VERSION",
    "PWD",
}

MakeAgent = Callable[..., ClaudeCodeAgent]


@pytest.fixture
def fake() -> AsyncIterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


@pytest.fixture
async def make_agent(fake: FakeAnthropic, tmp_path: Path) -> AsyncIterator[MakeAgent]:
    agents: list[ClaudeCodeAgent] = []
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()

    def make(
        session_id: str | None = None,
        *,
        ask: Callable[[PermissionRequest], Awaitable[PermissionDecision]] = allow_all,
        env: dict[str, str] | None = None,
        model: str | None = None,
        mode: str = "default",
    ) -> ClaudeCodeAgent:
        spec = AgentSpec(
            conversation_id=1,
            cwd=tmp_path / "work",
            session_id=session_id,
            permission_mode=mode,
            auto_compact_window=None,
            env={
                "HOME": str(tmp_path / "home"),
                "PATH": os.environ["PATH"],
                "ANTHROPIC_BASE_URL": fake.base_url,
                "ANTHROPIC_API_KEY": "sk-test",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                **(env or {}),
            },
            ask_permission=ask,
        )
        agent = ClaudeCodeAgent(spec, model=model)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        await agent.close()


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(v.decode().split("=", 1) for v in raw if v)


async def test_turn_streams_reply(make_agent: MakeAgent, fake: FakeAnthropic) -> None:
    agent = make_agent()
    await agent.start()
    events = await run_turn(agent, "please repeat this rather long sentence back to me")

    expected = "You said: please repeat this rather long sentence back to me"
    started = of(events, SessionStarted)
    deltas = of(events, TextDelta)
    assert events[0] == started[0] and agent.session_id == started[0].session_id
    assert len(deltas) >= 3
    assert "".join(d.text for d in deltas) == expected
    assert {d.message_id for d in deltas} == {"msg_fake_000001"}
    assert of(events, MessageDone) == [MessageDone("msg_fake_000001", expected)]
    assert events.index(deltas[-1]) < events.index(of(events, MessageDone)[0])
    assert of(events, Usage) == [Usage(1000, MODEL), Usage(1000, MODEL, 1_000_000)]
    turn_done = done(events)
    assert turn_done.error is None and not turn_done.interrupted
    assert turn_done.cost_usd and turn_done.cost_usd > 0
    assert turn_done.duration_ms and turn_done.duration_ms > 0
    request = fake.requests[-1]
    assert request.headers["x-api-key"] == "sk-test"
    assert request.body["model"] == MODEL


async def test_a_cli_restarted_after_a_crash_keeps_the_mode_it_changed_to(
    make_agent: MakeAgent, fake: FakeAnthropic
) -> None:
    # Its plan approved, Claude Code leaves plan mode; started again after a crash, it was
    # started in plan mode again, the mode the relay first gave it.
    asked: list[str] = []

    async def allow(request: PermissionRequest) -> PermissionDecision:
        asked.append(request.tool_name)
        return PermissionDecision(True)

    agent = make_agent(mode="plan", ask=allow)
    fake.tool_calls.append(("ExitPlanMode", {"plan": "1. Write one.txt"}))
    events = await run_turn(agent, "make a plan")
    assert (of(events, ModeChanged), agent.spec.permission_mode) == (
        [ModeChanged("default")],
        "default",
    )
    assert isinstance(agent.pid, int)
    os.kill(agent.pid, signal.SIGKILL)
    assert "SIGKILL" in str(done(await run_turn(agent, "hello?")).error)  # the crash, said
    await run_turn(agent, "[[WRITE:one.txt|1]]")  # the adapter starts it again, resuming
    assert asked == ["ExitPlanMode", "Write"]  # asked, as in default (plan mode refuses it)


async def test_turn_reports_bash_activity(make_agent: MakeAgent, fake: FakeAnthropic) -> None:
    agent = make_agent(model="claude-haiku-4-5")
    events = await run_turn(agent, "run it [[BASH:echo hi]]")

    call, result = of(events, Activity)
    assert call == Activity("toolu_fake_0001", "Bash", "call", summary="echo hi")
    assert result == Activity("toolu_fake_0001", "Bash", "result", output="hi")
    assert of(events, MessageDone) == [
        MessageDone("msg_fake_000001", "I will run the command."),
        MessageDone("msg_fake_000002", "The tool returned: hi"),
    ]
    assert events.index(call) < events.index(result)
    assert done(events).error is None
    assert {b["model"] for b in fake.message_bodies()} == {"claude-haiku-4-5"}


async def test_permission_allowed_runs_tool(make_agent: MakeAgent, tmp_path: Path) -> None:
    asked: list[PermissionRequest] = []

    async def ask(request: PermissionRequest) -> PermissionDecision:
        asked.append(request)
        return PermissionDecision(allow=True)

    agent = make_agent(ask=ask)
    events = await run_turn(agent, "[[BASH:touch created.txt]]")

    assert [(r.tool_name, r.tool_input["command"], r.tool_id) for r in asked] == [
        ("Bash", "touch created.txt", "toolu_fake_0001")
    ]
    assert (tmp_path / "work" / "created.txt").exists()
    assert of(events, Activity)[1].is_error is False
    assert done(events).error is None


async def test_permission_denied_fails_tool(make_agent: MakeAgent, tmp_path: Path) -> None:
    asked: list[PermissionRequest] = []

    async def ask(request: PermissionRequest) -> PermissionDecision:
        asked.append(request)
        return PermissionDecision(allow=False)

    agent = make_agent(ask=ask)
    events = await run_turn(agent, "[[BASH:touch created.txt]]")

    assert len(asked) == 1
    result = of(events, Activity)[1]
    assert result.phase == "result" and result.is_error is True
    assert DENIED in result.output
    assert not (tmp_path / "work" / "created.txt").exists()
    assert done(events).error is None


async def test_interrupt_ends_turn_and_keeps_process(
    make_agent: MakeAgent, fake: FakeAnthropic
) -> None:
    agent = make_agent()
    await agent.start()
    pid = agent.pid
    stopping: list[asyncio.Task[None]] = []

    async def stop_on_first_delta(event: AgentEvent) -> None:
        if isinstance(event, TextDelta) and not stopping:
            stopping.append(asyncio.create_task(agent.interrupt()))

    events = await run_turn(agent, "talk [[LONG:400]]", stop_on_first_delta)
    await stopping[0]

    assert done(events).interrupted is True and done(events).error is None
    (message,) = of(events, MessageDone)
    assert 0 < len(message.text.split()) < 400
    assert agent.is_alive() and agent.pid == pid

    events = await run_turn(agent, "after the stop")
    assert of(events, MessageDone)[0].text == "You said: after the stop"
    assert done(events).error is None
    assert "[Request interrupted by user]" in "".join(fake.user_texts_sent())
    assert agent.pid == pid


async def test_a_stop_before_the_turn_is_read_sends_nothing(
    make_agent: MakeAgent, fake: FakeAnthropic
) -> None:
    # Found by a review: the relay reads a turn in a task of its own, a loop step after asking
    # for it; a Stop in between found the agent neither starting nor in a turn, did nothing,
    # and the turn then ran whole.
    agent = make_agent()
    await agent.start()
    turn = agent.turn("never sent")  # asked for, not read yet
    await agent.interrupt()
    events = [event async for event in turn]
    assert events == [TurnDone(interrupted=True)]
    assert "never sent" not in "".join(fake.user_texts_sent())
    events = await run_turn(agent, "after the stop")
    assert of(events, MessageDone)[0].text == "You said: after the stop"


async def test_kill_mid_turn_ends_turn_then_resume(
    make_agent: MakeAgent, fake: FakeAnthropic
) -> None:
    agent = make_agent()
    await run_turn(agent, "my name is Bob")
    session_id = agent.session_id

    async def kill_on_first_delta(event: AgentEvent) -> None:
        if isinstance(event, TextDelta) and agent.pid is not None:
            os.kill(agent.pid, signal.SIGKILL)

    events = await run_turn(agent, "now talk [[LONG:400]]", kill_on_first_delta)

    error = done(events).error
    assert error is not None
    assert error.startswith("The Claude Code process exited unexpectedly (killed by SIGKILL)")
    assert not agent.is_alive()
    await agent.close()

    resumed = make_agent(session_id)
    events = await run_turn(resumed, "what is my name?")
    assert done(events).error is None
    assert resumed.session_id == session_id
    assert of(events, SessionStarted) == []
    sent = fake.user_texts_sent()
    assert "my name is Bob" in sent and sent[-1] == "what is my name?"


async def test_resume_after_close_sends_history(make_agent: MakeAgent, fake: FakeAnthropic) -> None:
    agent = make_agent()
    await run_turn(agent, "remember the number 42")
    session_id = agent.session_id
    await agent.close()
    assert not agent.is_alive()

    resumed = make_agent(session_id)
    events = await run_turn(resumed, "which number?")

    assert of(events, MessageDone)[0].text == "You said: which number?"
    assert resumed.session_id == session_id
    sent = fake.user_texts_sent()
    assert sent[0] == "remember the number 42" and sent[-1] == "which number?"


async def test_resume_unknown_session_starts_fresh(make_agent: MakeAgent) -> None:
    gone = str(uuid.uuid4())
    agent = make_agent(gone)
    events = await run_turn(agent, "hello again")

    assert events[0] == Notice(RESUME_FAILED, level="warning", data={"session_id": gone})
    (started,) = of(events, SessionStarted)
    assert started.session_id != gone and agent.session_id == started.session_id
    assert of(events, MessageDone)[0].text == "You said: hello again"
    assert done(events).error is None


def test_a_resumed_cli_s_cost_starts_from_the_last_cost_state(tmp_path: Path) -> None:
    # The CLI writes a "cost-state" record at each exit; a CLI resuming starts from the last.
    env = {"HOME": str(tmp_path)}
    folder = config_dir(env) / "projects" / "-work"
    folder.mkdir(parents=True)
    records = [
        {"type": "user", "message": {"content": "cost-state"}},  # the word, not the record
        {"type": "cost-state", "sessionId": "s", "totalCostUSD": 0.0126},
        {"type": "assistant", "message": {"content": "hi"}},
        {"type": "cost-state", "sessionId": "s", "totalCostUSD": 0.021},
    ]
    lines = [json.dumps(r, separators=(",", ":")) for r in records]
    (folder / "s.jsonl").write_text("\n".join([*lines, '{"type":"cost-state",']) + "\n")
    assert restored_cost(env, "s") == 0.021  # the last whole one (a torn line is skipped)
    assert restored_cost(env, "other") == 0.0
    (folder / "t.jsonl").write_text("\n".join(lines[:1]) + "\n")
    assert restored_cost(env, "t") == 0.0


async def test_a_request_without_an_answer_is_a_connection_error(
    make_agent: MakeAgent, fake: FakeAnthropic
) -> None:
    """No HTTP status to show: the line says what happened (it read "API error None
    (unknown)" when a CI run's fake dropped a connection)."""
    agent = make_agent(env={"CLAUDE_CODE_MAX_RETRIES": "2"})
    fake.fail(DROP)
    events = await run_turn(agent, "first")

    (retry,) = of(events, Notice)
    assert retry.level == "warning" and retry.data["status"] is None
    assert retry.text == "API connection error, retrying (attempt 1 of 2)"
    assert of(events, MessageDone)[0].text == "You said: first"


async def test_api_errors_become_notices(make_agent: MakeAgent, fake: FakeAnthropic) -> None:
    agent = make_agent(env={"CLAUDE_CODE_MAX_RETRIES": "1"})
    fake.fail(429, 429)
    events = await run_turn(agent, "first")

    retry, final = of(events, Notice)
    assert retry.level == "warning" and retry.data["status"] == 429
    assert retry.text == "API error 429 (rate_limit), retrying (attempt 1 of 1)"
    assert final.level == "error" and final.data["status"] == 429 and "429" in final.text
    assert of(events, MessageDone) == []
    assert done(events).error == final.text

    fake.fail(500)
    events = await run_turn(agent, "second")
    (retry,) = of(events, Notice)
    assert retry.level == "warning" and retry.data["status"] == 500
    assert of(events, MessageDone)[0].text == "You said: second"
    assert done(events).error is None


async def test_auto_compaction_reports_start_and_finish(
    make_agent: MakeAgent, fake: FakeAnthropic
) -> None:
    fake.input_tokens = 70_000
    agent = make_agent(env={"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000"})
    first = await run_turn(agent, "turn 1")
    second = await run_turn(agent, "turn 2")
    third = await run_turn(agent, "turn 3")

    compaction = (CompactionStarted, CompactionFinished, CompactionFailed)
    assert [e for e in first if isinstance(e, compaction)] == []
    assert [e for e in second if isinstance(e, compaction)] == [
        CompactionStarted(),
        CompactionFailed("too_few_groups"),
    ]
    started, finished = [e for e in third if isinstance(e, compaction)]
    assert started == CompactionStarted()
    assert finished.trigger == "auto"
    assert finished.pre_tokens is not None and 70_000 <= finished.pre_tokens <= 70_100
    assert finished.post_tokens is not None and finished.post_tokens > 0
    assert third.index(finished) < third.index(of(third, MessageDone)[0])
    assert of(third, Usage)[-1] == Usage(70_000, MODEL, 1_000_000)
    assert any(SUMMARY_MARKER in json.dumps(b["messages"][-1]) for b in fake.message_bodies())
    usage = await agent.context_usage()
    assert usage is not None
    assert (usage["maxTokens"], usage["autoCompactThreshold"]) == (100_000, 67_000)


async def test_env_is_exactly_spec_env(
    make_agent: MakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OARLOCK_TEST_SECRET", "must-not-leak")
    agent = make_agent(env={"OARLOCK_TEST_VISIBLE": "visible"})
    await agent.start()
    assert agent.pid is not None
    process_env = environ_of(agent.pid)

    assert "OARLOCK_TEST_SECRET" not in process_env
    assert set(process_env) - set(agent.spec.env) <= SDK_VARS
    assert {k: process_env[k] for k in agent.spec.env} == agent.spec.env

    events = await run_turn(agent, "[[BASH:env | grep OARLOCK_TEST]]")
    result = of(events, Activity)[1]
    assert result.output == "OARLOCK_TEST_VISIBLE=visible"


async def test_abandoned_turn_restarts_before_next(make_agent: MakeAgent) -> None:
    agent = make_agent()
    turn = agent.turn("talk [[LONG:400]]")
    async with asyncio.timeout(TURN_TIMEOUT):
        async for event in turn:
            if isinstance(event, TextDelta):
                break
    await turn.aclose()
    first_pid = agent.pid

    events = await run_turn(agent, "fresh start")

    assert of(events, MessageDone)[-1].text == "You said: fresh start"
    assert done(events).error is None
    assert agent.pid != first_pid


async def test_close_is_quick_and_idempotent(make_agent: MakeAgent) -> None:
    agent = make_agent()
    await agent.start()
    async with asyncio.timeout(5):
        await agent.close()
        await agent.close()
    assert not agent.is_alive() and agent.pid is None
    assert await agent.context_usage() is None


# Recorded mapping sequences -------------------------------------------------------------

TOOL = """
{"type":"system","subtype":"init","session_id":"ce4d0fba","model":"claude-opus-5-5","uuid":"51e35ab2"}
{"type":"stream_event","event":{"type":"message_start","message":{"id":"msg_fake_000001","model":"claude-opus-5-5","usage":{"input_tokens":1000}}},"session_id":"ce4d0fba","uuid":"684f6ce0"}
{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}},"session_id":"ce4d0fba","uuid":"dc8775b5"}
{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"I will run the comma"}},"session_id":"ce4d0fba","uuid":"835186c2"}
{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"nd."}},"session_id":"ce4d0fba","uuid":"2b424063"}
{"type":"assistant","message":{"id":"msg_fake_000001","model":"claude-opus-5-5","content":[{"type":"text","text":"I will run the command."}],"usage":{"input_tokens":1000,"output_tokens":10,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}},"session_id":"ce4d0fba","uuid":"a86be7b5"}
{"type":"stream_event","event":{"type":"content_block_stop","index":0},"session_id":"ce4d0fba","uuid":"52eeed49"}
{"type":"stream_event","event":{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_fake_0001","name":"Bash","input":{}}},"session_id":"ce4d0fba","uuid":"b1d28ff9"}
{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\\"command\\": \\"echo hi\\", \\"description\\": \\"Run the requested command\\"}"}},"session_id":"ce4d0fba","uuid":"9c91fd76"}
{"type":"assistant","message":{"id":"msg_fake_000001","model":"claude-opus-5-5","content":[{"type":"tool_use","id":"toolu_fake_0001","name":"Bash","input":{"command":"echo hi","description":"Run the requested command"}}],"usage":{"input_tokens":1000,"output_tokens":10,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}},"session_id":"ce4d0fba","uuid":"f6000d88"}
{"type":"stream_event","event":{"type":"content_block_stop","index":1},"session_id":"ce4d0fba","uuid":"66bd1e2d"}
{"type":"stream_event","event":{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":10}},"session_id":"ce4d0fba","uuid":"93c1d840"}
{"type":"stream_event","event":{"type":"message_stop"},"session_id":"ce4d0fba","uuid":"75ef3508"}
{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_fake_0001","type":"tool_result","content":"hi","is_error":false}]},"session_id":"ce4d0fba","uuid":"8628ccdd"}
{"type":"stream_event","event":{"type":"message_start","message":{"id":"msg_fake_000002","model":"claude-opus-5-5","usage":{"input_tokens":1000}}},"session_id":"ce4d0fba","uuid":"7952a90a"}
{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}},"session_id":"ce4d0fba","uuid":"a83bfd9a"}
{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"The tool returned: h"}},"session_id":"ce4d0fba","uuid":"e7fcf85d"}
{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"i"}},"session_id":"ce4d0fba","uuid":"b6613725"}
{"type":"assistant","message":{"id":"msg_fake_000002","model":"claude-opus-5-5","content":[{"type":"text","text":"The tool returned: hi"}],"usage":{"input_tokens":1000,"output_tokens":10,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}},"session_id":"ce4d0fba","uuid":"85eb7c74"}
{"type":"stream_event","event":{"type":"content_block_stop","index":0},"session_id":"ce4d0fba","uuid":"a87aea60"}
{"type":"stream_event","event":{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":10}},"session_id":"ce4d0fba","uuid":"f2ccfab5"}
{"type":"stream_event","event":{"type":"message_stop"},"session_id":"ce4d0fba","uuid":"481e4159"}
{"duration_api_ms":65,"session_id":"ce4d0fba","total_cost_usd":0.0084,"modelUsage":{"claude-opus-5-5":{"contextWindow":1000000}},"terminal_reason":"completed","is_error":false,"num_turns":2,"subtype":"success","api_error_status":null,"result":"The tool returned: hi","type":"result","duration_ms":193,"uuid":"a6353fb3"}
"""

RATE_LIMITED = """
{"type":"system","subtype":"init","session_id":"ce4d0fba","model":"claude-opus-5-5","uuid":"0ef3b00d"}
{"type":"system","subtype":"api_retry","attempt":1,"max_retries":1,"retry_delay_ms":554,"error_status":429,"error":"rate_limit","session_id":"ce4d0fba","uuid":"b9e87fde"}
{"type":"assistant","message":{"id":"b4ca1841-441d-4578-a118-a6b909e96b7b","model":"<synthetic>","content":[{"type":"text","text":"API Error: Request rejected (429) · fake rate_limit_error (429)"}],"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}},"session_id":"ce4d0fba","uuid":"c7d9b694","error":"rate_limit","api_error_status":429}
{"duration_api_ms":65,"session_id":"ce4d0fba","total_cost_usd":0.0084,"modelUsage":{"claude-opus-5-5":{"contextWindow":1000000}},"terminal_reason":"api_error","is_error":true,"num_turns":1,"subtype":"success","api_error_status":429,"result":"API Error: Request rejected (429) · fake rate_limit_error (429)","type":"result","duration_ms":628,"uuid":"a83bb61e"}
"""

TOO_FEW_GROUPS = """
{"type":"system","subtype":"init","session_id":"ce4d0fba","model":"claude-opus-5-5","uuid":"4d3436ed"}
{"type":"system","subtype":"status","status":"compacting","compact_output_chars":0,"session_id":"ce4d0fba","uuid":"79f85a82"}
{"type":"system","subtype":"status","status":null,"compact_result":"failed","compact_error":"too_few_groups","session_id":"ce4d0fba","uuid":"3358a383"}
{"type":"stream_event","event":{"type":"message_start","message":{"id":"msg_fake_000002","model":"claude-opus-5-5","usage":{"input_tokens":70000}}},"session_id":"ce4d0fba","uuid":"354fe0de"}
{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}},"session_id":"ce4d0fba","uuid":"cd37dbfc"}
{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"You said: turn 2"}},"session_id":"ce4d0fba","uuid":"99604426"}
{"type":"assistant","message":{"id":"msg_fake_000002","model":"claude-opus-5-5","content":[{"type":"text","text":"You said: turn 2"}],"usage":{"input_tokens":70000,"output_tokens":10,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}},"session_id":"ce4d0fba","uuid":"8d89381c"}
{"type":"stream_event","event":{"type":"content_block_stop","index":0},"session_id":"ce4d0fba","uuid":"315b2154"}
{"type":"stream_event","event":{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":10}},"session_id":"ce4d0fba","uuid":"567bc6e9"}
{"type":"stream_event","event":{"type":"message_stop"},"session_id":"ce4d0fba","uuid":"1418a181"}
{"duration_api_ms":35,"session_id":"ce4d0fba","total_cost_usd":0.5604,"modelUsage":{"claude-opus-5-5":{"contextWindow":1000000}},"terminal_reason":"completed","is_error":false,"num_turns":1,"subtype":"success","api_error_status":null,"result":"You said: turn 2","type":"result","duration_ms":41,"uuid":"bb68d6c5"}
"""

COMPACTED = """
{"type":"system","subtype":"init","session_id":"ce4d0fba","model":"claude-opus-5-5","uuid":"e52f95ea"}
{"type":"system","subtype":"status","status":"compacting","compact_output_chars":0,"session_id":"ce4d0fba","uuid":"68983bfa"}
{"type":"system","subtype":"status","status":null,"compact_result":"success","session_id":"ce4d0fba","uuid":"d253b0c7"}
{"type":"system","subtype":"compact_boundary","uuid":"ec2e10ba","compact_metadata":{"trigger":"auto","pre_tokens":70012,"post_tokens":2600,"cumulative_dropped_tokens":67412,"duration_ms":19},"session_id":"ce4d0fba"}
{"type":"user","message":{"role":"user","content":[{"type":"text","text":"This session is being continued from a previous conversation that ran out of context. The summary be…"}]},"session_id":"ce4d0fba","uuid":"cc91e7a7","isSynthetic":true}
{"type":"stream_event","event":{"type":"message_start","message":{"id":"msg_fake_000004","model":"claude-opus-5-5","usage":{"input_tokens":70000}}},"session_id":"ce4d0fba","uuid":"94fac7bb"}
{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}},"session_id":"ce4d0fba","uuid":"2bcbcc3b"}
{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"You said: turn 3"}},"session_id":"ce4d0fba","uuid":"71644e71"}
{"type":"assistant","message":{"id":"msg_fake_000004","model":"claude-opus-5-5","content":[{"type":"text","text":"You said: turn 3"}],"usage":{"input_tokens":70000,"output_tokens":10,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}},"session_id":"ce4d0fba","uuid":"1eb360e2"}
{"type":"stream_event","event":{"type":"content_block_stop","index":0},"session_id":"ce4d0fba","uuid":"62d46c9a"}
{"type":"stream_event","event":{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":10}},"session_id":"ce4d0fba","uuid":"5a83b6ce"}
{"type":"stream_event","event":{"type":"message_stop"},"session_id":"ce4d0fba","uuid":"6c440e43"}
{"duration_api_ms":51,"session_id":"ce4d0fba","total_cost_usd":0.8608,"modelUsage":{"claude-opus-5-5":{"contextWindow":1000000}},"terminal_reason":"completed","is_error":false,"num_turns":2,"subtype":"success","api_error_status":null,"result":"You said: turn 3","type":"result","duration_ms":72,"uuid":"2990d1ce"}
"""

ABORTED = """
{"type":"system","subtype":"init","session_id":"ce4d0fba","model":"claude-opus-5-5","uuid":"f81bbda2"}
{"type":"system","subtype":"status","status":"compacting","compact_output_chars":0,"session_id":"ce4d0fba","uuid":"c4891498"}
{"type":"system","subtype":"status","status":null,"compact_result":"failed","compact_error":"aborted","session_id":"ce4d0fba","uuid":"4f280e05"}
{"type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user]"}]},"session_id":"ce4d0fba","uuid":"eb7c71de"}
{"duration_api_ms":51,"session_id":"ce4d0fba","total_cost_usd":0.8608,"modelUsage":{"claude-opus-5-5":{"contextWindow":1000000}},"terminal_reason":"aborted_streaming","is_error":true,"num_turns":2,"subtype":"error_during_execution","errors":["[ede_diagnostic] result_type=user last_content_type=n/a stop_reason=null"],"type":"result","duration_ms":32,"uuid":"2c158556"}
"""


def feed(mapper: EventMapper, recorded: str) -> list[AgentEvent]:
    lines = [line for line in recorded.splitlines() if line.strip()]
    return [e for line in lines for e in mapper.feed_json(json.loads(line))]


def test_map_tool_turn() -> None:
    events = feed(EventMapper(), TOOL)

    first, second = "msg_fake_000001", "msg_fake_000002"
    assert events == [
        SessionStarted("ce4d0fba"),
        Usage(1000, MODEL),
        TextDelta(first, "I will run the comma"),
        TextDelta(first, "nd."),
        Activity("toolu_fake_0001", "Bash", "call", summary="echo hi"),
        MessageDone(first, "I will run the command."),
        Activity("toolu_fake_0001", "Bash", "result", output="hi"),
        Usage(1000, MODEL),
        TextDelta(second, "The tool returned: h"),
        TextDelta(second, "i"),
        MessageDone(second, "The tool returned: hi"),
        Usage(1000, MODEL, 1_000_000),
        TurnDone(cost_usd=0.0084, duration_ms=193),
    ]


def test_map_rate_limited_turn() -> None:
    mapper = EventMapper()
    feed(mapper, TOOL)
    events = feed(mapper, RATE_LIMITED)

    error = "API Error: Request rejected (429) · fake rate_limit_error (429)"
    retry = {"type": "api_retry", "status": 429, "attempt": 1, "max_retries": 1}
    retry |= {"retry_delay_ms": 554}
    assert events == [
        Notice(
            "API error 429 (rate_limit), retrying (attempt 1 of 1)",
            level="warning",
            data=retry | {"error": "rate_limit"},
        ),
        Notice(error, level="error", data={"status": 429, "error": "rate_limit"}),
        Usage(1000, MODEL, 1_000_000),
        TurnDone(error=error, cost_usd=0.0, duration_ms=628),
    ]


def test_map_compaction_failed_then_compacted() -> None:
    mapper = EventMapper()
    failed = feed(mapper, TOO_FEW_GROUPS)
    compacted = feed(mapper, COMPACTED)

    assert failed == [
        SessionStarted("ce4d0fba"),
        CompactionStarted(),
        CompactionFailed("too_few_groups"),
        Usage(70_000, MODEL),
        TextDelta("msg_fake_000002", "You said: turn 2"),
        MessageDone("msg_fake_000002", "You said: turn 2"),
        Usage(70_000, MODEL, 1_000_000),
        TurnDone(cost_usd=0.5604, duration_ms=41),
    ]
    assert compacted == [
        CompactionStarted(),
        CompactionFinished(
            "auto", pre_tokens=70_012, post_tokens=2600, duration_ms=19, record_id="ec2e10ba"
        ),
        Usage(70_000, MODEL),
        TextDelta("msg_fake_000004", "You said: turn 3"),
        MessageDone("msg_fake_000004", "You said: turn 3"),
        Usage(70_000, MODEL, 1_000_000),
        TurnDone(cost_usd=0.3004, duration_ms=72),
    ]


def test_map_compaction_aborted_by_interrupt() -> None:
    mapper = EventMapper()
    feed(mapper, TOO_FEW_GROUPS + COMPACTED)
    mapper.begin_turn()
    mapper.interrupt_requested = True
    events = feed(mapper, ABORTED)

    assert events == [
        CompactionStarted(),
        CompactionFailed("aborted"),
        Usage(70_000, MODEL, 1_000_000),
        TurnDone(interrupted=True, cost_usd=0.0, duration_ms=32),
    ]


def stream(event: dict[str, Any], parent: str | None = None) -> str:
    line = {"type": "stream_event", "event": event, "session_id": "s", "uuid": "u"}
    return json.dumps(line | {"parent_tool_use_id": parent})


def start(message_id: str) -> str:
    return stream({"type": "message_start", "message": {"id": message_id, "usage": {}}})


def delta(text: str, index: int = 0) -> str:
    event = {"type": "content_block_delta", "index": index}
    return stream(event | {"delta": {"type": "text_delta", "text": text}})


def text_block(index: int) -> str:
    event = {"type": "content_block_start", "index": index}
    return stream(event | {"content_block": {"type": "text", "text": ""}})


def result(subtype: str = "success", **fields: Any) -> str:
    line = {"type": "result", "subtype": subtype, "duration_ms": 5, "duration_api_ms": 4}
    return json.dumps(line | {"is_error": False, "num_turns": 1, "session_id": "s"} | fields)


def test_map_interrupted_stream_keeps_partial_text() -> None:
    interrupted = {"type": "text", "text": "[Request interrupted by user]"}
    user = {"type": "user", "message": {"role": "user", "content": [interrupted]}}
    lines = [start("m1"), delta("half a"), delta(" sentence"), json.dumps(user)]
    ended = result("error_during_execution", is_error=True, terminal_reason="aborted_streaming")

    events = feed(EventMapper("s"), "\n".join([*lines, ended]))

    assert events == [
        TextDelta("m1", "half a"),
        TextDelta("m1", " sentence"),
        MessageDone("m1", "half a sentence"),
        TurnDone(interrupted=True, duration_ms=5),
    ]


def test_map_two_text_blocks_stream_a_separator() -> None:
    lines = [start("m1"), text_block(0), delta("one"), text_block(1), delta("two", 1)]
    events = feed(EventMapper(), "\n".join(lines))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["one", "\n\n", "two"]


def test_map_skips_subagent_messages() -> None:
    lines = [stream({"type": "message_start", "message": {"id": "sub"}}, parent="toolu_1")]
    assert feed(EventMapper(), "\n".join(lines)) == []


def test_map_success_status_without_boundary_finishes_at_result() -> None:
    status = {"type": "system", "subtype": "status", "session_id": "s"}
    lines = [
        json.dumps(status | {"status": "compacting"}),
        json.dumps(status | {"status": None, "compact_result": "success"}),
        result(),
    ]
    events = feed(EventMapper("s"), "\n".join(lines))
    assert events == [CompactionStarted(), CompactionFinished(), TurnDone(duration_ms=5)]


def test_finish_leaves_a_cut_message_to_the_relay() -> None:
    # Its text streamed, its end never came: no MessageDone (the relay keeps what streamed
    # as interrupted), and nothing more of it afterwards.
    mapper = EventMapper()
    feed(mapper, "\n".join([start("m1"), delta("cut off")]))
    assert mapper.finish() == []
    assert feed(mapper, delta("late")) == []


def test_summarize_input_picks_command_or_path() -> None:
    assert summarize_input({"command": "ls -la\necho done", "description": "x"}) == "ls -la"
    assert summarize_input({"file_path": "/tmp/a.py"}) == "/tmp/a.py"
    assert summarize_input({"todos": [1]}) == '{"todos": [1]}'
    # A subagent's call: its description, not the JSON of its whole prompt.
    agent = {"description": "sub task", "prompt": "a long prompt", "subagent_type": "general"}
    assert summarize_input(agent) == "sub task"
    assert summarize_input({}) == ""
    # A plan to approve (ExitPlanMode, with its file as Claude Code adds it): its first line.
    plan = {"plan": "## Plan\n1. Write one.txt", "planFilePath": "/home/me/.claude/plans/p.md"}
    assert summarize_input(plan) == "## Plan"


def test_shorten_says_what_was_cut() -> None:
    assert shorten("abc", 5) == "abc"
    assert shorten("abcdefgh", 5) == "abcde\n… (3 more characters)"


def test_a_status_with_a_permission_mode_says_the_mode() -> None:
    # As the CLI writes it after set_permission_mode, and when an approved plan ends plan mode.
    mapper = EventMapper("s")
    base = {"type": "system", "subtype": "status", "uuid": "u", "session_id": "s"}
    compacting = {"status": "compacting", "permissionMode": "plan"}
    assert [
        mapper.feed_json(base | {"status": None, "permissionMode": "acceptEdits"}),
        mapper.feed_json(base | compacting),
        mapper.feed_json(base | {"status": None, "permissionMode": "auto"}),  # not one of ours
        mapper.feed_json(base | {"status": None}),
    ] == [[ModeChanged("acceptEdits")], [ModeChanged("plan"), CompactionStarted()], [], []]


def test_mapper_tracks_background_tasks_until_they_end() -> None:
    mapper = EventMapper("s")
    base = {"type": "system", "uuid": "u", "session_id": "s"}
    start = {"subtype": "task_started", "description": "npm run dev", "task_type": "local_bash"}
    mapper.feed_json(base | start | {"task_id": "t1"})
    mapper.feed_json(base | start | {"task_id": "t2"})
    mapper.feed_json(
        base | {"subtype": "task_updated", "task_id": "t1", "patch": {"status": "running"}}
    )
    assert mapper.tasks == {"t1", "t2"}
    done = {"subtype": "task_notification", "status": "completed", "output_file": "", "summary": ""}
    mapper.feed_json(base | done | {"task_id": "t1"})
    assert mapper.tasks == {"t2"}
    mapper.feed_json(
        base | {"subtype": "task_updated", "task_id": "t2", "patch": {"status": "killed"}}
    )
    assert mapper.tasks == set()


def test_a_task_s_end_is_a_line_saying_how_it_ended() -> None:
    mapper = EventMapper("s")
    base = {"type": "system", "uuid": "u", "session_id": "s", "output_file": "/tmp/t.output"}
    shell = {"subtype": "task_started", "task_type": "local_bash", "description": "Wait"}
    mapper.feed_json(base | shell | {"task_id": "t1"})
    mapper.feed_json(base | shell | {"task_id": "t2"})
    done = {"subtype": "task_notification", "task_id": "t1", "status": "completed"}
    summary = 'Background command "Wait" completed (exit code 0)'
    assert mapper.feed_json(base | done | {"summary": summary}) == [
        Notice(summary, data={"type": "task", "status": "completed"})
    ]
    failed = done | {"task_id": "t2", "status": "failed"}
    failed |= {"summary": 'Background command "x" failed\nwith\n' * 50}
    (line,) = mapper.feed_json(base | failed)
    assert (line.level, line.data["status"]) == ("warning", "failed")
    assert "\n" not in line.text and len(line.text) <= 301
    # A subagent's summary is its own words (a hostile review saw one read as a shell's
    # line): the line names the task instead.
    started = {"subtype": "task_started", "task_id": "a1", "description": "Helper"}
    mapper.feed_json(base | started | {"task_type": "local_agent"})
    agent = done | {"task_id": "a1", "summary": 'Background command "deploy" completed'}
    assert mapper.feed_json(base | agent)[0].text == 'Background task "Helper" completed'
    unknown = done | {"task_id": "zz", "summary": "words", "status": "stopped"}
    assert mapper.feed_json(base | unknown)[0].text == "A task stopped"


def result_answering(*uuids: str, origin: dict[str, str] | None = None) -> Any:
    """A result message (as the CLI sends it) of a turn that took in these user messages."""
    raw: dict[str, Any] = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "duration_ms": 5,
        "duration_api_ms": 4,
        "num_turns": 1,
        "session_id": "s",
        "result": "ok",
    }
    if uuids:
        raw |= {"user_message_uuid": uuids[-1], "user_message_uuids": list(uuids)}
    if origin is not None:
        raw["origin"] = origin
    return parse_message(raw)


def test_result_of_an_injected_turn_does_not_answer_our_prompt() -> None:
    assert _answers(result_answering("mine"), "mine")
    assert _answers(result_answering("other", "mine"), "mine")  # merged into one turn
    assert not _answers(result_answering("background-notification"), "mine")
    assert _answers(result_answering(), "mine")  # no uuids (older CLI): as before
    # A turn the CLI began itself, naming no message: a background task's end, not ours.
    assert not _answers(result_answering(origin={"kind": "task-notification"}), "mine")
    assert _answers(result_answering(origin={"kind": "human"}), "mine")


@pytest.mark.parametrize(
    ("prompt", "sent"),
    [
        ("/compact keep the plan", " /compact keep the plan"),
        ("/clear", " /clear"),
        ("/compact.x", " /compact.x"),
        ("/context", "/context"),  # the CLI's other commands still run (a line shows them)
        ("/COMPACT y", "/COMPACT y"),  # the CLI's names are case-sensitive: text already
        ("/newline please", "/newline please"),
        ("say /clear", "say /clear"),
    ],
)
def test_only_the_clis_history_commands_are_made_text(prompt: str, sent: str) -> None:
    assert as_text(prompt) == sent
