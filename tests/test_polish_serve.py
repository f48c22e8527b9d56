"""`make serve` and `oarlock serve` as a user meets them: real processes, real output."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.crash import TIMEOUT, RelayProcess
from tests.relay import free_port

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "polish-serve-token-0123456789abcdef"
COLOURS = re.compile(r"\x1b\[[0-9;]*m")


class Terminal:
    """The output of a process on a terminal (a pty), read line by line."""

    def __init__(self) -> None:
        self.leader, self.follower = pty.openpty()
        self.buffer = b""

    def line(self) -> str | None:
        """The next line (None: the process closed the terminal)."""
        while b"\n" not in self.buffer:
            try:
                chunk = os.read(self.leader, 4096)
            except OSError:  # EIO: no process holds the terminal any more
                chunk = b""
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return COLOURS.sub("", line.decode().rstrip("\r"))  # (uvicorn colours a terminal's)

    def rest(self) -> list[str]:
        """Every line until the process closes the terminal."""
        lines = []
        while (line := self.line()) is not None:
            lines.append(line)
        if self.buffer:
            lines.append(self.buffer.decode().rstrip("\r"))
        os.close(self.leader)
        return lines


TERMINALS: dict[int, Terminal] = {}  # by process id


def run_serve(
    tmp_path: Path, token: str = TOKEN, **env: str
) -> tuple[list[str], int, subprocess.Popen[bytes]]:
    """Start `python -m app serve` on a terminal, as a user does (the URL with its token is
    printed to a terminal only); its output up to the printed URL, its port, the process."""
    tmp_path.mkdir(parents=True, exist_ok=True)  # (the workspace root)
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OARLOCK_")}
    environ |= {
        "OARLOCK_TOKEN": token,
        "OARLOCK_WORKSPACE_ROOTS": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    command = [sys.executable, "-m", "app", "serve", "--port", str(port)]
    command += ["--data-dir", str(tmp_path / "data")]
    terminal = Terminal()
    process = subprocess.Popen(
        command, cwd=ROOT, env=environ, stdout=terminal.follower, stderr=terminal.follower
    )
    os.close(terminal.follower)
    TERMINALS[process.pid] = terminal
    lines: list[str] = []
    while "?token=" not in (lines[-1] if lines else ""):
        line = terminal.line()
        assert line is not None, f"serve ended before printing its URL: {lines}"
        lines.append(line)
    return lines, port, process


def stop(process: subprocess.Popen[bytes]) -> list[str]:
    """SIGINT, then the rest of the output."""
    process.send_signal(signal.SIGINT)
    rest = TERMINALS.pop(process.pid).rest()
    process.wait(timeout=60)
    return rest


def test_url_is_printed_once_the_server_answers(tmp_path: Path) -> None:
    lines, port, process = run_serve(tmp_path)
    try:
        # Printed after uvicorn listens, and answered at once: no retry needed.
        started = [n for n, line in enumerate(lines) if "Application startup complete" in line]
        assert started and started[0] < len(lines) - 1, lines
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        stop(process)
    assert process.returncode == 0


def test_a_token_with_plus_and_slash_prints_a_url_that_logs_in(tmp_path: Path) -> None:
    # A self-hoster's review: `openssl rand -base64` gives + and /; printed raw, the + came
    # back as a space and the link failed (303 to /login?failed=1).
    token = "q+3/Zk9=abcdefghij+klm="
    lines, port, process = run_serve(tmp_path, token=token)
    try:
        url = lines[-1].strip()
        assert url == f"http://127.0.0.1:{port}/?token=q%2B3%2FZk9%3Dabcdefghij%2Bklm%3D"
        opened = httpx.get(url, follow_redirects=False)
        assert (opened.status_code, opened.headers["location"]) == (303, "/")
        # The start says what it did to the database, without Alembic's set-up lines.
        assert any("Created the database's tables" in line for line in lines), lines
        assert not any("alembic" in line for line in lines), lines
    finally:
        stop(process)


def test_access_log_is_quiet_by_default_and_on_at_debug(tmp_path: Path) -> None:
    outputs, starts = {}, {}
    for level in ("", "debug"):
        env = {"OARLOCK_LOG_LEVEL": level} if level else {}
        starts[level], port, process = run_serve(tmp_path / (level or "default"), **env)
        try:
            for _ in range(3):
                assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
            httpx.get(f"http://127.0.0.1:{port}/?token={TOKEN}")
            if level == "debug":  # a reply rendered: markdown-it's debug lines stay out
                with httpx.Client(
                    base_url=f"http://127.0.0.1:{port}/api",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                ) as api:
                    cid = api.post("/conversations", json={"provider": "demo"}).json()["id"]
                    sent = api.post(f"/conversations/{cid}/messages", json={"text": "hi"})
                    assert sent.is_success, sent.text
                    while api.get(f"/conversations/{cid}").json()["turn"]["state"] != "idle":
                        time.sleep(0.05)
        finally:
            outputs[level] = stop(process)
    assert not [line for line in outputs["debug"] if "markdown_it" in line]
    assert any(line.startswith("DEBUG ") for line in starts["debug"])  # the others' are there
    requests = {
        level: [line for line in out if "HTTP/1.1" in line] for level, out in outputs.items()
    }
    assert requests[""] == []
    assert sum('"GET /healthz HTTP/1.1" 200' in line for line in requests["debug"]) == 3
    assert not any(TOKEN in line for line in requests["debug"])  # redacted (app/logs.py)


def test_make_serve_installs_with_progress_not_quietly(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    dry = subprocess.run(
        ["make", "-n", "serve", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stderr
    installs = [
        line for line in dry.stdout.splitlines() if "pip install" in line and " -e " in line
    ]
    assert installs and all(" -q" not in line for line in installs), installs
    assert any("takes a few minutes" in line for line in dry.stdout.splitlines())


def test_make_serve_takes_oarlocks_variables_and_its_own_not_a_stray_port() -> None:
    # A fresh-clone walkthrough: OARLOCK_PORT was ignored by `make serve` (it always passed
    # --port 8000), while a PORT set for some other program was taken.
    def served(*make_args: str, **env: str) -> str:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OARLOCK_", "MAKE"))}
        base = {k: v for k, v in base.items() if k not in ("HOST", "PORT", "DATA")}
        dry = subprocess.run(
            ["make", "-n", "serve", *make_args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=base | env,
        )
        assert dry.returncode == 0, dry.stderr
        return dry.stdout.splitlines()[-1].split(" serve ")[1]

    assert served() == "--host 127.0.0.1 --port 8000 --data-dir ./data"
    oarlock = {"OARLOCK_HOST": "0.0.0.0", "OARLOCK_PORT": "9000", "OARLOCK_DATA_DIR": "/srv/x"}
    assert served(**oarlock) == "--host 0.0.0.0 --port 9000 --data-dir /srv/x"
    assert served(HOST="example", PORT="5555", DATA="/y") == served()
    assert served("PORT=7000", "DATA=/z", **oarlock) == "--host 0.0.0.0 --port 7000 --data-dir /z"


def test_sigusr1_prints_every_threads_stack_and_the_relay_goes_on(tmp_path: Path) -> None:
    # A relay that hung at shutdown in a CI run said nothing of where: now it can be asked.
    relay = RelayProcess(tmp_path / "data").start()
    try:
        assert relay.process is not None
        relay.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + TIMEOUT
        # Every thread's stack, the loop's in the server among them.
        while "uvicorn/server.py" not in relay.log.read_text(errors="replace"):
            assert time.monotonic() < deadline, "no stacks in the log"
            time.sleep(0.05)
        assert "most recent call first" in relay.log.read_text(errors="replace")
        assert relay.client.get("/healthz").status_code == 200
    finally:
        relay.close()
