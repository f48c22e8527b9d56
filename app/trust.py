"""Whether a folder's own Claude Code settings may act when an agent starts in it.

Claude Code loads a project's settings from its working directory: hooks (commands run on
events), MCP servers (commands it starts), an environment (ANTHROPIC_BASE_URL: where the API
key goes), permission rules. In a terminal it first asks "Do you trust the files in this
folder?"; driven by the relay it asks nothing. So the relay asks instead, once, when a Claude
Code conversation is created in a folder that has such files, unless Claude Code recorded the
folder as trusted already (its own question, answered in a terminal). Claude Code also
starts the MCP servers of a `.mcp.json` in any folder above its working directory (a security
review: one in a repository's top folder ran its command for a conversation in `repo/src`,
one above the workspace root for every conversation under it); a parent's `.claude/` settings
did not act there, so only that file is looked for above.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

PROJECT_FILES = (".claude/settings.json", ".claude/settings.local.json", ".mcp.json")


def project_settings(cwd: Path) -> list[str]:
    """The Claude Code project files that act for an agent in the folder: its own, then a
    `.mcp.json` in each folder above it, nearest first (paths relative to it: `../.mcp.json`)."""
    found = [name for name in PROJECT_FILES if (cwd / name).is_file()]
    found += [
        os.path.relpath(parent / ".mcp.json", cwd)
        for parent in cwd.parents
        if (parent / ".mcp.json").is_file()
    ]
    return found


def trusted_by_claude(env: Mapping[str, str], cwd: Path) -> bool:
    """Whether Claude Code's own record says its trust question was answered for cwd."""
    base = env.get("CLAUDE_CONFIG_DIR") or env.get("HOME", "~")
    try:
        config = json.loads((Path(base).expanduser() / ".claude.json").read_text())
    except (OSError, ValueError):
        return False
    projects = config.get("projects") if isinstance(config, dict) else None
    project = projects.get(str(cwd)) if isinstance(projects, dict) else None
    return isinstance(project, dict) and project.get("hasTrustDialogAccepted") is True


def untrusted_settings(cwd: Path, env: Mapping[str, str]) -> list[str]:
    """The project files a conversation in cwd would run with, unless trusted already."""
    found = project_settings(cwd)
    return [] if not found or trusted_by_claude(env, cwd) else found


def trust_question(found: list[str]) -> str:
    """The 409's words: what was found, and how to go on."""
    return (
        f"This folder has Claude Code settings ({', '.join(found)}) that can run commands"
        " (hooks, MCP servers) and change where the agent connects as it starts. Create the"
        ' conversation only if you trust this folder: tick "Trust this folder\'s settings"'
        ' (API: "trust_project": true).'
    )
