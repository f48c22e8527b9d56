"""Settings, read from OARLOCK_* environment variables and the command line."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.agent_memory import default_budget, mem_total, parse_size

PermissionMode = Literal["default", "acceptEdits", "bypassPermissions", "plan"]
PERMISSION_MODES: tuple[str, ...] = get_args(PermissionMode)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class Settings(BaseSettings):
    """Everything the relay can be configured with; built by the CLI, never at import."""

    model_config = SettingsConfigDict(env_prefix="OARLOCK_", extra="ignore")

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    data_dir: Path = Path("./data")
    database_url: str | None = None  # default: sqlite under data_dir
    token: str | None = None  # default: generated into data_dir/token on first start
    backups_dir: Path | None = None  # default: data_dir/backups (shared storage in a cluster)
    no_auth: bool = False  # only honoured on a loopback host
    # Lists come from the environment as comma-separated strings (not JSON).
    # Extra Host names and Origins to accept (reverse proxies, a server's name).
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Proxies whose X-Forwarded-For/-Proto are believed (client address, https); none by default.
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    max_message_bytes: int = Field(default=256 * 1024, ge=1)
    # Seconds a client has to send a request's head, and then its body (slow clients: 408).
    request_timeout: float = Field(default=20.0, gt=0)
    # Directories agents may work in; default: the user's home.
    workspace_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    default_cwd: Path | None = None
    default_provider: str | None = None
    permission_mode: PermissionMode = "default"
    # Seconds an idle agent stays warm (README.md, "Idle timeout": why 120 once warming exists).
    agent_idle_timeout: float = Field(default=120.0, gt=0)
    # Memory live agents may hold: "1500" (MiB), "1.5G"; default: a quarter of the machine's.
    agent_memory: int | None = None
    agent_env_passthrough: str = ""
    claude_cli: str | None = None
    claude_model: str | None = None
    deepseek_base_url: str = "https://api.deepseek.com/anthropic"
    deepseek_model: str = "deepseek-chat"
    deepseek_small_model: str = "deepseek-chat"
    copilot_cli: str | None = None  # default: .tools/copilot (make copilot-cli)
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    openai_model: str | None = None
    # The context watch (SPEC §7): past soft the agent is asked to save a handoff, past hard
    # to finish and save one; the 🧠 button turns amber, then red.
    context_soft: int = Field(default=300_000, ge=1)
    context_hard: int = Field(default=500_000, ge=1)
    # Web Push (app/push.py): extra push service names allowed as endpoints (https), http to
    # loopback endpoints (tests, a push server on this machine), the contact VAPID sends.
    push_services: Annotated[list[str], NoDecode] = Field(default_factory=list)
    push_loopback_http: bool = False
    push_contact: str = "mailto:oarlock@localhost"
    # Several nodes (docs/deploy.md): Redis carries events between relay processes that share
    # one PostgreSQL database; each conversation's agent runs on the node holding its lease.
    redis_url: str | None = None
    lease_seconds: float = Field(default=10.0, ge=1.0)  # takeover within 4/3 of it (13.3 s)
    max_agents: int | None = Field(default=None, ge=1)  # conversations this node runs at once
    node_id: str | None = None  # default: host name, process id and a random suffix
    demo_delay: float = Field(default=0.04, ge=0)  # seconds between the demo's streamed pieces
    log_level: str = "info"

    @field_validator(
        "allowed_hosts",
        "allowed_origins",
        "trusted_proxies",
        "workspace_roots",
        "push_services",
        mode="before",
    )
    @classmethod
    def _split_list(cls, value: object) -> object:
        """Accept a comma-separated string where a list is expected."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        if value.lower() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return value.lower()

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            if entry != "*":
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(
                        f"{entry!r} is not an IP address, a network (10.0.0.0/8) or *"
                    ) from None
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        return _names_only(
            value,
            "/*",
            ", as the browser's address bar shows it after the scheme (oar.example.com, or "
            "with :port)",
        )

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for entry in value:
            if not entry.startswith(("http://", "https://")) or entry.rstrip("/").count("/") != 2:
                raise ValueError(
                    f"{entry!r} is not an origin: a scheme and a host, with a port if any "
                    "(https://oar.example.com)"
                )
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        if value is None:
            return value
        try:
            url = make_url(value.replace("postgres://", "postgresql://", 1))
        except (ArgumentError, ValueError):
            url = None
        if url is None or "@" in (url.host or ""):  # (an "@" left in the host: the password's)
            raise _unreadable_url(
                "database",
                "postgresql://user:password@host:port/name",
                "@ as %40, : as %3A, / as %2F and % as %25",
            )
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(
                f"oarlock runs on SQLite (sqlite:////path/oarlock.db) or PostgreSQL "
                f"(postgresql://…), not {url.get_backend_name()}"
            )
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            raise ValueError(
                "an in-memory SQLite database keeps nothing (and each connection has its "
                "own): give a file, sqlite:////path/oarlock.db"
            )
        return value

    @field_validator("push_contact")
    @classmethod
    def _push_contact(cls, value: str) -> str:
        if not value.startswith(("mailto:", "https://")) or value in ("mailto:", "https://"):
            raise ValueError("must be a mailto: or https: URL (push services write to it)")
        return value

    @field_validator("push_services")
    @classmethod
    def _push_services(cls, value: list[str]) -> list[str]:
        return _names_only(value, "/:")

    @field_validator("deepseek_base_url", "openai_base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        if value is not None and not (
            value.startswith(("http://", "https://")) and value.split("/")[2]
        ):
            raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or value != value.strip()):
            raise ValueError("must be a name without a space at either end")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        from redis.connection import parse_url

        if value is None:
            return value
        if not value.startswith(REDIS_SCHEMES):
            raise ValueError("must start with redis://, rediss:// or unix://")
        try:
            if value.split("//", 1)[-1].split("/", 1)[0].count("@") > 1:  # one is the password's
                raise ValueError
            parse_url(value)
        except ValueError:
            raise _unreadable_url(
                "Redis",
                "redis://:password@host:port/0",
                "/ as %2F, # as %23, ? as %3F and @ as %40",
            ) from None
        return value

    @model_validator(mode="after")
    def _hard_not_below_soft(self) -> Settings:
        """OARLOCK_CONTEXT_HARD below OARLOCK_CONTEXT_SOFT is a configuration error."""
        if self.context_hard < self.context_soft:
            raise ValueError("OARLOCK_CONTEXT_HARD must not be below OARLOCK_CONTEXT_SOFT.")
        return self

    @field_validator("agent_memory", mode="before")
    @classmethod
    def _memory_size(cls, value: object) -> object:
        """Accept "1500" (MiB), "800M", "2G" where bytes are expected."""
        if isinstance(value, str):
            return parse_size(value) if value.strip() else None
        return value

    @property
    def agent_budget(self) -> int:
        """Bytes the live agents' processes may hold together."""
        return self.agent_memory if self.agent_memory is not None else default_budget(mem_total())

    @property
    def resolved_data_dir(self) -> Path:
        """The data directory as an absolute path."""
        return self.data_dir.expanduser().resolve()

    @property
    def resolved_backups_dir(self) -> Path:
        """Where the conversations' backups are written, as an absolute path."""
        if self.backups_dir is None:
            return self.resolved_data_dir / "backups"
        return self.backups_dir.expanduser().resolve()

    @property
    def db_url(self) -> str:
        """The database URL: the configured one, or SQLite in the data directory."""
        return self.database_url or f"sqlite:///{self.resolved_data_dir / 'oarlock.db'}"

    @property
    def roots(self) -> list[Path]:
        """Directories agents may work in (resolved)."""
        roots = self.workspace_roots or [Path.home()]
        return [root.expanduser().resolve() for root in roots]

    @property
    def cwd_default(self) -> Path:
        """The working directory given to new conversations that name none."""
        return (self.default_cwd or self.roots[0]).expanduser().resolve()


