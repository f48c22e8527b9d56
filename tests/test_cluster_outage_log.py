"""A cluster task's outage is logged once, not a traceback at every try (cluster/outage.py)."""

from __future__ import annotations

import logging

import pytest
import redis
from sqlalchemy.exc import OperationalError

from app.cluster.outage import Outage

log = logging.getLogger("test.outage")


def fail(outage: Outage, error: Exception) -> None:
    try:
        raise error
    except Exception as raised:  # noqa: BLE001 - as the heartbeat's loop does
        outage.failed(raised)


def test_an_outage_is_one_line_until_its_reason_changes_and_one_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="test.outage")
    outage = Outage(log, "the cluster heartbeat")
    down = OperationalError("SELECT 1", {}, Exception("connection refused\nIs the server up?"))
    for _ in range(5):
        fail(outage, down)
    fail(outage, redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379."))
    outage.worked()
    outage.worked()
    assert [r.getMessage() for r in caplog.records] == [
        "the cluster heartbeat failed (tried again until it works): connection refused",
        "the cluster heartbeat failed (tried again until it works): "
        "Error 111 connecting to 127.0.0.1:6379.",
        "the cluster heartbeat works again",
    ]
    assert not any(r.exc_info for r in caplog.records)


def test_an_unexpected_error_keeps_its_traceback_each_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="test.outage")
    outage = Outage(log, "the cluster heartbeat")
    fail(outage, KeyError("bug"))
    fail(outage, KeyError("bug"))
    assert [r.getMessage() for r in caplog.records] == ["the cluster heartbeat failed"] * 2
    assert all(r.exc_info for r in caplog.records)
    outage.worked()
    assert len(caplog.records) == 2  # (no outage to end)
