"""What the relay knows of each provider, and when each can run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import Settings
from app.providers import (
    ROOT_BYPASS,
    WINDOW_PROVIDERS,
    agent_env,
    compaction_style,
    default_provider,
    mode_refused,
    provider_infos,
)
from tests.crash import ROOT, RelayProcess, of_kind


def test_compaction_style_of_claude_is_line() -> None:
    assert [compaction_style(p) for p in ("claude", "deepseek", "demo")] == ["line"] * 3


def test_compaction_style_of_sdk_engine_is_activity() -> None:
    assert [compaction_style(p) for p in ("copilot", "openai")] == ["activity"] * 2


def test_window_providers_are_those_with_the_slider() -> None:
    assert WINDOW_PROVIDERS == ("claude", "deepseek", "demo")


def test_provider_infos_without_keys(tmp_path: Path) -> None:
    settings = Settings(copilot_cli=str(tmp_path / "missing"))
    infos = provider_infos(settings, {"HOME": str(tmp_path)})
    shown = [(i.id, i.name, i.available, bool(i.reason), i.compact_window) for i in infos]
    assert shown == [
        ("claude", "Claude Code", False, True, True),
        ("deepseek", "DeepSeek", False, True, True),
        ("copilot", "Copilot", False, True, False),
        ("openai", "OpenAI-compatible", False, True, False),
        ("demo", "Demo (offline)", True, False, True),
    ]
    assert default_provider(settings, infos) == "demo"


def test_provider_infos_with_keys(tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path), "ANTHROPIC_API_KEY": "k", "DEEPSEEK_API_KEY": "d"}
    infos = provider_infos(Settings(copilot_cli=str(tmp_path / "missing")), environ)
    assert [i.id for i in infos if i.available] == ["claude", "deepseek", "demo"]
    assert default_provider(Settings(), infos) == "claude"
    assert default_provider(Settings(default_provider="deepseek"), infos) == "deepseek"


def test_a_claude_cli_that_cannot_run_makes_its_providers_unavailable(tmp_path: Path) -> None:
    # A self-hoster's review: OARLOCK_CLAUDE_CLI=/nonexistent listed Claude Code as available,
    # and the first message failed.
    environ = {"HOME": str(tmp_path), "ANTHROPIC_API_KEY": "k", "DEEPSEEK_API_KEY": "d"}
    settings = Settings(claude_cli=str(tmp_path / "nope"), copilot_cli=str(tmp_path / "missing"))
    infos = {i.id: i for i in provider_infos(settings, environ)}
    why = f"OARLOCK_CLAUDE_CLI ({tmp_path / 'nope'}) is not a program that can run here."
    for provider in ("claude", "deepseek"):
        assert (infos[provider].available, infos[provider].reason) == (False, why)


def test_bypass_permissions_is_refused_for_claude_code_as_root_unless_sandboxed() -> None:
    plain, passed = Settings(), Settings(agent_env_passthrough="IS_SANDBOX")
    sandbox = {"IS_SANDBOX": "1"}
    for provider in ("claude", "deepseek"):
        assert mode_refused(provider, "bypassPermissions", plain, euid=0, environ={}) == ROOT_BYPASS
        refused = mode_refused(provider, "bypassPermissions", plain, euid=0, environ=sandbox)
        assert refused == ROOT_BYPASS  # the variable does not reach the agent
        assert mode_refused(provider, "bypassPermissions", passed, euid=0, environ=sandbox) is None
        yes = {"IS_SANDBOX": "true"}  # the CLI takes "1" only
        assert mode_refused(provider, "bypassPermissions", passed, euid=0, environ=yes)
        assert mode_refused(provider, "bypassPermissions", plain, euid=1000, environ={}) is None
        assert mode_refused(provider, "acceptEdits", plain, euid=0, environ={}) is None
    for provider in ("demo", "copilot", "openai"):
        assert mode_refused(provider, "bypassPermissions", plain, euid=0, environ={}) is None


LOAD = """
import gc, sys
from app.providers import PROVIDER_IMPORTS, load_provider, provider_loaded
provider = sys.argv[1]
assert not provider_loaded(provider)
load_provider(provider)
assert provider_loaded(provider)
assert all(name in sys.modules for name in PROVIDER_IMPORTS[provider])
sdk = sys.modules[sys.argv[2]]
# Frozen: out of every generation the collector walks (gc.get_objects lists those).
assert gc.get_freeze_count() > 0
assert not any(o is sdk.__dict__ for o in gc.get_objects())
print("ok")
"""


@pytest.mark.parametrize(
    ("provider", "sdk"), [("claude", "claude_agent_sdk"), ("copilot", "copilot")]
)
def test_a_provider_is_loaded_and_what_it_built_frozen(provider: str, sdk: str) -> None:
    fresh_interpreter(LOAD, provider, sdk)  # (this one imported every SDK long ago)


def fresh_interpreter(script: str, *args: str) -> None:
    """Run script in a new interpreter; it must print ok."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


