"""Warming in a real Chromium (issue 18): a click or keystroke in the composer starts the agent.

The demo agent has no process: for it "asleep" means the conversation's runner holds no
agent, "ready" that it holds one. Its start is instant, so these tests wrap it in an agent
whose start waits until the test lets it go: "starting…" is seen for sure, not by luck.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, ClassVar

from playwright.sync_api import Page, expect

from app.agents.base import AgentSpec
from app.agents.demo import DemoAgent
from tests.browser import Pages, agent_reply, by_id, own_relay
from tests.relay import LiveRelay


class GatedDemo(DemoAgent):
    """The demo agent, whose start waits for the test's go-ahead."""

    starts: ClassVar[list[int]] = []
    gate: ClassVar[threading.Event] = threading.Event()

    def __init__(self, spec: AgentSpec) -> None:
        super().__init__(spec, delay=0.005)

    async def start(self) -> None:
        """Count the start; wait for the gate (the test sets it from its own thread)."""
        GatedDemo.starts.append(self.spec.conversation_id)
        await asyncio.to_thread(GatedDemo.gate.wait, 60)


def gated(relay: LiveRelay) -> None:
    GatedDemo.starts.clear()
    GatedDemo.gate.clear()
    relay.supervisor.agent_factory = lambda _provider, spec, _settings: GatedDemo(spec)


def agent_state(page: Page) -> Any:
    return by_id(page, "agent-state")


def test_click_in_composer_warms_and_header_shows_asleep_starting_ready(
    relay: LiveRelay, pages: Pages
) -> None:
    gated(relay)
    cid = relay.create(title="Warm me")["id"]
    page = pages.open(relay, f"/c/{cid}")
    expect(by_id(page, "title")).to_have_text("Warm me")  # loaded (the bare page says asleep)
    state = agent_state(page)
    expect(state).to_have_text("asleep")
    expect(state).to_have_attribute("data-state", "asleep")
    assert GatedDemo.starts == []  # opening the conversation (and its focus) did not warm

    by_id(page, "message-input").click()  # the user is about to write
    expect(state).to_have_text("starting…")
    expect(state).to_have_attribute("data-state", "starting")
    GatedDemo.gate.set()
    expect(state).to_have_text("ready")
    assert GatedDemo.starts == [cid]

    box = by_id(page, "message-input")
    box.fill("hello warm agent")
    box.press("Enter")
    expect(agent_reply(page, "hello warm agent")).to_be_visible()
    expect(state).to_have_text("ready")
    assert GatedDemo.starts == [cid]  # the turn used the warmed agent: no second start

    box.fill("a slow one")  # while a turn runs, the header says so (before: "ready")
    box.press("Enter")
    expect(state).to_have_text("working")
    expect(state).to_have_attribute("data-state", "ready")
    by_id(page, "stop-button").click()
    expect(state).to_have_text("ready")
    pages.assert_clean()


def test_typing_warms_and_an_unused_warm_up_falls_asleep(tmp_path: Path, pages: Pages) -> None:
    relay = own_relay(tmp_path, agent_idle_timeout=3.0)
    try:
        gated(relay)
        GatedDemo.gate.set()
        cid = relay.create(title="Type here")["id"]
        page = pages.open(relay, f"/c/{cid}")
        expect(by_id(page, "title")).to_have_text("Type here")  # loaded
        state = agent_state(page)
        expect(state).to_have_text("asleep")
        page.evaluate("document.getElementById('message-input').focus()")  # no click
        assert GatedDemo.starts == []
        page.keyboard.type("x")
        expect(state).to_have_text("ready")
        assert GatedDemo.starts == [cid]
        # Nobody sends: the idle timeout stops the agent again, and the header says so.
        expect(state).to_have_text("asleep", timeout=30_000)
        assert relay.get(cid)["agent"] == "asleep"
        pages.assert_clean()
    finally:
        relay.stop()
