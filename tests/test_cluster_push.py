"""Web Push with two relay nodes (PostgreSQL + Redis started by the test).

A browser subscribes through the node its page came from; the node that runs the
conversation sends the push. A push service accepts it only when it is signed with the key
the browser subscribed with (RFC 8292), so every node must sign with the same key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from py_vapid import Vapid02

from tests.fake_push import FakeBrowser, PushLog
from tests.relay import LiveRelay
from tests.test_cluster_races import LEASE_SECONDS, started_nodes
from tests.test_push import browser_client, service, subscribe  # noqa: F401 - a fixture


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
