"""Agent processes end with the relay, and a restart kills what a crashed relay left running.

The relay runs as a real `python -m app serve` subprocess in its own process group; it is
killed with SIGKILL alone (never its group), as a crash or the OOM killer would. The agents
are the real `claude` CLI against tests/fake_anthropic.py and the real Copilot CLI against
tests/fake_openai.py. Processes are watched through /proc as (pid, start time) pairs, so a
reused pid never counts as a survivor.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.agents.claude_code import stderr_reason
from app.agents.lifetime import WATCHER, Lifetime, data_key, reap_leftovers, relay_marker
from app.agents.sweep import RELAY_ENV, is_leftover, marker_of
from app.providers import ROOT_BYPASS
from app.supervisor import REDELIVERED_LINE, SHUTDOWN_LINE
from tests.fake_anthropic import FakeAnthropic
from tests.fake_openai import FakeOpenAI
from tests.relay import TOKEN, LiveRelay, free_port, make_settings

PROJECT = Path(__file__).resolve().parents[1]
TIMEOUT = 60  # the longest a relay or an agent may take to get somewhere
GONE_WITHIN = 15  # a generous bound for a killed process to be gone (issue 12 saw 35 s)
ROOT_REFUSAL = "--dangerously-skip-permissions cannot be used with root/sudo privileges"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

Proc = tuple[int, int]  # (pid, start time): one process, never a later one with its pid


# /proc, read independently of the code under test ---------------------------------------


def stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def proc(pid: int) -> Proc:
    fields = stat_fields(pid)
    assert fields is not None, f"process {pid} is not running"
    return pid, int(fields[19])


def alive(process: Proc) -> bool:
    """True while this very process runs (a zombie has ended; a reused pid is another)."""
    fields = stat_fields(process[0])
    return fields is not None and fields[0] not in "ZX" and int(fields[19]) == process[1]


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[Proc]:
    found: list[Proc] = []
    for child in children(pid):
        if fields := stat_fields(child):  # (unless it just ended)
            found += [(child, int(fields[19])), *descendants(child)]
    return found


def command(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return [""]


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def wait_gone(processes: list[Proc], what: str) -> None:
    wait_until(lambda: not any(alive(p) for p in processes), what, GONE_WITHIN)


def kill_all(processes: list[Proc]) -> None:
    for process in processes:
        if alive(process):
            os.kill(process[0], signal.SIGKILL)


# a relay as a real process ------------------------------------------------------------------


class RelayProcess:
    """`python -m app serve` on a data directory, in a process group of its own."""

    def __init__(self, data_dir: Path, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.env = env | {
            "OARLOCK_PORT": str(self.port),
            "OARLOCK_DATA_DIR": str(data_dir),
            "OARLOCK_WORKSPACE_ROOTS": str(data_dir),
            "OARLOCK_DEFAULT_CWD": str(data_dir / "work"),
            "OARLOCK_TOKEN": TOKEN,
            "OARLOCK_LOG_LEVEL": "warning",
            "PYTHONPATH": str(PROJECT),
        }
        (data_dir / "work").mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app", "serve"],
                cwd=PROJECT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        wait_until(self._answers, f"the relay did not start (see {log})")

    def _answers(self) -> bool:
        assert self.process.poll() is None, "the relay exited"
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def conversation(self, **body: Any) -> int:
        response = self.http.post("/api/conversations", json=body)
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def send(self, cid: int, text: str) -> None:
        response = self.http.post(f"/api/conversations/{cid}/messages", json={"text": text})
        assert response.status_code == 202, response.text

    def view(self, cid: int) -> dict[str, Any]:
        response = self.http.get(f"/api/conversations/{cid}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def agent(self, program: str) -> Proc:
        """The relay's child process running program (waits until there is one)."""
        found: list[int] = []

        def spawned() -> bool:
            found[:] = [c for c in children(self.process.pid) if program in command(c)[0]]
            return bool(found)

        wait_until(spawned, f"no {program} process under the relay")
        return proc(found[0])

    def crash(self) -> None:
        """SIGKILL the relay process alone, as the OOM killer would."""
        self.process.kill()
        self.process.wait()
        self.http.close()

    def stop(self) -> None:
        self.http.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def anthropic() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


def outer_env() -> dict[str, str]:
    """The test's environment without what would change what the relay or the CLIs do."""
    drop = ("OARLOCK_", "ANTHROPIC_", "CLAUDE_", "DEEPSEEK_", "COPILOT_", "IS_SANDBOX")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@pytest.fixture
