"""The owner's side of a lost streaming text: asked on the control channel, it sends it whole.

A real `python -m app serve` node on PostgreSQL + Redis (tests/cluster.py) streams the demo's
slow reply. A node that lost some of its deltas asks with the control message
{"op": "text"} (tests/test_cluster_lost_text.py has that node's side); the test sends it
the same way. The owner must append an "entry" event of the streaming message whose text
is exactly the deltas numbered below it, so that every later delta extends it correctly.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import redis

from app.cluster.events import stream_key
from app.cluster.node import CONTROL
from tests.cluster import cluster
from tests.crash import of_kind


def events(url: str, cid: int) -> list[dict[str, Any]]:
    """Every event of the conversation's stream, unpacked, in seq order."""
    found = []
    for _id, fields in redis.Redis.from_url(url).xrange(stream_key(cid)):
        found += [json.loads(text) for text in fields[b"e"].decode().split("\n")]
    return sorted(found, key=lambda event: event["seq"])


def resent(found: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first "entry" event of a streaming message with some text (the initial has none)."""
    for event in found:
        entry = event.get("entry") or {}
        if event["type"] == "entry" and entry.get("state") == "streaming" and entry.get("text"):
            return event
    return None


def test_the_owner_asked_for_a_streaming_text_appends_it_whole(tmp_path: Path) -> None:
    with cluster(tmp_path) as nodes:
        (owner,) = nodes.start(1)
        cid = owner.create(provider="demo", title="Lost text")
        owner.send(cid, "slow story please")
        owner.wait_for(
            cid, lambda v: any(e["state"] == "streaming" and e["text"] for e in of_kind(v, "agent"))
        )
        message = json.dumps({"op": "text", "cid": cid, "from": "a-node-that-lost-deltas"})
        redis.Redis.from_url(nodes.redis_url).publish(CONTROL, message)
        deadline = time.monotonic() + 30
        while (event := resent(events(nodes.redis_url, cid))) is None:
            assert time.monotonic() < deadline, "no whole text was appended"
            time.sleep(0.05)
        found = events(nodes.redis_url, cid)
    entry_id = event["entry"]["id"]
    before = [
        e["text"]
        for e in found
        if e["type"] == "delta" and e.get("entry_id") == entry_id and e["seq"] < event["seq"]
    ]
    assert event["entry"]["text"] == "".join(before)
    assert before  # some text was streamed before it was asked for
