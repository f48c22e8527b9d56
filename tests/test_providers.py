"""What the relay knows of each provider, and when each can run."""

from __future__ import annotations

from pathlib import Path

from app.config import Settings
from app.providers import (
    ROOT_BYPASS,
    WINDOW_PROVIDERS,
    compaction_style,
    default_provider,
    mode_refused,
    provider_infos,
)


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
