"""Logging: uvicorn's configuration with the token kept out of every line."""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

from uvicorn.config import LOGGING_CONFIG

# A token= query parameter, as in the printed login URL /?token=… (guesses included), its
# name's letters percent-encoded or not (the login decodes the name: ?%74oken= logs in too).
TOKEN_PARAM = re.compile(r"(?i)([?&;](?:t|%74)(?:o|%6f)(?:k|%6b)(?:e|%65)(?:n|%6e)=)[^&#\s\"']*")
REDACTED = r"\1[redacted]"


def redact(text: str) -> str:
    """The text with the value of every token= query parameter replaced."""
    return TOKEN_PARAM.sub(REDACTED, text)


class RedactTokens(logging.Filter):
    """Rewrites a record's message and arguments so no token= value reaches a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact, then let the record through."""
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {
                k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()
            }
        return True


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's default logging, every handler filtered through RedactTokens."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"redact_tokens": {"()": RedactTokens}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact_tokens"]
    return config
