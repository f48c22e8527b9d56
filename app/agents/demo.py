"""The built-in demo agent: offline, deterministic, enough to try every part of the relay.

It quotes the message it gets, streamed in a few pieces, and its simulated
context grows every turn, so it compacts on its own once the context passes
its auto-compact threshold. Words in the message trigger the rest:
"use a tool" (a tool call), "ask permission" (a permission question),
"slow" (a long reply, to try Stop), "save a handoff" (a call of the relay's save_handoff
tool; the /handoff command asks for exactly that).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from app.agents.base import (
    Activity,
    AgentEvent,
    AgentSpec,
    CompactionFinished,
    CompactionStarted,
    MessageDone,
    PermissionRequest,
    SessionStarted,
    TextDelta,
    TurnDone,
    Usage,
)
from app.attachments import Image
from app.handoff import NOTE_PREFIX
from app.summary import NEW_REQUEST
from app.tools import SAVE_HANDOFF
from app.unicode_text import isolate
from app.window import COMPACT_BUFFER, parse_env_window

MODEL = "demo"
MODEL_WINDOW = 200_000
BASE_CONTEXT = 9_000
GROWTH_PER_TURN = 12_000
AFTER_COMPACTION = 3_000
DEMO_HANDOFF = {
    "done": "Talked with the demo agent, which quoted every message.",
    "next": "Start fresh with /clear and carry on.",
    "files": ["app/agents/demo.py", "DemoAgent.turn"],
}


class DemoAgent:
    """A deterministic agent that needs no network."""

    def __init__(self, spec: AgentSpec, *, delay: float = 0.04) -> None:
        self.spec = spec
        self.delay = delay
        self.context = spec.context_tokens or BASE_CONTEXT
        self.session_id = spec.session_id or f"demo-{spec.conversation_id}"
        self._interrupted = False
        self._messages = 0

    @property
    def window(self) -> int:
        """The auto-compact window this session runs with."""
        chosen = self.spec.auto_compact_window or parse_env_window(
            self.spec.env.get("CLAUDE_CODE_AUTO_COMPACT_WINDOW")
        )
        return min(chosen or MODEL_WINDOW, MODEL_WINDOW)

    async def start(self) -> None:
        """Nothing to spawn."""

    async def interrupt(self) -> None:
        """Stop the running turn at its next piece."""
        self._interrupted = True

    async def context_usage(self) -> dict[str, Any] | None:
        """Report the window as Claude Code's get_context_usage does."""
        return {
            "maxTokens": self.window,
            "autoCompactThreshold": self.window - COMPACT_BUFFER,
            "autocompactSource": "settings" if self.spec.auto_compact_window else "model-default",
            "totalTokens": self.context,
            "model": MODEL,
            "categories": [],
        }

    def background_work(self) -> bool:
        """The demo never works in the background."""
        return False

    async def close(self) -> None:
        """Nothing to stop."""

    def turn_with_images(
        self, prompt: str, images: Sequence[Image], prompt_id: str | None = None
    ) -> AsyncIterator[AgentEvent]:
        """Answer one prompt; the answer says how many images came with it and of what type."""
        return self.turn(prompt, images)

    async def turn(self, prompt: str, images: Sequence[Image] = ()) -> AsyncIterator[AgentEvent]:
        """Answer one prompt."""
        began = time.monotonic()
        self._interrupted = False
        yield SessionStarted(self.session_id)
        if self.context >= self.window - COMPACT_BUFFER:
            yield CompactionStarted(trigger="auto")
            await asyncio.sleep(self.delay * 10)
            before, self.context = self.context, AFTER_COMPACTION
            summary = (
                f"The demo agent's summary of its first {self._messages} turns: "
                "it quoted each message back."
            )
            yield CompactionFinished(
                trigger="auto", pre_tokens=before, post_tokens=self.context, summary=summary
            )
        # After /compact the prompt carries the summary: act on the new request only.
        lowered = prompt.rsplit(NEW_REQUEST, 1)[-1].lower()
        # ...and on the user's words only, not on a context-watch note after them.
        lowered = lowered.split("\n\n" + NOTE_PREFIX.lower(), 1)[0]
        if "use a tool" in lowered:
            async for event in self._tool("demo-tool", "echo hello", "hello"):
                yield event
        if "ask permission" in lowered:
            decision = await self.spec.ask_permission(
                PermissionRequest("Bash", {"command": "touch demo.txt"}, "demo-permission")
            )
            output = "created demo.txt (not really: this is the demo)"
            async for event in self._tool(
                "demo-permission",
                "touch demo.txt",
                output if decision.allow else decision.message or "Denied by the user.",
                is_error=not decision.allow,
            ):
                yield event
        if "save a handoff" in lowered:
            async for event in self._save_handoff():
                yield event
        pieces = reply_pieces(prompt, slow="slow" in lowered, images=images)
        self._messages += 1
        message_id = f"demo-msg-{self.spec.conversation_id}-{self._messages}"
        written: list[str] = []
        for piece in pieces:
            if self._interrupted:
                break
            await asyncio.sleep(self.delay)
            written.append(piece)
            yield TextDelta(message_id, piece)
        yield MessageDone(message_id, "".join(written))
        self.context += GROWTH_PER_TURN + len(prompt) // 4
        yield Usage(self.context, MODEL, MODEL_WINDOW)
        took = round((time.monotonic() - began) * 1000)
        yield TurnDone(interrupted=self._interrupted, duration_ms=took)  # it costs nothing

    async def _save_handoff(self) -> AsyncIterator[AgentEvent]:
        """Call the relay's save_handoff tool with a handoff of this demo session."""
        tool = next((t for t in self.spec.tools if t.name == SAVE_HANDOFF), None)
        if tool is None:
            return
        tool_id = f"demo-handoff-{self._messages + 1}"
        yield Activity(tool_id, SAVE_HANDOFF, "call", summary="save_handoff")
        result = await tool.call(DEMO_HANDOFF)
        yield Activity(
            tool_id,
            SAVE_HANDOFF,
            "result",
            summary="save_handoff",
            output=result.text,
            is_error=result.is_error,
        )

    async def _tool(
        self, tool_id: str, command: str, output: str, *, is_error: bool = False
    ) -> AsyncIterator[AgentEvent]:
        yield Activity(tool_id, "Bash", "call", summary=command)
        await asyncio.sleep(self.delay)
        yield Activity(tool_id, "Bash", "result", summary=command, output=output, is_error=is_error)


def reply_text(prompt: str, images: Sequence[Image] = ()) -> str:
    """The demo's whole answer to a prompt (and its images)."""
    quoted = " ".join(prompt.split())
    if len(quoted) > 200:
        quoted = quoted[:199] + "…"
    seen = ""
    if images:
        kinds = ", ".join(image.media_type for image in images)
        seen = f"With {len(images)} image{'s' if len(images) > 1 else ''} ({kinds}).\n\n"
    return (
        f"You said: “{isolate(quoted)}”\n\n{seen}"
        "I am the **demo** agent: I run offline and quote what you send. "
        "Try a message with *use a tool*, *ask permission* or *slow*."
    )


def reply_pieces(prompt: str, *, slow: bool = False, images: Sequence[Image] = ()) -> list[str]:
    """The answer cut into the pieces it streams in (many more when slow)."""
    text = reply_text(prompt, images)
    if slow:
        text += "\n\n" + " ".join(f"word{n}" for n in range(1, 201))
    words = text.split(" ")
    size = 1 if slow else max(1, len(words) // 4)
    return [
        " ".join(words[i : i + size]) + (" " if i + size < len(words) else "")
        for i in range(0, len(words), size)
    ]