def claude_env(tmp_path: Path, anthropic: FakeAnthropic) -> dict[str, str]:
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    return outer_env() | {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": anthropic.base_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_TMPDIR": str(home / "tmp"),
    }


class Relays:
    """Starts relays on one data directory; remembers the agent processes seen."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[RelayProcess] = []
        self.spawned: list[Proc] = []

    def __call__(self, env: dict[str, str]) -> RelayProcess:
        relay = RelayProcess(self.tmp_path / "data", env, self.tmp_path / "relay.log")
        self.started.append(relay)
        return relay

    def stop(self) -> None:
        """Stop every relay and kill whatever they started that still runs."""
        for relay in self.started:
            if relay.process.poll() is None:
                self.spawned += descendants(relay.process.pid)
            relay.stop()
        kill_all(self.spawned)


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[Relays]:
    """Relays on tmp_path/data; every one, and whatever they started, ends with the test."""
    started = Relays(tmp_path)
    try:
        yield started
    finally:
        started.stop()


def wait_request(fake: FakeAnthropic | FakeOpenAI, text: str) -> None:
    """Wait until the fake API got a request carrying text (the CLI waits on its reply)."""
    wait_until(lambda: any(text in str(r.body) for r in fake.requests), f"no request with {text}")


# the Claude Code CLI ------------------------------------------------------------------------


def waiting_turn(
    relays: Relays, env: dict[str, str], anthropic: FakeAnthropic
) -> tuple[RelayProcess, int, Proc]:
    """A relay whose Claude Code turn waits on the API: the relay, the conversation, the CLI."""
    relay = relays(env)
    cid = relay.conversation(provider="claude")
    relay.send(cid, "wait for me [[SLOW:600]]")
    wait_request(anthropic, "wait for me")
    cli = relay.agent("claude")
    relays.spawned.append(cli)
    return relay, cid, cli


def test_claude_cli_dies_with_a_killed_relay(
    relays: Relays, claude_env: dict[str, str], anthropic: FakeAnthropic
) -> None:
    relay, _, cli = waiting_turn(relays, claude_env, anthropic)

    relay.crash()

    wait_gone([cli], "the Claude Code CLI outlived the relay")


def test_ctrl_c_in_the_relay_s_terminal_stops_the_relay_before_its_agents(
    relays: Relays, claude_env: dict[str, str], anthropic: FakeAnthropic
) -> None:
    """Ctrl+C in a terminal signals its whole foreground process group: the relay's alone.

    Before, the CLIs shared the relay's group: they got the SIGINT too and ended their turn
    themselves, and the turn said "The Claude Code process exited unexpectedly (exit code 0)."
    (or "Interrupted by the user.") instead of the shutdown line.
    """
    relay, cid, cli = waiting_turn(relays, claude_env, anthropic)
    assert os.getpgid(cli[0]) != relay.process.pid

    os.killpg(relay.process.pid, signal.SIGINT)  # the relay leads its group (process_group=0)
    assert relay.process.wait(TIMEOUT) == 0
    wait_gone([cli], "the Claude Code CLI outlived the relay")

    lines = [e["text"] for e in relays(claude_env).view(cid)["timeline"] if e["kind"] == "line"]
    assert SHUTDOWN_LINE in lines, lines
    assert "Interrupted by the user." not in lines, lines


def hold_once(cwd: Path, word: str, marker: Path) -> None:
    """A project hook, as a user may have: the first prompt with word waits in it (the CLI runs
    UserPromptSubmit hooks before it records the prompt); the marker says it began."""
    script = f'[ -e "{marker}" ] || {{ grep -q "{word}" && touch "{marker}" && sleep 60; }}; exit 0'
    hook = {"type": "command", "command": script}
    settings = {"hooks": {"UserPromptSubmit": [{"hooks": [hook]}]}}
    (cwd / ".claude").mkdir(parents=True, exist_ok=True)
    (cwd / ".claude" / "settings.json").write_text(json.dumps(settings))


def test_a_message_the_cli_had_not_recorded_at_shutdown_is_delivered_after_the_restart(
    relays: Relays, claude_env: dict[str, str], anthropic: FakeAnthropic, tmp_path: Path
) -> None:
    """Stopped before the CLI recorded its prompt, a turn never reached the model: the next
    start asks the CLI's record and delivers the message again, as after a crash (a hostile
    review saw it marked "Interrupted: the relay was shut down." and never answered)."""
    marker = tmp_path / "in-hook"
    hold_once(tmp_path / "data" / "work", "hold me", marker)
    relay = relays(claude_env)
    cid = relay.conversation(provider="claude", trust_project=True)  # the user's own hook
    relay.send(cid, "hold me")
    wait_until(marker.exists, "the hook never ran")
    relays.spawned += descendants(relay.process.pid)

    relay.process.terminate()
    assert relay.process.wait(TIMEOUT) == 0

    after = relays(claude_env)
    wait_until(
        lambda: "You said: hold me" in texts(after.view(cid), "agent"), "never delivered again"
    )
    assert REDELIVERED_LINE in texts(after.view(cid), "line")
    assert SHUTDOWN_LINE not in texts(after.view(cid), "line")


def test_a_turn_whose_agent_was_starting_at_shutdown_sends_nothing_until_the_restart(
    relays: Relays, claude_env: dict[str, str], anthropic: FakeAnthropic
) -> None:
    """The relay stopped while a message's CLI started (cold): once started, the CLI is sent
    nothing (no turn begins once the relay is stopping); the next start delivers it."""
    relay = relays(claude_env)
    cid = relay.conversation(provider="claude")
    relay.send(cid, "started late")
    relay.agent("claude")  # the CLI is starting (it takes ~1 s here)
    relays.spawned += descendants(relay.process.pid)

    relay.process.terminate()
    assert relay.process.wait(TIMEOUT) == 0
    assert not any("started late" in str(r.body) for r in anthropic.requests)

    after = relays(claude_env)
    wait_until(
        lambda: "You said: started late" in texts(after.view(cid), "agent"), "never delivered"
    )
    assert texts(after.view(cid), "line") == [REDELIVERED_LINE]


def texts(view: dict[str, Any], kind: str) -> list[str]:
    return [str(entry["text"]) for entry in view["timeline"] if entry["kind"] == kind]


def start_tool_command(relay: RelayProcess) -> tuple[Proc, list[Proc]]:
    """Have Claude Code run a command that never ends; return the CLI and the tool's processes."""
    cid = relay.conversation(provider="claude", permission_mode="default")
    relay.send(cid, "[[BASH:tail -f /dev/null]]")

    def asked() -> bool:
        pending = [e for e in relay.view(cid)["timeline"] if e["state"] == "pending"]
        for question in pending:
            path = f"/api/conversations/{cid}/permissions/{question['id']}"
            assert relay.http.post(path, json={"allow": True}).status_code == 200
        return bool(pending)

    wait_until(asked, "the Bash tool never asked for permission")
    cli = relay.agent("claude")
    wait_until(
        lambda: any(command(p[0])[:2] == ["tail", "-f"] for p in descendants(cli[0])),
        "the tool command never started",
    )
    tools = descendants(cli[0])  # the shell and `tail`, in a session of their own
    return cli, tools


