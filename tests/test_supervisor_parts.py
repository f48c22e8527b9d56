"""The Supervisor in parts (issue 15 item 6) and the adapters' shared helpers, as units."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from app.agents.base import AgentSpec, PermissionDecision, PermissionRequest, TurnDone
from app.agents.common import (
    DENIED,
    TurnFlags,
    ask_user,
    exit_status,
    one_line,
    shorten,
    summarize,
)
from app.supervisor import Runner, Supervisor, TurnState
from app.supervisor.base import SupervisorState

ROOT = Path(__file__).resolve().parents[1]


def test_turn_state_is_what_tabs_are_told() -> None:
    assert [state.value for state in TurnState] == ["idle", "running", "compacting"]
    assert TurnState.IDLE == "idle"
    assert json.dumps({"state": TurnState.COMPACTING}) == '{"state": "compacting"}'
    assert Runner(1).state is TurnState.IDLE


def test_each_method_lives_in_one_part() -> None:
    """Two parts defining one name would silently shadow each other in the MRO."""
    parts = [c for c in Supervisor.__mro__ if c not in (object, SupervisorState)]
    seen: dict[str, str] = {}
    for part in parts:
        for name in vars(part):
            if not name.startswith("__"):
                assert name not in seen, f"{name} in {part.__name__} and {seen[name]}"
                seen[name] = part.__name__
    assert {"submit", "_run_turn", "_handle", "_add", "_ensure_agent", "_recover"} <= set(seen)


def test_only_the_supervisor_reads_its_runners() -> None:
    """Routes, the cluster and the rest ask the Supervisor's methods, never a runner."""
    reach = re.compile(r"\.runners\b|\.runner\(|supervisor\._\w")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in (ROOT / "app").rglob("*.py")
        if "supervisor" not in path.relative_to(ROOT / "app").parts[:1]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if reach.search(line)
    ]
    assert offenders == []


def test_exit_status_names_the_signal_that_ended_a_process() -> None:
    assert exit_status(0) == "exit code 0"
    assert exit_status(3) == "exit code 3"
    assert exit_status(-9) == "killed by SIGKILL"
    assert exit_status(-15) == "killed by SIGTERM"
    assert exit_status(-200) == "killed by signal 200"


def test_one_line_and_shorten() -> None:
    assert one_line("  first   line \nsecond") == "first line"
    assert one_line("x" * 10, 5) == "xxxx…"
    assert one_line("   ") == ""
    assert shorten("abc", 2) == "ab\n… (1 more characters)"
    assert shorten("abc") == "abc"


def test_summarize_takes_the_first_key_present() -> None:
    keys = ("command", "path")
    assert summarize({"path": "a.py", "command": "ls  -l\nmore"}, keys) == "ls -l"
    assert summarize({"other": 1}, keys) == '{"other": 1}'
    assert summarize({}, keys) == ""
    assert summarize("plain text", keys) == "plain text"
    assert summarize(None, keys) == ""


def _spec(answer: PermissionDecision | Exception) -> AgentSpec:
    async def ask(request: PermissionRequest) -> PermissionDecision:
        if isinstance(answer, Exception):
            raise answer
        return answer

    return AgentSpec(1, ROOT, None, "default", None, {}, ask)


def test_ask_user_always_explains_a_refusal() -> None:
    request = PermissionRequest("Bash", {"command": "ls"})
    run = asyncio.run
    assert run(ask_user(_spec(PermissionDecision(True)), request)) == PermissionDecision(True)
    assert run(ask_user(_spec(PermissionDecision(False)), request)) == PermissionDecision(
        False, DENIED
    )
    said = PermissionDecision(False, "not now")
    assert run(ask_user(_spec(said), request)) == said
    failed = run(ask_user(_spec(RuntimeError("gone")), request))
    assert failed == PermissionDecision(False, "Could not ask the user: gone")


def test_turn_flags_hand_pending_events_over_once() -> None:
    flags = TurnFlags()
    flags._init_turn_flags()
    assert not (flags._in_turn or flags._stop_early or flags._dirty or flags._closing)
    flags._pending.append(TurnDone())
    assert len(flags._take_pending()) == 1
    assert flags._take_pending() == []


def test_a_question_waits_for_its_call_row_only_until_it_is_stored() -> None:
    async def check() -> None:
        runner = Runner(1)
        waiting = asyncio.create_task(runner.until_call_stored("toolu_1"))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # the call's row is not stored yet
        runner.call_stored("toolu_2")  # another call's row
        await asyncio.sleep(0.01)
        assert not waiting.done()
        runner.call_stored("toolu_1")
        await asyncio.wait_for(waiting, 1)
        assert not runner.call_waiters
        await asyncio.wait_for(runner.until_call_stored("toolu_2"), 1)  # stored before: at once
        with pytest.raises(TimeoutError):  # a call never announced: the caller's timeout
            async with asyncio.timeout(0.01):
                await runner.until_call_stored("toolu_3")
        assert not runner.call_waiters  # nothing left behind

    asyncio.run(check())
