"""One relay per data directory (app/single.py): a second `oarlock serve` on it is refused
before it touches the database, and the lock goes with the process, however it ends."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from app.single import LOCK_FILE, lock_error, single_error
from tests.crash import RelayProcess
from tests.test_cli_entry import refused


def test_a_data_directory_is_locked_once(tmp_path: Path) -> None:
    assert lock_error(tmp_path / LOCK_FILE, "here") is None
    problem = lock_error(tmp_path / LOCK_FILE, "here")  # another open of it: as another process
    assert problem is not None
    assert problem.startswith(f"Another oarlock relay (process {os.getpid()}) runs on here: ")


def test_a_sqlite_file_outside_the_data_directory_is_locked_too(tmp_path: Path) -> None:
    elsewhere = tmp_path / "db"
    elsewhere.mkdir()
    database = elsewhere / "shared.db"
    (tmp_path / "a").mkdir()
    assert single_error(tmp_path / "a", None) is None
    (tmp_path / "b").mkdir()
    assert single_error(tmp_path / "b", database) is None
    (tmp_path / "c").mkdir()
    problem = single_error(tmp_path / "c", database)  # its own data, the same database
    assert problem is not None and f"runs on the database {database}: " in problem
    (tmp_path / "d").mkdir()
    assert single_error(tmp_path / "d", tmp_path / "missing" / "x.db") is None  # (no lock)


def answered(view: dict[str, Any]) -> bool:
    return bool(view["turn"]["state"] == "idle" and view["timeline"][-1]["kind"] == "agent")


def test_a_second_relay_on_the_same_data_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """Found by an operator review: a second `oarlock serve` on the same data directory (the
    README's "Port in use" advice: another port) ran its start-up recovery on the running
    relay's database, whose running turn got "The relay restarted…", and then served the
    same conversations with agents of its own."""
    data = tmp_path / "data"
    first = RelayProcess(data).start(OARLOCK_DEMO_DELAY="0.02")
    try:
        cid = first.create(provider="demo", title="Running")
        first.send(cid, "slow story please")
        first.wait_for(cid, lambda v: any(e["state"] == "streaming" for e in v["timeline"]))
        env = {
            "OARLOCK_DATA_DIR": str(data),
            "OARLOCK_TOKEN": "a-token-for-the-second-relay",
            "OARLOCK_PORT": str(first.client.base_url.port),  # (its port: never reached)
            "OARLOCK_WORKSPACE_ROOTS": str(data),
        }
        line = refused(["serve"], env, tmp_path)
        assert first.process is not None
        assert line == (
            f"Another oarlock relay (process {first.process.pid}) runs on the data directory "
            f"{data}: stop it first, or give this one its own OARLOCK_DATA_DIR (and database). "
            "If it is the one you meant to start, it is running already."
        )
        view = first.wait_for(cid, answered)
        lines = [e["text"] for e in view["timeline"] if e["kind"] == "line"]
        assert lines == []  # (before: "The relay restarted while this turn was running; …")
        first.kill(signal.SIGKILL)  # the lock goes with the process: a new start takes it
        first.start()
        assert first.get(cid)["timeline"][-1]["kind"] == "agent"
    finally:
        first.close()


def test_a_second_relay_on_the_same_sqlite_file_is_refused(tmp_path: Path) -> None:
    """Its own data directory, the first relay's database kept elsewhere: refused as well."""
    shared = tmp_path / "db"
    shared.mkdir()
    url = f"sqlite:///{shared / 'oarlock.db'}"
    first = RelayProcess(tmp_path / "first").start(OARLOCK_DATABASE_URL=url)
    try:
        env = {
            "OARLOCK_DATA_DIR": str(tmp_path / "second"),
            "OARLOCK_DATABASE_URL": url,
            "OARLOCK_WORKSPACE_ROOTS": str(tmp_path),
        }
        assert first.process is not None
        assert refused(["serve"], env, tmp_path).startswith(
            f"Another oarlock relay (process {first.process.pid}) runs on the database "
            f"{shared / 'oarlock.db'}: "
        )
    finally:
        first.close()