def _names_only(value: list[str], refused: str, hint: str = "") -> list[str]:
    """Host names as given, each refused when it holds one of the refused characters."""
    for entry in value:
        if any(character in entry for character in refused):
            raise ValueError(f"{entry!r} is not a host name: give the name alone{hint}")
    return value


def _unreadable_url(kind: str, shape: str, escapes: str) -> ValueError:
    """A URL setting that cannot be read, said without its value (it may hold a password)."""
    return ValueError(f"cannot be read as a {kind} URL ({shape}; in a password, write {escapes})")


def place_error(settings: Settings) -> str | None:
    """Why the directories the settings name cannot serve, or None (read at start: a root
    that is missing would fail only at the first new conversation, without naming its setting).
    """
    data = settings.resolved_data_dir  # made at start: a root may be it
    for root in settings.roots:
        if root.is_file() or (not root.is_dir() and root != data):
            return f"OARLOCK_WORKSPACE_ROOTS: {root} is not a directory."
    cwd = settings.cwd_default
    if not any(cwd == root or root in cwd.parents for root in settings.roots):
        roots = ", ".join(str(root) for root in settings.roots)
        return f"OARLOCK_DEFAULT_CWD: {cwd} is not inside OARLOCK_WORKSPACE_ROOTS ({roots})."
    if settings.default_cwd is not None and not cwd.is_dir():
        return f"OARLOCK_DEFAULT_CWD: {cwd} is not a directory."
    backups = settings.resolved_backups_dir
    if backups.exists() and not backups.is_dir():
        return f"OARLOCK_BACKUPS_DIR: {backups} is not a directory."
    return None
