"""Where the warm-up hook lives (issue 18): only on a CLI that resumes a session.

The real `claude` CLI against the fake Messages API. A CLI started for a new session is never
warmed up: it gets no UserPromptSubmit hook (every prompt would pay its control round trip),
and a warm-up asked of it sends nothing, so its prompt can never reach the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.agents.base import Notice
from app.agents.claude_code import RESUME_FAILED, ClaudeCodeAgent
from tests import test_claude_code as claude_code
from tests.agent_turns import done, run_turn
from tests.fake_anthropic import FakeAnthropic
from tests.test_claude_warm_up import warm_up_lines

make_agent = claude_code.make_agent
MakeAgent = claude_code.MakeAgent


def count_hook_calls(agent: ClaudeCodeAgent) -> list[str]:
    """Record the prompt of every call the CLI makes to the agent's warm-up hook."""
    calls: list[str] = []
    hook = agent._stop_warm_up

    async def counted(hook_input: Any, tool_use_id: str | None, context: Any) -> Any:
        calls.append(str(hook_input.get("prompt")))
        return await hook(hook_input, tool_use_id, context)

    agent._stop_warm_up = counted  # type: ignore[method-assign]  # read when the CLI starts
    return calls


async def test_a_new_session_cli_has_no_hook_and_refuses_a_warm_up(
    make_agent: MakeAgent, fake: FakeAnthropic, tmp_path: Path
) -> None:
    agent = make_agent()
    calls = count_hook_calls(agent)
    await agent.start()
    events = await run_turn(agent, "a first message")
    assert done(events).error is None
    assert agent.session_id  # a session now exists, but this CLI was not started to resume it
    assert calls == []  # the turn made no hook round trip
    requests = len(fake.requests)

    await agent.warm_up()

    assert len(fake.requests) == requests  # nothing reached the API
    assert warm_up_lines(tmp_path) == []  # nor the CLI: no prompt was sent
    assert calls == []
    events = await run_turn(agent, "a second message")
    assert done(events).error is None
    assert fake.user_texts_sent() == ["a first message", "a second message"]


async def test_a_resumed_cli_has_the_hook_and_warms_up(
    make_agent: MakeAgent, fake: FakeAnthropic, tmp_path: Path
) -> None:
    first = make_agent()
    await first.start()
    await run_turn(first, "remember the word heron")
    session = first.session_id
    await first.close()
    requests = len(fake.requests)

    agent = make_agent(session)
    calls = count_hook_calls(agent)
    await agent.start()
    await agent.warm_up()

    assert len(fake.requests) == requests
    assert calls == [agent._warm_up_prompt]  # the hook saw the warm-up prompt, and stopped it
    assert len(warm_up_lines(tmp_path)) == 1
    await run_turn(agent, "and now?")
    assert calls == [agent._warm_up_prompt, "and now?"]
    assert fake.user_texts_sent() == ["remember the word heron", "and now?"]


async def test_a_resume_that_falls_back_to_a_new_session_is_not_warmed(
    make_agent: MakeAgent, fake: FakeAnthropic, tmp_path: Path
) -> None:
    agent = make_agent("00000000-0000-4000-8000-000000000000")  # no such transcript
    calls = count_hook_calls(agent)
    await agent.start()  # starts afresh, and says so at the next turn
    events = await run_turn(agent, "hello")
    assert done(events).error is None
    assert [e for e in events if isinstance(e, Notice) and e.text == RESUME_FAILED]
    await agent.warm_up()
    assert warm_up_lines(tmp_path) == []
    assert calls == []
    assert fake.user_texts_sent() == ["hello"]