def test_tool_commands_die_with_a_killed_relay(
    relays: Relays, claude_env: dict[str, str], anthropic: FakeAnthropic
) -> None:
    relay = relays(claude_env)
    cli, tools = start_tool_command(relay)
    relays.spawned.extend([cli, *tools])

    relay.crash()

    wait_gone([cli], "the Claude Code CLI outlived the relay")
    wait_gone(tools, "the tool commands outlived the relay")


def test_restart_kills_what_a_killed_relay_and_its_watcher_left(
    relays: Relays, claude_env: dict[str, str], anthropic: FakeAnthropic
) -> None:
    relay = relays(claude_env)
    (watcher,) = [c for c in children(relay.process.pid) if str(WATCHER) in command(c)]
    cli, tools = start_tool_command(relay)
    relays.spawned.extend([cli, *tools])

    os.kill(watcher, signal.SIGKILL)  # as `kill -9` of everything the relay started would
    relay.crash()
    wait_gone([cli], "the Claude Code CLI outlived the relay")
    assert all(alive(p) for p in tools)  # nothing left to kill them
    relays(claude_env)  # a new relay on the same data directory

    wait_gone(tools, "the restarted relay left the tool commands running")


@pytest.mark.skipif(os.geteuid() != 0, reason="the CLI refuses bypassPermissions only as root")
def test_bypass_permissions_as_root_is_refused_up_front_unless_sandboxed(
    tmp_path: Path, claude_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in os.environ.keys() - claude_env.keys():
        monkeypatch.delenv(name)  # the relay's agents get its environment
    for name, value in claude_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("IS_SANDBOX", "1")  # not passed to agents unless named
    live = LiveRelay(make_settings(tmp_path / "data")).start()
    try:
        refused = live.http.post(
            "/api/conversations",
            json={"provider": "claude", "permission_mode": "bypassPermissions"},
        )
        assert refused.status_code == 409 and refused.json()["detail"] == ROOT_BYPASS
        cid = live.create(provider="claude", permission_mode="default")["id"]
        changed = live.http.patch(
            f"/api/conversations/{cid}", json={"permission_mode": "bypassPermissions"}
        )
        assert changed.status_code == 409 and changed.json()["detail"] == ROOT_BYPASS
        assert live.get(cid)["permission_mode"] == "default"
        imported = live.http.post(
            "/api/claude-sessions/0b0e7a35-9d63-4c39-8a33-4d5f1c2a9e10/import",
            json={"permission_mode": "bypassPermissions"},
        )
        assert imported.status_code == 409 and imported.json()["detail"] == ROOT_BYPASS
        demo = live.create(provider="demo", permission_mode="bypassPermissions")  # no CLI
        assert demo["permission_mode"] == "bypassPermissions"
        # What the page marks unavailable up front (test_browser_mode.py).
        providers = live.http.get("/api/providers").json()["providers"]
        refused = {p["id"]: p["refused_modes"] for p in providers}
        bypass = {"bypassPermissions": ROOT_BYPASS}
        others: dict[str, str] = {}
        assert refused == {
            "claude": bypass,
            "deepseek": bypass,
            "copilot": others,
            "openai": others,
            "demo": others,
        }
    finally:
        live.stop()
    # As the refusal says: in a sandbox, IS_SANDBOX=1 passed to the agent.
    sandboxed = make_settings(tmp_path / "data", agent_env_passthrough="IS_SANDBOX")
    live = LiveRelay(sandboxed).start()
    try:
        cid = live.create(provider="claude", permission_mode="bypassPermissions")["id"]
        assert live.send(cid, "hello").status_code == 202
        view = live.wait_idle(cid, timeout=TIMEOUT)
        assert [e["text"] for e in view["timeline"]] == ["hello", "You said: hello"]
    finally:
        live.stop()
    # The relay started again without it: the CLI's own reason, not the SDK's.
    live = LiveRelay(make_settings(tmp_path / "data")).start()
    try:
        assert live.send(cid, "again").status_code == 202
        view = live.wait_idle(cid, timeout=TIMEOUT)
    finally:
        live.stop()
    lines = [e for e in view["timeline"] if e["kind"] == "line"]
    assert len(lines) == 1, view["timeline"]
    assert lines[0]["text"].startswith("The agent could not start: ")
    assert ROOT_REFUSAL in lines[0]["text"]
    assert "Check stderr" not in lines[0]["text"]


# the Copilot CLI (SDK engine) ---------------------------------------------------------------


def test_copilot_cli_dies_with_a_killed_relay(
    relays: Relays, cli: str, shared_home: Path, tmp_path: Path
) -> None:
    with FakeOpenAI() as fake:
        relay = relays(
            outer_env()
            | {
                "HOME": str(shared_home),
                "OARLOCK_COPILOT_CLI": cli,
                "OARLOCK_OPENAI_BASE_URL": fake.base_url,
                "OARLOCK_OPENAI_API_KEY": "sk-test",
                "OARLOCK_OPENAI_MODEL": "gpt-4.1",
            }
        )
        cid = relay.conversation(provider="openai")
        relay.send(cid, "wait for me [[SLOW:600]]")
        wait_request(fake, "wait for me")
        copilot = relay.agent("copilot")
        relays.spawned.append(copilot)
        spawned = descendants(copilot[0])
        relays.spawned.extend(spawned)
        # The Copilot CLI exits when its stdin closes, if it is well enough to notice: hold a
        # writer on that pipe, so that only the kernel's parent-death signal can end it.
        holder = os.open(f"/proc/{copilot[0]}/fd/0", os.O_WRONLY)

        try:
            relay.crash()
            wait_gone([copilot], "the Copilot CLI outlived the relay")
        finally:
            os.close(holder)
        if spawned:  # whatever the CLI started itself goes at the next start
            relays(relay.env)
            wait_gone(spawned, "the restarted relay left the Copilot CLI's children running")


# the two layers, on plain processes ---------------------------------------------------------


def test_wrapped_command_dies_with_its_parent(tmp_path: Path) -> None:
    """A parent that SIGKILLs... is killed: the command it started through the wrapper goes."""
    code = (
        "import subprocess, sys, time\n"
        "from app.agents.lifetime import die_with_relay\n"
        "child = subprocess.Popen(die_with_relay(['sleep', '600']))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=PROJECT,
        env=os.environ | {"PYTHONPATH": str(PROJECT)},
        stdout=subprocess.PIPE,
        text=True,
    ) as parent:
        try:
            assert parent.stdout is not None
            child = proc(int(parent.stdout.readline()))
            wait_until(lambda: command(child[0])[0] == "sleep", "the wrapper never exec'd sleep")
            parent.kill()
            parent.wait()
            wait_gone([child], "the wrapped command outlived its parent")
        finally:
            parent.kill()


def test_reap_kills_only_leftovers_of_this_data_directory(tmp_path: Path) -> None:
    data, other = tmp_path / "data", tmp_path / "other"
    with subprocess.Popen(["true"]) as ended:
        gone = proc(ended.pid)  # a relay that has ended: its pid and start time
    key, me = data_key(data), proc(os.getpid())
    markers = {
        "dead relay": f"{key} {gone[0]} {gone[1]} x",
        "reused pid": f"{key} {me[0]} {me[1] + 1} x",  # this pid, but another process's start
        "live relay": relay_marker(data),  # this process is its relay, and it runs
        "other data dir": f"{data_key(other)} {gone[0]} {gone[1]} x",
        "unmarked": None,
    }
    sleepers = {
        name: subprocess.Popen(["sleep", "600"], env={RELAY_ENV: marker} if marker else {})
        for name, marker in markers.items()
    }
    procs = {name: proc(sleeper.pid) for name, sleeper in sleepers.items()}
    try:
        killed = reap_leftovers(data)
        assert sorted(killed) == sorted(procs[n][0] for n in ("dead relay", "reused pid"))
        wait_gone([procs["dead relay"], procs["reused pid"]], "reaped processes still run")
        assert all(alive(procs[n]) for n in ("live relay", "other data dir", "unmarked"))
    finally:
        for sleeper in sleepers.values():
            sleeper.kill()
            sleeper.wait()


def test_marker_parsing() -> None:
    environ = b"HOME=/h\0OARLOCK_RELAY=abc 12 34 x\0PATH=/bin\0"
    assert marker_of(environ) == "abc 12 34 x"
    assert marker_of(b"HOME=/h\0XOARLOCK_RELAY=abc 1 2 x\0") is None
    assert marker_of(b"") is None
    for broken in (None, "", "abc", "abc 12 34", "abc x 34 x", "abc 12 34 56 x"):
        assert not is_leftover(broken, "abc")
    assert not is_leftover("abd 1 2 x", "abc")
    assert is_leftover("abc 1 2 x", "abc")  # pid 1 did not start 2 ticks after boot


def test_a_stopping_relay_kills_what_its_agents_left(tmp_path: Path) -> None:
    """The watcher kills processes of its relay's exact marker: not another relay's."""
    data = tmp_path / "data"
    first, second = Lifetime(data), Lifetime(data)  # two relays of one process, one data dir
    first.start()
    second.start()
    sleepers = [
        subprocess.Popen(["sleep", "600"], env={RELAY_ENV: lifetime.marker})
        for lifetime in (first, second)
    ]
    procs = [proc(sleeper.pid) for sleeper in sleepers]
    try:
        assert relay_marker(data) == second.marker  # what agents started now would carry
        asyncio.run(first.stop())
        wait_gone(procs[:1], "the watcher left its relay's process running")
        assert alive(procs[1])
        asyncio.run(second.stop())
        wait_gone(procs[1:], "the watcher left its relay's process running")
    finally:
        for lifetime in (first, second):
            asyncio.run(lifetime.stop())
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def test_stderr_reason_is_the_last_lines_without_stack_frames() -> None:
    assert stderr_reason([ROOT_REFUSAL]) == ROOT_REFUSAL
    lines = ["warming up", "Error: bad option", "    at main (cli.js:1:2)", "  at x (y:3)", "done"]
    assert stderr_reason(lines) == "warming up Error: bad option done"
    assert stderr_reason(["a", "b", "c", "d"]) == "b c d"
    assert stderr_reason([]) == ""
    assert len(stderr_reason(["x" * 1000])) == 300
