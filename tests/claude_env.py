"""The environment a relay hands the real `claude` CLI in tests: a fresh HOME, the fake API."""

from __future__ import annotations

from pathlib import Path

import pytest

CLEARED = (  # variables of the outer environment that would change what the CLI does
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CONFIG_DIR",
    "CLAUDE_CODE_AUTO_COMPACT_WINDOW",
    "CLAUDE_CODE_MAX_RETRIES",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "DEEPSEEK_API_KEY",
    "OARLOCK_DEFAULT_PROVIDER",
    "OARLOCK_CLAUDE_CLI",
)


def use_fake_anthropic(monkeypatch: pytest.MonkeyPatch, home: Path, base_url: str) -> Path:
    """Have the CLIs a relay starts talk to the fake Messages API at base_url from home."""
    (home / "tmp").mkdir(parents=True)
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    monkeypatch.setenv("CLAUDE_CODE_TMPDIR", str(home / "tmp"))
    return home