FROZEN_BY = """
import gc, json, sys, tempfile
from pathlib import Path
from app.providers import load_provider, provider_loaded
way = sys.argv[1]
assert not provider_loaded("claude")
if way == "import":  # a Claude Code session imported before any Claude agent started
    from app.imports import read_history
    path = Path(tempfile.mkdtemp()) / "s.jsonl"
    record = {"type": "user", "message": {"role": "user", "content": "hi"}}
    path.write_text(json.dumps(record) + "\\n")
    read_history(path)
else:  # an agent built by a restart's recovery, to ask what it received
    from app.agents.base import AgentSpec
    from app.config import Settings
    from app.providers import make_agent
    from tests.agent_turns import allow_all
    spec = AgentSpec(conversation_id=1, cwd=Path("."), session_id=None,
                     permission_mode="default", auto_compact_window=None, env={},
                     ask_permission=allow_all)
    make_agent("claude", spec, Settings())
sdk = sys.modules["claude_agent_sdk"]
assert provider_loaded("claude")
assert not any(o is sdk.__dict__ for o in gc.get_objects())
print("ok")
"""


@pytest.mark.parametrize("way", ["import", "recovery"])
def test_the_sdk_is_frozen_whoever_imports_it_first(way: str) -> None:
    # Left in the collector's generations, its 49,000 objects slowed every full collection.
    fresh_interpreter(FROZEN_BY, way)


WATCH_IMPORTS = """
import asyncio, os, sys

def watch(event, args):
    if event == "import" and args[0] == "claude_agent_sdk":
        with open(os.environ["IMPORTS_SEEN"], "a") as seen:
            on_loop = asyncio._get_running_loop() is not None
            seen.write("on the event loop\\n" if on_loop else "off the event loop\\n")

sys.addaudithook(watch)
"""


def test_the_first_claude_agent_imports_its_sdk_off_the_event_loop(tmp_path: Path) -> None:
    # Imported on the loop, the SDK (0.5 s) stalled every tab of every conversation.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(WATCH_IMPORTS)
    seen = tmp_path / "imports.txt"
    relay = RelayProcess(tmp_path / "data", env={"IMPORTS_SEEN": str(seen)})
    try:
        relay.start(
            PYTHONPATH=f"{hooks}{os.pathsep}{ROOT}",
            ANTHROPIC_BASE_URL="http://127.0.0.1:9",  # the provider can run; nothing is sent
            OARLOCK_CLAUDE_CLI="/bin/false",  # the agent fails to start, after the import
        )
        cid = relay.create(provider="claude", title="First agent")
        relay.send(cid, "hello")
        view = relay.wait_for(cid, lambda v: of_kind(v, "line") and v["turn"]["state"] == "idle")
        assert of_kind(view, "line")[0]["data"]["level"] == "error"
        assert seen.read_text() == "off the event loop\n"
    finally:
        relay.close()


def test_the_copilot_cli_s_data_moves_with_a_passed_agent_home(tmp_path: Path) -> None:
    # README: OARLOCK_AGENT_HOME named in OARLOCK_AGENT_ENV_PASSTHROUGH moves ~/.copilot.
    from app.agents.base import AgentSpec
    from app.agents.copilot import CopilotAgent
    from tests.agent_turns import allow_all

    environ = {"HOME": "/home/u", "OARLOCK_AGENT_HOME": str(tmp_path / "elsewhere")}

    def data_dir(passthrough: str) -> Path:
        settings = Settings(data_dir=tmp_path / "data", agent_env_passthrough=passthrough)
        spec = AgentSpec(
            conversation_id=1,
            cwd=tmp_path,
            session_id=None,
            permission_mode="default",
            auto_compact_window=None,
            env=agent_env("copilot", settings, None, environ),
            ask_permission=allow_all,
        )
        return CopilotAgent(spec, cli_path="copilot", provider=None, model=None).base_directory

    assert data_dir("") == Path("/home/u/.copilot")
    assert data_dir("OARLOCK_AGENT_HOME") == tmp_path / "elsewhere" / ".copilot"
