"""Web Push with two relay nodes (PostgreSQL + Redis started by the test).

A browser subscribes through the node its page came from; the node that runs the
conversation sends the push. A push service accepts it only when it is signed with the key
the browser subscribed with (RFC 8292), so every node must sign with the same key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from py_vapid import Vapid02

from app.cluster.presence import KEY
from tests.fake_push import FakeBrowser, PushLog
from tests.relay import LiveRelay, receive_until
from tests.test_cluster_control import until
from tests.test_cluster_races import LEASE_SECONDS, started_nodes
from tests.test_push import (  # noqa: F401 - service: a fixture
    browser_client,
    page_socket,
    service,
    subscribe,
)


@pytest.fixture
def push_nodes(tmp_path: Path) -> Iterator[tuple[LiveRelay, LiveRelay]]:
    """Nodes x and y that may push to the fake push service on loopback."""
    with started_nodes(tmp_path, LEASE_SECONDS, push_loopback_http=True) as nodes:
        yield nodes


def test_a_push_to_a_browser_subscribed_through_another_node_is_signed_with_its_key(
    push_nodes: tuple[LiveRelay, LiveRelay],
    service: tuple[PushLog, str],  # noqa: F811
) -> None:
    x, y = push_nodes
    log, base = service
    key = x.http.get("/api/push/key").json()["public_key"]  # the browser subscribes with it
    assert y.http.get("/api/push/key").json()["public_key"] == key
    browser = FakeBrowser(f"{base}/push/a")
    with browser_client(x) as client:
        subscribe(client, browser)
    cid = y.create(title="Pushed by y")["id"]
    assert y.send(cid, "hello").status_code == 202  # y runs it, so y pushes its end
    [pushed] = log.wait("/push/a")
    authorization = pushed.headers["authorization"]
    assert authorization.split("k=")[1] == key  # else the push service refuses it
    assert Vapid02.verify(authorization)
    assert browser.decrypt(pushed)["title"] == "Pushed by y"


def until_shared(node: LiveRelay, count: int) -> None:
    """Wait until the node's visible tabs in Redis are count (written just after the echo)."""
    client = redis.Redis.from_url(node.settings.redis_url or "")
    try:
        key = KEY + (node.settings.node_id or "")
        until(lambda: client.scard(key) == count, "the visible tabs never reached Redis")
    finally:
        client.close()


def test_no_push_to_a_browser_whose_visible_page_is_on_another_node(
    push_nodes: tuple[LiveRelay, LiveRelay],
    service: tuple[PushLog, str],  # noqa: F811
) -> None:
    """The page is on x, the turn runs on y: y sees the page is visible and pushes nothing."""
    x, y = push_nodes
    log, base = service
    cookie = x.login()
    looking = FakeBrowser(f"{base}/push/looking")
    away = FakeBrowser(f"{base}/push/away")
    with browser_client(x, cookie) as client:
        subscribe(client, looking)  # first: its push, if any, would go before away's
    with browser_client(x) as client:
        subscribe(client, away)
    cid = y.create(title="Looked at")["id"]
    with page_socket(x, cookie) as ws:  # the looking browser's page, on x
        ws.send(json.dumps({"type": "presence", "visible": True}))
        receive_until(ws, lambda m: m["type"] == "presence")
        until_shared(x, 1)
        assert y.send(cid, "one").status_code == 202
        receive_until(ws, lambda m: m["type"] == "notify" and m["conversation_id"] == cid)
        log.wait("/push/away")
        assert log.to("/push/looking") == []
        # The page is hidden: its browser gets pushes again, wherever the turn runs.
        ws.send(json.dumps({"type": "presence", "visible": False}))
        receive_until(ws, lambda m: m["type"] == "presence")
        until_shared(x, 0)
        assert y.send(cid, "two").status_code == 202
        log.wait("/push/looking")
