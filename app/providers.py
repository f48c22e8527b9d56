"""The providers a conversation can run on, whether each can run here, and their agents."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import shutil
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, get_args

from app.agent_env import agent_environment, parse_passthrough
from app.agents.base import Agent, AgentSpec
from app.agents.lifetime import relay_marker
from app.agents.sweep import RELAY_ENV
from app.compaction import Style
from app.config import PermissionMode, Settings

WINDOW_ENV = "CLAUDE_CODE_AUTO_COMPACT_WINDOW"
COPILOT_TOKENS = ("COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN")


@dataclass(frozen=True)
class Traits:
    """What a provider is, whether or not it can run here."""

    name: str
    compact_window: bool  # the per-conversation auto-compact window applies
    compaction: Style  # how its own compactions show in the timeline
    images: bool = False  # its agent takes the images attached to a message


# The one place that knows each provider's traits.
TRAITS: dict[str, Traits] = {
    "claude": Traits("Claude Code", compact_window=True, compaction="line", images=True),
    "deepseek": Traits("DeepSeek", compact_window=True, compaction="line"),
    "copilot": Traits("Copilot", compact_window=False, compaction="activity", images=True),
    "openai": Traits("OpenAI-compatible", compact_window=False, compaction="activity", images=True),
    "demo": Traits("Demo (offline)", compact_window=True, compaction="line", images=True),
}
WINDOW_PROVIDERS = tuple(name for name, traits in TRAITS.items() if traits.compact_window)
CLAUDE_CLI_PROVIDERS = ("claude", "deepseek")  # the Claude Code CLI runs their agents
ROOT_BYPASS = (
    "Claude Code refuses bypassPermissions when it runs as root, as this relay does: pick"
    " another permission mode, or run the relay as a normal user (in a sandboxed container:"
    " IS_SANDBOX=1 and OARLOCK_AGENT_ENV_PASSTHROUGH=IS_SANDBOX)."
)


def images_refused(provider: str) -> str | None:
    """Why a provider's conversation takes no images (its agent is never sent any), or None."""
    if provider in TRAITS and TRAITS[provider].images:
        return None
    name = TRAITS[provider].name if provider in TRAITS else provider
    return f"{name} does not take images: send the text alone."


def compaction_style(provider: str) -> Style:
    """How a provider's own compactions are shown."""
    return TRAITS[provider].compaction if provider in TRAITS else "line"


@dataclass(frozen=True)
class ProviderInfo:
    """A provider as the UI offers it."""

    id: str
    name: str
    available: bool
    reason: str = ""
    compact_window: bool = False  # has the per-conversation auto-compact window
    images: bool = False  # takes images attached to a message
    refused_modes: dict[str, str] = field(default_factory=dict)  # mode → why it cannot run here

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def _claude_logged_in(environ: Mapping[str, str]) -> bool:
    home = Path(environ.get("HOME") or Path.home())
    config = Path(environ.get("CLAUDE_CONFIG_DIR") or home / ".claude")
    return (config / ".credentials.json").is_file()


