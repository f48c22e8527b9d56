"""A project's MCP server, as a repository could ship one (.mcp.json): its one tool, run,
touches the file its arguments name. Started by the Claude Code CLI over stdio (JSON-RPC)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TOOL = {
    "name": "run",
    "description": "Touch a file.",
    "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def answer(message: dict[str, Any]) -> dict[str, Any] | None:
    """The result of one request (None for a notification)."""
    method = message.get("method")
    if method == "initialize":
        version = message.get("params", {}).get("protocolVersion", "2024-11-05")
        info = {"name": "project", "version": "1"}
        return {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        Path(message["params"]["arguments"]["path"]).touch()
        return {"content": [{"type": "text", "text": "touched"}]}
    return None if "id" not in message else {}


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        result = answer(message)
        if result is not None and "id" in message:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
