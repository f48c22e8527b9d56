"""Half an emoji (a lone surrogate) or the search's marks in what an agent streams: every
stored text gets U+FFFD for them, the streaming checkpoint's too (found by a review)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from sqlmodel import select

from app.agents.base import AgentEvent, AgentSpec, MessageDone, TextDelta, TurnDone
from app.db import get_session
from app.models import Entry
from app.store import storable
from tests.relay import LiveRelay, make_settings
from tests.stand_in import StandIn

HALF = "cut \ud83d here \ufdd0marked\ufdd1 "


class HalfAnEmoji(StandIn):
    """Streams text holding half an emoji, past a checkpoint, then waits to be let go."""

    def __init__(self, spec: AgentSpec, done: threading.Event) -> None:
        super().__init__(spec)
        self.done = done

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        yield TextDelta("m1", HALF)
        await asyncio.sleep(1.2)  # past CHECKPOINT_SECONDS: the next delta writes the text
        yield TextDelta("m1", "more")
        while not self.done.is_set():  # noqa: ASYNC110 - a test's thread sets it
            await asyncio.sleep(0.02)
        yield MessageDone("m1", HALF + "more")
        yield TurnDone()


def stored_text(relay: LiveRelay, kind: str) -> list[str]:
    with get_session(relay.app.state.engine) as session:
        return [e.text for e in session.exec(select(Entry).where(Entry.kind == kind)).all()]


def test_a_streamed_half_emoji_is_checkpointed_as_a_replacement(tmp_path: Path) -> None:
    done = threading.Event()
    with LiveRelay(make_settings(tmp_path / "data")) as relay:
        relay.supervisor.agent_factory = lambda _p, spec, _s: HalfAnEmoji(spec, done)
        cid = relay.create(title="Halves")["id"]
        relay.send(cid, "go")
        # While it streams: the checkpoint stored the partial text (before: its commit failed,
        # "surrogates not allowed", each second, and nothing of the text was kept).
        checkpointed = [storable(HALF + "more")]
        relay.wait_for(cid, lambda _view: stored_text(relay, "agent") == checkpointed, timeout=20)
        done.set()
        view = relay.wait_idle(cid)
    assert view["timeline"][-1]["text"] == "cut \ufffd here \ufffdmarked\ufffd more"
