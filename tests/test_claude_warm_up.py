"""The warm-up prompt (issue 18): the real `claude` CLI against the fake Messages API.

A warm-up runs a resumed CLI's prompt path once, stopped by the adapter's UserPromptSubmit
hook: nothing reaches the model, the next turn is answered as usual, and the model never
sees the warm-up. Through the relay, a tab's `warm` does it after starting the agent.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from websockets.sync.client import ClientConnection

from app.agents.claude_code import WARM_UP_REASON, ClaudeCodeAgent
from app.agents.sweep import marker_of
from tests import test_claude_code as claude_code
from tests import test_claude_relay as claude_relay
from tests.agent_turns import done, run_turn
from tests.fake_anthropic import FakeAnthropic
from tests.relay import receive, receive_until
from tests.test_claude_relay import TIMEOUT, StartRelay, agent_pid, create_claude, turn
from tests.test_delivery import held_cli


def marked(marker: str) -> list[int]:
    """The live processes started with a relay's agent marker (its agents)."""
    found = []
    for path in Path("/proc").iterdir():
        try:
            environ = (path / "environ").read_bytes() if path.name.isdigit() else b""
        except OSError:  # gone meanwhile
            continue
        if environ and marker_of(environ) == marker:
            found.append(int(path.name))
    return found


make_agent = claude_code.make_agent
start = claude_relay.start  # home and fake: conftest
MakeAgent = claude_code.MakeAgent


def _transcripts(root: Path) -> list[Path]:
    """The CLI transcripts under root, found while the CLI may be running."""
    for _ in range(100):
        try:
            return list(root.glob("**/.claude/projects/*/*.jsonl"))
        except FileNotFoundError:  # a lock directory the running CLI removed mid-walk
            continue
    return list(root.glob("**/.claude/projects/*/*.jsonl"))


def warm_up_lines(root: Path) -> list[dict[str, object]]:
    """The transcript records of blocked warm-up prompts under root (any session)."""
    found = []
    for path in _transcripts(root):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("type") == "system" and WARM_UP_REASON in str(record.get("content")):
                found.append(record)
    return found


async def test_warm_up_reaches_no_model_and_the_next_turn_is_answered(
    make_agent: MakeAgent, fake: FakeAnthropic, tmp_path: Path
) -> None:
    first = make_agent()
    await first.start()
    await run_turn(first, "remember the word pelican")
    session = first.session_id
    await first.close()
    sent = len(fake.message_bodies())

    agent: ClaudeCodeAgent = make_agent(session)
    await agent.start()
    await agent.warm_up()

    assert len(fake.message_bodies()) == sent  # nothing went to the model
    assert len(warm_up_lines(tmp_path)) == 1  # the CLI ran the prompt, and its hook stopped it
    events = await run_turn(agent, "and now?")
    assert done(events).error is None
    assert fake.user_texts_sent() == ["remember the word pelican", "and now?"]
    assert agent.session_id == session


async def test_no_warm_up_without_a_session(
    make_agent: MakeAgent, fake: FakeAnthropic, tmp_path: Path
) -> None:
    agent = make_agent()
    await agent.start()
    await agent.warm_up()  # nothing to resume: a new session is not started by a warm-up
    assert warm_up_lines(tmp_path) == []
    assert fake.requests == []


def subscribe_and_warm(ws: ClientConnection, cid: int) -> None:
    """Follow the conversation on a new socket, then ask for its warm-up (as a tab does)."""
    assert receive(ws)["type"] == "hello"
    ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
    assert receive(ws)["type"] == "snapshot"
    ws.send(json.dumps({"type": "warm", "conversation_id": cid}))


def test_tab_warm_up_runs_the_prompt_path_before_the_message(
    start: StartRelay, fake: FakeAnthropic, home: Path
) -> None:
    live = start()
    cid = create_claude(live)
    turn(live, cid, "before")  # a session to resume
    live.stop()
    live = start()
    sent = len(fake.message_bodies())
    with live.socket() as ws:
        subscribe_and_warm(ws, cid)
        receive_until(ws, lambda m: m.get("agent") == "ready", timeout=TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while not warm_up_lines(home):
            assert time.monotonic() < deadline, "the warm-up prompt never reached the CLI"
            time.sleep(0.05)
        pid = agent_pid(live, cid)
        assert len(fake.message_bodies()) == sent
    view = turn(live, cid, "after warming")
    assert view["timeline"][-1]["text"] == "You said: after warming"
    assert agent_pid(live, cid) == pid  # the warmed CLI answered
    assert fake.user_texts_sent() == ["before", "after warming"]
    assert len(warm_up_lines(home)) == 1


def test_deleting_a_conversation_while_its_agent_warms_up_stops_that_agent(
    start: StartRelay, fake: FakeAnthropic, home: Path, tmp_path: Path
) -> None:
    # Found by a hostile review: the delete answered 204 while the warm-up went on starting
    # the CLI, which then belonged to no conversation (nothing stopped it until the relay
    # did), and its late "ready" read the deleted conversation on the event loop.
    wrapper, hold = held_cli(tmp_path)  # the CLI waits for the test: it is starting throughout
    hold.touch()
    live = start(claude_cli=str(wrapper))
    cid = create_claude(live)
    with live.socket() as ws:
        assert receive(ws)["type"] == "hello"
        ws.send(json.dumps({"type": "warm", "conversation_id": cid}))
        receive_until(ws, lambda m: m.get("agent") == "starting", timeout=TIMEOUT)
        runner = live.supervisor.runners[cid]
        deleted: list[int] = []
        deleting = threading.Thread(
            target=lambda: deleted.append(live.http.delete(f"/api/conversations/{cid}").status_code)
        )
        deleting.start()
        deleting.join(0.5)  # it waits for the agent being started
        hold.unlink()
        deleting.join(TIMEOUT)
    assert deleted == [204]
    assert cid not in live.supervisor.runners
    assert runner.agent is None  # started, then closed with the conversation
    assert marked(live.supervisor.lifetime.marker) == []  # no CLI left behind
    live.stop()  # (checks that no database call ran on the event loop)


def test_a_warm_up_starts_no_agent_with_settings_nobody_trusted(
    start: StartRelay, fake: FakeAnthropic, tmp_path: Path
) -> None:
    # README and docs/security.md: a warm-up is an agent start like a message's; a .mcp.json
    # that came since the conversation was trusted starts nothing, and the message says why.
    live = start()
    cid = create_claude(live)
    view = turn(live, cid, "before")  # a session to resume
    ran = claude_relay.marking_server(Path(view["cwd"]), tmp_path, "pulled")
    live.stop()
    live = start()
    with live.socket() as ws:
        subscribe_and_warm(ws, cid)
        receive_until(ws, lambda m: m.get("agent") == "starting", timeout=TIMEOUT)
        receive_until(ws, lambda m: m.get("agent") == "asleep", timeout=TIMEOUT)
    assert live.supervisor.runners[cid].agent is None and not ran.exists()
    assert claude_relay.trust_lines(live, cid) == []  # said with the message, not before
    turn(live, cid, "after")
    (line,) = claude_relay.trust_lines(live, cid)
    assert line["data"]["trust"] == [".mcp.json"] and not ran.exists()
    assert fake.user_texts_sent() == ["before"]
