"""Which of the relay's environment variables reach agent processes."""

import re
from collections.abc import Collection, Iterable, Mapping

DEFAULT_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "CLAUDE_CODE_")
DEFAULT_NAMES = (
    "HOME",
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
)
LOCALE_PREFIX = "LC_"
_SEPARATORS = re.compile(r"[,\s]+")


def is_allowed(name: str, extra_names: Collection[str] = ()) -> bool:
    """Tell whether a variable may reach an agent process."""
    return (
        name.startswith(DEFAULT_PREFIXES)
        or name.startswith(LOCALE_PREFIX)
        or name in DEFAULT_NAMES
        or name in extra_names
    )


def agent_environment(
    environ: Mapping[str, str], extra_names: Iterable[str] = ()
) -> dict[str, str]:
    """Keep only the variables that may reach agent processes."""
    extra = frozenset(extra_names)
    return {name: value for name, value in environ.items() if is_allowed(name, extra)}


def parse_passthrough(value: str | None) -> tuple[str, ...]:
    """Split a comma- and/or whitespace-separated list of names, dropping repeats."""
    if value is None:
        return ()
    names = (name for name in _SEPARATORS.split(value) if name)
    return tuple(dict.fromkeys(names))
