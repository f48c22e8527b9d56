"""The Supervisor's runners are added by storage threads while the loop goes through them."""

from __future__ import annotations

import asyncio
import sys
import threading

from app.supervisor import Supervisor
from tests.relay import LiveRelay

FIRST = 1_000_000  # far above the ids the relay's own conversations get


def adding_runners(supervisor: Supervisor, stop: threading.Event) -> None:
    """Add and drop runners as a message's storage job does (its wake-up creates one)."""
    cid = FIRST
    while not stop.is_set():
        for _ in range(2_000):
            supervisor.runner(cid)
            cid += 1
        for old in range(cid - 2_000, cid):
            supervisor.runners.pop(old, None)


def test_the_budget_check_goes_through_runners_while_a_thread_adds_some(relay: LiveRelay) -> None:
    # Until the fix, _fit_budget iterated the dict itself: "dictionary changed size during
    # iteration", and the agent of the message that asked for room did not start.
    supervisor = relay.supervisor
    for cid in range(FIRST - 20_000, FIRST):  # enough runners that one pass takes a while
        supervisor.runner(cid)
    stop = threading.Event()
    adder = threading.Thread(target=adding_runners, args=(supervisor, stop), daemon=True)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often: a pass over the dict is interrupted
    adder.start()

    async def check_budget() -> None:
        for _ in range(20):  # (the old code failed at the first pass, six times of six)
            await supervisor._fit_budget(incoming=True)
            await asyncio.sleep(0)

    try:
        asyncio.run_coroutine_threadsafe(check_budget(), supervisor.storage.loop).result(120)
    finally:
        stop.set()
        adder.join(10)
        sys.setswitchinterval(switch)
    assert len(supervisor.runners) >= 20_000
