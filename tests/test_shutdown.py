"""SIGTERM: running turns are interrupted, what was streamed is stored, the relay exits 0."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

from bench.reliability import Relay


def streaming(tmp_path: Path) -> Relay:
    """A relay (`python -m app serve`) whose demo turn is streaming a long reply."""
    relay = Relay(tmp_path, demo_delay=0.05)
    client = relay.start()
    cid = client.post("/api/conversations", json={"provider": "demo"}).json()["id"]
    client.post(f"/api/conversations/{cid}/messages", json={"text": "slow please"})
    deadline = time.monotonic() + 20
    while "word3" not in client.get(f"/api/conversations/{cid}").text:
        assert time.monotonic() < deadline, "the reply never streamed"
        time.sleep(0.05)
    client.close()
    return relay


def test_sigterm_stores_streamed_text_and_exits_zero(tmp_path: Path) -> None:
    relay = streaming(tmp_path)
    assert relay.kill(signal.SIGTERM) == 0
    db = sqlite3.connect(relay.data / "oarlock.db")
    rows = db.execute("SELECT kind, state, text FROM entry ORDER BY seq").fetchall()
    turn_active = db.execute("SELECT turn_active FROM conversation").fetchone()[0]
    db.close()
    assert [(kind, state) for kind, state, _ in rows] == [
        ("user", "sent"),
        ("agent", "done"),
        ("line", "done"),
    ]
    assert "word3" in rows[1][2]
    assert "word200" not in rows[1][2]  # cut short, not run to the end
    assert rows[2][2] == "Interrupted: the relay was shut down."
    assert turn_active == 0


def test_a_second_ctrl_c_still_says_the_turn_was_cut(tmp_path: Path) -> None:
    # A self-hoster's review: Ctrl+C twice made uvicorn skip the app's shutdown; the turn it
    # cut had no line, neither the shutdown's nor the crash's, after a restart.
    relay = streaming(tmp_path)
    assert relay.process is not None
    relay.process.send_signal(signal.SIGINT)
    time.sleep(0.05)  # uvicorn is shutting down: the second one forces its exit
    relay.process.send_signal(signal.SIGINT)
    assert relay.process.wait(timeout=60) == 0
    db = sqlite3.connect(relay.data / "oarlock.db")
    lines = db.execute("SELECT text FROM entry WHERE kind = 'line'").fetchall()
    turn_active = db.execute("SELECT turn_active FROM conversation").fetchone()[0]
    db.close()
    assert (lines, turn_active) == ([("Interrupted: the relay was shut down.",)], 0)
