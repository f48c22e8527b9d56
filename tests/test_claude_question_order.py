"""A permission question stands after what the agent said before its call (real CLI, fake API).

Claude Code writes the call's assistant message, then asks (a control request the SDK hands
over at once, while the messages before it wait to be read and stored). When the writer is
busy, the question used to be stored first: above the text that led to it, as a browser on a
loaded machine showed (tests/test_browser_polish.py saw "user, ask, activity, agent").
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from app.routes.deps import load_conversation
from tests import test_claude_relay as claude_relay
from tests.fake_anthropic import FakeAnthropic
from tests.relay import LiveRelay
from tests.test_claude_relay import TIMEOUT, StartRelay, create_claude, turn, wait_question

# The fixture of test_claude_relay.py: relays on one data dir (home and fake: conftest).
start = claude_relay.start


def test_question_is_stored_after_the_text_before_its_call(
    start: StartRelay, fake: FakeAnthropic
) -> None:
    live: LiveRelay = start()
    supervisor, storage = live.supervisor, live.supervisor.storage
    cid = create_claude(live)
    turn(live, cid, "hello")  # the CLI is warm: the next prompt goes out on the message's commit
    target = Path(live.get(cid)["cwd"]) / "notes.txt"
    requests = len(fake.message_bodies())
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:  # right behind the message's job: the writer stores nothing else
        holding.set()
        release.wait(TIMEOUT)

    async def send() -> None:
        conversation = await storage.read(load_conversation, supervisor, cid)
        storage.submit(supervisor.submit, conversation, f"[[WRITE:{target}|one line]]")
        storage.submit(hold)

    asyncio.run_coroutine_threadsafe(send(), storage.loop).result(10)
    try:
        assert holding.wait(10)
        deadline = time.monotonic() + TIMEOUT
        while len(fake.message_bodies()) == requests:  # the CLI got its prompt and asks
            assert time.monotonic() < deadline, "the CLI never called the API"
            time.sleep(0.01)
        # Without the wait for the call's row, its question is queued behind the turn's first
        # burst while the text waits for that burst to be stored: two jobs behind the hold.
        settle = time.monotonic() + 3
        while storage._jobs.qsize() < 2 and time.monotonic() < settle:
            time.sleep(0.01)
    finally:
        release.set()
    question = wait_question(live, cid)
    view = live.get(cid)
    kinds = [
        "ask" if e["data"].get("type") == "permission" else e["data"].get("type") or e["kind"]
        for e in sorted(view["timeline"], key=lambda e: e["seq"])
    ]
    assert kinds[-4:] == ["user", "agent", "tool", "ask"], kinds
    agent = [e for e in view["timeline"] if e["kind"] == "agent"][-1]
    assert agent["text"] == "I will write the file."
    answer = live.http.post(
        f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": True}
    )
    assert answer.status_code == 200, answer.text
    live.wait_idle(cid, timeout=TIMEOUT)
    assert target.read_text() == "one line"
