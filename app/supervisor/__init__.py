"""One runner per conversation: stores messages, delivers them to the agent, records its events.

A user message is stored (state "queued") before it is acknowledged. The
conversation's runner delivers queued messages one turn at a time, in order,
and turns every agent event into stored entries and live events for the hub.
The Supervisor is put together in core.py from one part a module (docs/architecture.md).
"""

from app.supervisor.core import Supervisor
from app.supervisor.events import SHUTDOWN_LINE
from app.supervisor.recovery import (
    MISSED_AGAIN_LINE,
    REDELIVERED_LINE,
    RESTART_LINE,
    TAKEOVER_LINE,
    UNKNOWN_LINE,
)
from app.supervisor.runner import (
    COMPACT_COMMAND,
    ConversationError,
    Locked,
    Runner,
    Streaming,
    TurnState,
    failure_reason,
    is_compact_command,
    is_retry,
)
from app.supervisor.turns import bursts

__all__ = [
    "COMPACT_COMMAND",
    "MISSED_AGAIN_LINE",
    "REDELIVERED_LINE",
    "RESTART_LINE",
    "SHUTDOWN_LINE",
    "TAKEOVER_LINE",
    "UNKNOWN_LINE",
    "ConversationError",
    "Locked",
    "Runner",
    "Streaming",
    "Supervisor",
    "TurnState",
    "bursts",
    "failure_reason",
    "is_compact_command",
    "is_retry",
]
