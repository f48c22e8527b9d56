"""The lease fence with a real SIGSTOP: an owner node stalled past its lease, then resumed.

Two `python -m app serve` nodes on PostgreSQL + Redis (tests/cluster.py, lease 3 s, the demo
agent). The owner is stopped (SIGSTOP) mid-turn with a message queued behind the turn; the
other node takes the conversation over and answers it; the owner is resumed (SIGCONT). The
stalled node must not begin another turn nor answer as owner: every message answered once.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from tests.cluster import cluster
from tests.crash import TIMEOUT, of_kind


def answers(view: dict[str, Any], text: str) -> int:
    """How many finished answers of the demo to text the timeline holds."""
    return sum(
        1
        for e in of_kind(view, "agent")
        if e["state"] == "done" and f"You said: “{text}" in e["text"]
    )


def streaming(view: dict[str, Any]) -> bool:
    """Whether an agent message is streaming."""
    return any(e["state"] == "streaming" for e in of_kind(view, "agent"))


def test_an_owner_resumed_after_a_takeover_begins_no_turn_and_answers_nothing(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path) as nodes:
        owner, other = nodes.start(2)
        cid = owner.create(provider="demo", title="Stalled owner")
        owner.send(cid, "slow story please")
        owner.wait_for(cid, streaming)  # the owner runs the turn
        owner.send(cid, "queued behind the turn")  # the owner would deliver it next
        assert owner.process is not None
        owner.process.send_signal(signal.SIGSTOP)
        try:
            # The lease lapses; the other node takes over, cuts the turn, answers the queue.
            other.wait_for(cid, lambda v: answers(v, "queued behind the turn") == 1)
        finally:
            owner.process.send_signal(signal.SIGCONT)
        # The resumed node's agent may still stream the rest of the cut turn; then the node
        # reaches its next turn, finds its lease gone, and gives the conversation up. A message
        # sent through it afterwards goes to the owner.
        owner.send(cid, "after the stall")
        view = other.wait_for(
            cid,
            lambda v: (
                answers(v, "after the stall") == 1
                and v["turn"] == {"state": "idle", "queued": 0}
                and not streaming(v)
            ),
            timeout=TIMEOUT,
        )
        # Seen from the resumed node too, once it has settled.
        again = owner.wait_for(cid, lambda v: answers(v, "after the stall") == 1)
    for seen in (view, again):
        users = [u["text"] for u in of_kind(seen, "user")]
        assert sorted(users) == sorted(
            ["slow story please", "queued behind the turn", "after the stall"]
        ), users
        assert answers(seen, "queued behind the turn") == 1
        assert answers(seen, "after the stall") == 1
        assert answers(seen, "slow story please") == 0  # the cut turn: marked, not finished
        assert all(u["state"] == "sent" for u in of_kind(seen, "user")), of_kind(seen, "user")
