"""What a node shows of a conversation its owner streams (PostgreSQL + Redis, started here).

A node's live text is the deltas it has read back from Redis, which can lag behind what the
owner has stored: a message the database holds whole is shown whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crash import TIMEOUT
from tests.redis import acl
from tests.relay import LiveRelay
from tests.test_api import has_agent_text
from tests.test_cluster_control import until
from tests.test_cluster_races import LEASE_SECONDS, started_nodes, timeline


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[LiveRelay, LiveRelay]]:
    """Nodes x and y; the demo's slow reply takes about 2 s."""
    with started_nodes(tmp_path, LEASE_SECONDS, demo_delay=0.01) as started:
        yield started


def test_a_message_stored_whole_is_shown_whole_while_the_stream_lags(
    nodes: tuple[LiveRelay, LiveRelay],
) -> None:
    """No node may read the event streams (XREAD forbidden) while y's turn ends: the owner's
    view says the turn is over and shows the stored message whole, not the deltas read so far
    (before: its last words missing, as "done")."""
    _x, y = nodes
    cid = y.create(title="Lagging stream")["id"]
    url = str(y.settings.database_url)
    assert y.send(cid, "slow please").status_code == 202
    y.wait_for(cid, has_agent_text)
    with acl(y.settings.redis_url or "", ["-xread"], ["+xread"]):
        until(
            lambda: timeline(url, cid)[-1][1:3] == ("agent", "done"),
            "the reply was never stored whole",
        )
        view = y.wait_idle(cid, timeout=TIMEOUT)
    stored = timeline(url, cid)[-1][3]
    assert stored.endswith("word200")
    assert [(e["kind"], e["state"], e["text"]) for e in view["timeline"][-1:]] == [
        ("agent", "done", stored)
    ]
