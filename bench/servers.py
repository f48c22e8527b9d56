"""The servers benchmarks run in child processes, off the measuring process's core.

    python -m bench.servers relay DATA_DIR --port P --agent stream|noop|usage|real
    python -m bench.servers fake        # the fake Messages API; prints its port

The relay is the real app (`create_app`) served by uvicorn with the settings `oarlock serve`
uses (uvloop, httptools, websockets-sansio); only the agent differs: `stream`, `noop` and
`usage` (it reports a context figure) are bench agents set as
`app.state.supervisor.agent_factory`, `real` keeps the providers'.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import re
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import uvicorn

from app.agents.base import (
    Agent,
    AgentEvent,
    AgentSpec,
    MessageDone,
    TextDelta,
    TurnDone,
    Usage,
)
from app.cli import server_options
from app.config import Settings
from app.main import create_app
from app.migrate import upgrade
from app.providers import make_agent
from app.supervisor import Supervisor
from bench.common import TOKEN
from tests.stand_in import StandIn

DEFAULT_DELTAS = 10_000
FIRST_WAIT = 10.0  # seconds the stream agent waits at most for its first delta's publishing
PROPOSED_INDEX = (  # the index the timeline's state queries need (see bench/README.md)
    "CREATE INDEX IF NOT EXISTS ix_entry_conversation_state_seq"
    " ON entry (conversation_id, state, seq)"
)


class BenchAgent(StandIn):
    """Nothing to start or stop; subclasses say what a turn yields."""


class StreamAgent(BenchAgent):
    """Streams N deltas as fast as the loop runs, each carrying its emission time.

    The prompt says how many ("stream 10000"). Each delta's text is time.perf_counter() at
    the moment it is yielded (CLOCK_MONOTONIC: the clients' processes read the same clock).
    It gives the loop a turn between deltas, as an agent reading a pipe does.

    The message's first delta ("first <time>") comes alone: the relay stores the message's
    entry when it arrives (a database write, 8-113 ms in session 5's runs), and a model's
    next tokens come long after that. The N counted deltas follow once the first is
    published (`published(message_id)`), so they measure the fan-out, not that write
    (bench/fanout.py reports the first delta's delay apart).
    """

    def __init__(
        self, spec: AgentSpec, published: Callable[[int, str], bool] | None = None
    ) -> None:
        super().__init__(spec)
        self.turns = 0
        self.published = published

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Yield the first delta, then (once it is published) the N deltas, then the end."""
        found = re.search(r"\d+", prompt)
        count = int(found[0]) if found else DEFAULT_DELTAS
        self.turns += 1
        message_id = f"bench-{self.spec.conversation_id}-{self.turns}"
        clock = time.perf_counter
        yield TextDelta(message_id, f"first {clock():.7f}")
        deadline = clock() + FIRST_WAIT
        while self.published is not None and clock() < deadline:
            if self.published(self.spec.conversation_id, message_id):
                break
            await asyncio.sleep(0.001)
        for _ in range(count):
            yield TextDelta(message_id, f"{clock():.7f}")
            await asyncio.sleep(0)
        yield MessageDone(message_id, f"{count} deltas")
        yield TurnDone(cost_usd=0.0, duration_ms=0)


class NoopAgent(BenchAgent):
    """Ends every turn at once: the write path without an agent's work."""

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Yield TurnDone only."""
        yield TurnDone()


class UsageAgent(BenchAgent):
    """Replies at once and reports the context figure the prompt names ("usage 60000")."""

    def __init__(self, spec: AgentSpec) -> None:
        super().__init__(spec)
        self.turns = 0

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """Yield a short reply, the Usage (of a 1M window), then TurnDone."""
        found = re.search(r"\d+", prompt)
        self.turns += 1
        yield MessageDone(f"usage-{self.spec.conversation_id}-{self.turns}", "Done.")
        yield Usage(int(found[0]) if found else 1_000, "bench", 1_000_000)
        yield TurnDone()


AGENTS = {"stream": StreamAgent, "noop": NoopAgent, "usage": UsageAgent}


def agent_factory(kind: str, supervisor: Supervisor | None = None) -> Any:
    """An agent_factory for the supervisor: (provider, spec, settings) -> Agent."""
    if kind == "real":
        return make_agent

    def published(conversation_id: int, message_id: str) -> bool:
        """True once the message's entry is stored and its first delta reached the tabs."""
        assert supervisor is not None
        runner = supervisor.runners.get(conversation_id)
        streaming = runner.streaming.get(message_id) if runner is not None else None
        return streaming is not None and (
            bool(streaming.seqs) and supervisor.hub.shown_seq(conversation_id) >= streaming.seqs[0]
        )

    def factory(_provider: str, spec: AgentSpec, _settings: Settings) -> Agent:
        if kind == "stream":
            return StreamAgent(spec, published if supervisor is not None else None)
        return AGENTS[kind](spec)

    return factory


def serve_relay(
    data_dir: Path, port: int, agent: str, extra_index: bool, root: Path | None = None
) -> None:
    """Migrate, build the app, swap the agent factory, serve until SIGINT.

    root: the workspace root (default data_dir); a cluster's nodes share one.
    """
    root = root or data_dir
    workspace = root / "work"
    workspace.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        data_dir=data_dir,
        token=TOKEN,
        workspace_roots=[root],
        default_cwd=workspace,
        port=port,
        log_level="warning",
    )
    upgrade(settings.db_url)
    if extra_index:
        with sqlite3.connect(settings.resolved_data_dir / "oarlock.db") as db:
            db.execute(PROPOSED_INDEX)
    app = create_app(settings)
    app.state.supervisor.agent_factory = agent_factory(agent, app.state.supervisor)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", **server_options(settings))


def serve_fake() -> None:
    """Run the fake Anthropic Messages API until killed; print its port first."""
    from tests.fake_anthropic import FakeAnthropic

    fake = FakeAnthropic().start()
    print(fake.port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.stop()


def main(argv: list[str] | None = None) -> None:
    """Dispatch on the server's name."""
    parser = argparse.ArgumentParser(prog="python -m bench.servers")
    sub = parser.add_subparsers(dest="server", required=True)
    relay = sub.add_parser("relay")
    relay.add_argument("data_dir", type=Path)
    relay.add_argument("--port", type=int, required=True)
    relay.add_argument("--agent", choices=["stream", "noop", "usage", "real"], default="noop")
    relay.add_argument("--extra-index", action="store_true")
    relay.add_argument("--workspace", type=Path, default=None, help="workspace root")
    sub.add_parser("fake")
    args = parser.parse_args(argv)
    if args.server == "relay":
        serve = partial(
            serve_relay, args.data_dir, args.port, args.agent, args.extra_index, args.workspace
        )
        profile = os.environ.get("OARLOCK_BENCH_PROFILE")  # a file: cProfile the relay into it
        if profile:
            cProfile.runctx("serve()", globals(), {"serve": serve}, profile)
        else:
            serve()
    else:
        serve_fake()


if __name__ == "__main__":
    main(sys.argv[1:])
