"""A relay as a real child process (`python -m app serve`), to kill with real signals.

It shares make_settings' layout (data_dir/oarlock.db, workspace data_dir/work, the test
token), so a LiveRelay on the same data_dir opens what the killed one left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.relay import TOKEN, free_port

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60  # the longest any wait may take


class RelayProcess:
    """`python -m app serve` on data_dir; start, kill (SIGKILL) and start again."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.workspace = data_dir / "work"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        self.http: httpx.Client | None = None
        self.log = data_dir / "relay.log"

    def start(self, **env: str) -> RelayProcess:
        """Start the relay (extra OARLOCK_* settings as keywords) and wait until it answers."""
        port = free_port()
        environ = {
            **os.environ,
            **self.env,
            "PYTHONPATH": str(ROOT),
            "OARLOCK_TOKEN": TOKEN,
            "OARLOCK_WORKSPACE_ROOTS": str(self.data_dir),
            "OARLOCK_DEFAULT_CWD": str(self.workspace),
            "OARLOCK_LOG_LEVEL": "info",
            **env,
        }
        command = [sys.executable, "-m", "app", "serve", "--port", str(port)]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*command, "--data-dir", str(self.data_dir)],
                cwd=ROOT,
                env=environ,
                stdout=log,
                stderr=log,
            )
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                if self.http.get("/healthz").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the relay did not start: {self.log.read_text()[-3000:]}")
            time.sleep(0.05)

    def kill(self, signum: int = signal.SIGKILL) -> int:
        """Signal the relay process alone (its agent processes are not touched) and reap it."""
        assert self.process is not None and self.http is not None
        self.http.close()
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:  # hung: its threads' stacks into its log, then gone
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            self.process.kill()
            self.process.wait(timeout=TIMEOUT)
            tail = self.log.read_text(errors="replace")[-8000:]
            raise AssertionError(f"the relay did not end on signal {signum}:\n{tail}") from None

    def close(self) -> None:
        """Stop it if it still runs."""
        if self.process is not None and self.process.poll() is None:
            self.kill(signal.SIGTERM)

    @property
    def client(self) -> httpx.Client:
        assert self.http is not None
        return self.http

    def create(self, **body: Any) -> int:
        """Create a conversation; its id."""
        response = self.client.post("/api/conversations", json=body)
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def send(self, cid: int, text: str) -> dict[str, Any]:
        """Post a message; the stored entry."""
        response = self.client.post(f"/api/conversations/{cid}/messages", json={"text": text})
        assert response.status_code == 202, response.text
        return dict(response.json())

    def get(self, cid: int) -> dict[str, Any]:
        """The conversation with its timeline."""
        response = self.client.get(f"/api/conversations/{cid}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_for(self, cid: int, predicate: Any, timeout: float = TIMEOUT) -> dict[str, Any]:
        """Wait until predicate(conversation view) holds."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.get(cid)
            if predicate(view):
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met: {json.dumps(view)[:3000]}")
            time.sleep(0.05)

    def wait_idle(self, cid: int, timeout: float = TIMEOUT) -> dict[str, Any]:
        """Wait until nothing runs and nothing is queued."""
        return self.wait_for(cid, lambda v: v["turn"] == {"state": "idle", "queued": 0}, timeout)


def entry(view: dict[str, Any], entry_id: int) -> dict[str, Any]:
    """One entry of a timeline, by id."""
    return next(e for e in view["timeline"] if e["id"] == entry_id)


def of_kind(view: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The entries of one kind, in order."""
    return [e for e in view["timeline"] if e["kind"] == kind]