def provider_infos(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> list[ProviderInfo]:
    """Every provider, with whether it can run and why not."""
    from app.agents.copilot import copilot_available, openai_available  # no SDK import

    env = os.environ if environ is None else environ
    copilot_ready, copilot_reason = copilot_available(env, settings.copilot_cli)
    openai_ready, openai_reason = openai_available(
        settings.openai_base_url, settings.openai_model, settings.copilot_cli
    )
    claude_ready = any(
        env.get(name)
        for name in (
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "CLAUDE_CODE_OAUTH_TOKEN",
            "ANTHROPIC_BASE_URL",
        )
    ) or _claude_logged_in(env)
    cli = settings.claude_cli
    no_cli = (
        f"OARLOCK_CLAUDE_CLI ({cli}) is not a program that can run here."
        if cli and shutil.which(cli) is None
        else None
    )
    ready = {
        "claude": (
            claude_ready and not no_cli,
            no_cli or "Set ANTHROPIC_API_KEY or run `claude login` first.",
        ),
        "deepseek": (
            bool(env.get("DEEPSEEK_API_KEY")) and not no_cli,
            no_cli or "Set DEEPSEEK_API_KEY first.",
        ),
        "copilot": (copilot_ready, copilot_reason),
        "openai": (openai_ready, openai_reason),
        "demo": (True, ""),
    }
    return [
        ProviderInfo(
            provider,
            traits.name,
            ready[provider][0],
            "" if ready[provider][0] else ready[provider][1],
            traits.compact_window,
            traits.images,
            {
                mode: reason
                for mode in get_args(PermissionMode)
                if (reason := mode_refused(provider, mode, settings, environ=env)) is not None
            },
        )
        for provider, traits in TRAITS.items()
    ]


def default_provider(settings: Settings, infos: list[ProviderInfo]) -> str:
    """The configured default if it can run, else Claude Code if it can, else demo."""
    ready = {info.id for info in infos if info.available}
    if settings.default_provider in ready:
        return settings.default_provider or "demo"
    return "claude" if "claude" in ready else "demo"


def agent_env(
    provider: str,
    settings: Settings,
    window: int | None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment an agent process of this provider gets."""
    source = os.environ if environ is None else environ
    env = agent_environment(source, parse_passthrough(settings.agent_env_passthrough))
    if provider == "deepseek":
        for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_MODEL"):
            env.pop(name, None)
        env.update(
            ANTHROPIC_BASE_URL=settings.deepseek_base_url,
            ANTHROPIC_AUTH_TOKEN=source.get("DEEPSEEK_API_KEY", ""),
            ANTHROPIC_MODEL=settings.deepseek_model,
            ANTHROPIC_SMALL_FAST_MODEL=settings.deepseek_small_model,
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
    if provider == "copilot":  # the user's GitHub login, when given as a token
        for name in COPILOT_TOKENS:
            if source.get(name):
                env[name] = source[name]
    if window is not None and provider in WINDOW_PROVIDERS:
        env[WINDOW_ENV] = str(window)
    env[RELAY_ENV] = relay_marker(settings.resolved_data_dir)  # finds what agents started
    return env


def mode_refused(
    provider: str,
    mode: str,
    settings: Settings,
    *,
    euid: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """Why this provider's agent would refuse to start in this permission mode here, or None.

    The Claude Code CLI refuses bypassPermissions as root unless its environment has
    IS_SANDBOX=1 (measured with the bundled CLI: "1" only; "true" or "yes" are refused).
    """
    if provider not in CLAUDE_CLI_PROVIDERS or mode != "bypassPermissions":
        return None
    if (os.geteuid() if euid is None else euid) != 0:
        return None
    if agent_env(provider, settings, None, environ).get("IS_SANDBOX") == "1":
        return None
    return ROOT_BYPASS


# What a provider's agent imports when its first one starts. Measured here (session 38): the
# Claude SDK 0.5 s and 20 MiB, the Copilot SDK 0.85 s; on the event loop every tab's stream
# stalled that long. load_provider imports them in a worker thread first. (The demo agent's
# module takes 1.4 ms.)
_COPILOT_IMPORTS = ("app.agents.copilot", "copilot", "copilot.tools", "copilot.generated.rpc")
PROVIDER_IMPORTS: dict[str, tuple[str, ...]] = {
    "claude": ("app.agents.claude_code",),
    "deepseek": ("app.agents.claude_code",),
    "copilot": _COPILOT_IMPORTS,
    "openai": _COPILOT_IMPORTS,
}
_loaded: set[str] = set()
_loading = threading.Lock()


def provider_loaded(provider: str) -> bool:
    """True when load_provider has nothing left to do for provider."""
    return provider in _loaded or provider not in PROVIDER_IMPORTS


def load_provider(provider: str) -> None:
    """Import what provider's agents need (blocking: run it in a worker thread), once.

    What the imports built then lives as long as the process: frozen, out of the collector's
    sight as start-up's objects are (app/main.py). Left in it, the Claude SDK's 49,000 objects
    made the next full collection take 16-54 ms, on whichever thread allocated then.
    """
    if provider_loaded(provider):
        return
    with _loading:  # a second caller waits here, off the loop, until the first is done
        if provider in _loaded:
            return
        for name in PROVIDER_IMPORTS[provider]:
            # One that fails is left to the agent's start, which says why in the timeline.
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        gc.freeze()
        _loaded.add(provider)


def make_agent(provider: str, spec: AgentSpec, settings: Settings) -> Agent:
    """Build (not start) the agent for a conversation."""
    if provider == "demo":
        from app.agents.demo import DemoAgent

        return DemoAgent(spec, delay=settings.demo_delay)
    # Imported and frozen if nothing loaded it first (a restart's recovery builds agents to ask
    # what they received, in a storage thread); a no-op once loaded.
    load_provider(provider)
    if provider in ("claude", "deepseek"):
        from app.agents.claude_code import ClaudeCodeAgent

        model = settings.claude_model if provider == "claude" else None
        return ClaudeCodeAgent(spec, cli_path=settings.claude_cli, model=model)
    if provider in ("copilot", "openai"):
        from app.agents.copilot import CopilotAgent, copilot_cli_path, openai_provider

        cli = copilot_cli_path(settings.copilot_cli)
        if cli is None:
            raise ValueError("the Copilot CLI is not installed (make copilot-cli)")
        if provider == "copilot":
            return CopilotAgent(spec, cli_path=cli, provider=None, model=None)
        byok = openai_provider(settings.openai_base_url or "", settings.openai_api_key)
        return CopilotAgent(spec, cli_path=cli, provider=byok, model=settings.openai_model)
    raise ValueError(f"unknown provider {provider!r}")
