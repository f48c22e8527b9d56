"""The relay's own tools, defined once; each provider adapter turns them into its SDK's form.

Claude Code gets them as one in-process MCP server named `oarlock` (tool names
`mcp__oarlock__<name>`); the SDK engine as session tools; the demo calls them itself. A new
tool is one more RelayTool here with its handler from the supervisor: no adapter changes.
The relay's tools never ask the user for permission.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

MCP_SERVER = "oarlock"
MCP_PREFIX = f"mcp__{MCP_SERVER}__"


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer to the agent; an error is an answer too (the agent reads it)."""

    text: str
    is_error: bool = False


ToolHandler = Callable[[dict[str, Any]], Awaitable[ToolResult]]


@dataclass(frozen=True)
class RelayTool:
    """One relay tool: its name, what it is for, its JSON schema, and its handler."""

    name: str
    description: str
    schema: dict[str, Any]
    handler: ToolHandler

    async def call(self, arguments: dict[str, Any]) -> ToolResult:
        """Run the handler; an unexpected failure becomes an error the agent can read."""
        try:
            return await self.handler(arguments)
        except ValueError as error:
            return ToolResult(str(error), is_error=True)
        except Exception as error:  # noqa: BLE001 - the agent gets an answer, never a hang
            return ToolResult(f"{self.name} failed in the relay: {error}", is_error=True)


SAVE_HANDOFF = "save_handoff"
SAVE_HANDOFF_DESCRIPTION = (
    "Save a handoff for this project so that a fresh session (after the user's /clear) can "
    "resume the work: what is done, what is next, and the file paths and function names "
    "involved. At most 9,000 characters in all. The newest handoff of the project wins."
)
SAVE_HANDOFF_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "done": {"type": "string", "description": "What is done."},
        "next": {"type": "string", "description": "What is next."},
        "files": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The file paths and function names involved.",
        },
    },
    "required": ["done", "next", "files"],
}


SEARCH_ARCHIVE = "search_archive"
SEARCH_ARCHIVE_DESCRIPTION = (
    "Search the archived conversations this one was compacted from (its earlier parts, before "
    "each /compact or /clear) for messages holding every word of the query (the last word may "
    "be a prefix). Answers up to 20 matches, best first, one line each: conversation id, seq, "
    "who wrote it, an excerpt. Read the full messages with read_archive."
)
SEARCH_ARCHIVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "The words to look for."},
    },
    "required": ["query"],
}
READ_ARCHIVE = "read_archive"
READ_ARCHIVE_DESCRIPTION = (
    "Read the full text of messages of an archived conversation this one was compacted from "
    "(an id that search_archive gave), in order from a seq: at most 50 messages and 40,000 "
    "characters per call; the answer says where to continue."
)
READ_ARCHIVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "conversation_id": {"type": "integer", "description": "The archived conversation."},
        "from_seq": {
            "type": "integer",
            "description": "The first message's seq (default 1).",
            "minimum": 1,
        },
        "limit": {
            "type": "integer",
            "description": "How many messages, 1 to 50 (default 50).",
            "minimum": 1,
            "maximum": 50,
        },
    },
    "required": ["conversation_id"],
}


def relay_tools(
    *, save_handoff: ToolHandler, search_archive: ToolHandler, read_archive: ToolHandler
) -> tuple[RelayTool, ...]:
    """Every relay tool, bound to one conversation's handlers."""
    return (
        RelayTool(SAVE_HANDOFF, SAVE_HANDOFF_DESCRIPTION, SAVE_HANDOFF_SCHEMA, save_handoff),
        RelayTool(
            SEARCH_ARCHIVE, SEARCH_ARCHIVE_DESCRIPTION, SEARCH_ARCHIVE_SCHEMA, search_archive
        ),
        RelayTool(READ_ARCHIVE, READ_ARCHIVE_DESCRIPTION, READ_ARCHIVE_SCHEMA, read_archive),
    )


def is_relay_tool(name: str, tools: tuple[RelayTool, ...]) -> bool:
    """True for one of these relay tools' names as Claude Code calls it (never asks).

    Exactly: an MCP server of the user's or a project's named "oarlock__x" gives tool names
    that begin as the relay's do, and must be asked about as any other.
    """
    return name in {MCP_PREFIX + tool.name for tool in tools}
