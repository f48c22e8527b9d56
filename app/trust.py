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
did not act there, so only that file is looked for above; but from a subfolder of a git
repository, the repository's own `.claude/settings.local.json` acts (a security review: its hook
ran for a conversation in `repo/src`; its `.claude/settings.json` did not).

A file that appears later (a `git pull` bringing a `.mcp.json`) would act at the agent's next
start with nobody asked: so each conversation keeps the files trusted for it
(`Conversation.trusted_settings`), and an agent start that finds another is refused with a
line that names it, whose button trusts it and sends the message again. A live Claude Code
agent also reads its settings files again when they change (a security review: a hook written
between two turns ran at the next): the relay looks again before each turn, and every second
while an agent lives (the pool's watch), and stops an agent whose folder has a file nobody
trusted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from app.workspace import WorkspaceError

LOCAL_SETTINGS = ".claude/settings.local.json"
PROJECT_FILES = (".claude/settings.json", LOCAL_SETTINGS, ".mcp.json")
# Skills and subagents whose front matter may name hooks: a skill's ran their commands once the
# model used it (seen with the real CLI: its Stop and PreToolUse hooks).
PROJECT_DIRS = (".claude/skills", ".claude/agents")


def project_settings(cwd: Path) -> list[str]:
    """The Claude Code project files that act for an agent in the folder: its own (settings,
    MCP servers, and its skills' and subagents' folders), the
    `.claude/settings.local.json` of the git repository it is in (from a subfolder), then a
    `.mcp.json` in each folder above it, nearest first (paths relative to it: `../.mcp.json`)."""
    found = [name for name in PROJECT_FILES if (cwd / name).is_file()]
    found += [name for name in PROJECT_DIRS if (cwd / name).is_dir()]
    root = git_root(cwd)
    if root is not None and root != cwd and (root / LOCAL_SETTINGS).is_file():
        found.append(os.path.relpath(root / LOCAL_SETTINGS, cwd))
    found += [
        os.path.relpath(parent / ".mcp.json", cwd)
        for parent in cwd.parents
        if (parent / ".mcp.json").is_file()
    ]
    return found


def git_root(cwd: Path) -> Path | None:
    """The top folder of the git repository (or worktree) cwd is in, or None."""
    for folder in (cwd, *cwd.parents):
        if (folder / ".git").exists():
            return folder
    return None


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


def trust_question(found: list[str]) -> str:
    """The 409's words: what was found, and how to go on."""
    return (
        f"This folder has Claude Code settings ({', '.join(found)}) that can run commands"
        " (hooks, MCP servers) and change where the agent connects as it starts. Create the"
        ' conversation only if you trust this folder: tick "Trust this folder\'s settings"'
        ' (API: "trust_project": true).'
    )


class UntrustedSettings(WorkspaceError):
    """An agent start refused: project files appeared that nobody trusted for this folder."""

    def __init__(self, files: list[str], *, stopped: bool = False) -> None:
        act = "while it runs" if stopped else "as it starts"
        then = "it was stopped" if stopped else "it was not started"
        button = "Trust these settings" if stopped else "Trust and resend"
        super().__init__(
            f"Claude Code settings appeared in this folder since it was trusted"
            f" ({', '.join(files)}). They can run commands (hooks, MCP servers) and change"
            f" where the agent connects {act}, so {then}. If you trust them, press {button}."
        )
        self.files = files
        self.stopped = stopped


def new_settings(trusted: list[str], cwd: Path, env: Mapping[str, str]) -> list[str]:
    """The project files in cwd that would act and are not in trusted (none when Claude
    Code's own record trusts the folder)."""
    found = unlisted(trusted, cwd)
    return [] if not found or trusted_by_claude(env, cwd) else found


def unlisted(trusted: list[str], cwd: Path) -> list[str]:
    """The project files in cwd that would act and are not in trusted."""
    return [name for name in project_settings(cwd) if name not in trusted]
