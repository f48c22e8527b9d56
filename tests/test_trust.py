"""A folder's own Claude Code settings: found, and trusted only when Claude Code says so."""

from __future__ import annotations

import json
from pathlib import Path

from app.trust import (
    UntrustedSettings,
    git_root,
    new_settings,
    project_settings,
    trust_question,
    trusted_by_claude,
)


def test_the_project_files_that_act_as_the_agent_starts_are_found(tmp_path: Path) -> None:
    assert project_settings(tmp_path) == []
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "CLAUDE.md").write_text("notes")  # instructions, not settings
    assert project_settings(tmp_path) == []
    (tmp_path / ".mcp.json").write_text("{}")
    (tmp_path / ".claude" / "settings.json").write_text("{}")
    assert project_settings(tmp_path) == [".claude/settings.json", ".mcp.json"]
    (tmp_path / ".claude" / "settings.local.json").mkdir()  # not a file
    assert project_settings(tmp_path) == [".claude/settings.json", ".mcp.json"]
    (tmp_path / ".claude" / "agents").write_text("")  # not a folder
    (tmp_path / ".claude" / "skills").mkdir()  # skills and subagents carry hooks
    assert project_settings(tmp_path) == [".claude/settings.json", ".mcp.json", ".claude/skills"]


def test_a_mcp_json_above_the_folder_is_found_too(tmp_path: Path) -> None:
    """Claude Code starts the servers of a .mcp.json in any folder above its working directory
    (tests/test_claude_relay.py shows it with the real CLI); a parent's .claude/ does not act."""
    work = tmp_path / "repo" / "src" / "deep"
    work.mkdir(parents=True)
    (tmp_path / "repo" / ".claude").mkdir()
    (tmp_path / "repo" / ".claude" / "settings.json").write_text("{}")
    assert project_settings(work) == []
    (tmp_path / "repo" / ".mcp.json").write_text("{}")
    (tmp_path / ".mcp.json").write_text("{}")
    assert project_settings(work) == ["../../.mcp.json", "../../../.mcp.json"]
    (work / ".mcp.json").write_text("{}")
    assert project_settings(work) == [".mcp.json", "../../.mcp.json", "../../../.mcp.json"]


def test_a_folder_claude_code_was_told_to_trust_is_not_asked_about(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / ".mcp.json").write_text("{}")
    env = {"HOME": str(home)}
    assert new_settings([], work, env) == [".mcp.json"]
    for config in ("not json", json.dumps([1]), json.dumps({"projects": {str(work): {}}})):
        (home / ".claude.json").write_text(config)
        assert not trusted_by_claude(env, work)
    accepted = {"projects": {str(work): {"hasTrustDialogAccepted": True}}}
    (home / ".claude.json").write_text(json.dumps(accepted))
    assert trusted_by_claude(env, work) and new_settings([], work, env) == []
    assert not trusted_by_claude(env, tmp_path)  # another folder
    other = tmp_path / "config"
    other.mkdir()
    assert not trusted_by_claude({"HOME": str(home), "CLAUDE_CONFIG_DIR": str(other)}, work)


def test_the_question_names_the_files_and_the_way_on() -> None:
    text = trust_question([".claude/settings.json", ".mcp.json"])
    assert text.startswith(
        "This folder has Claude Code settings (.claude/settings.json, .mcp.json)"
    )
    assert "Trust this folder's settings" in text and '"trust_project": true' in text


def test_only_the_files_not_trusted_yet_are_new(tmp_path: Path) -> None:
    work = tmp_path / "repo" / "src"
    (work / ".claude").mkdir(parents=True)
    env = {"HOME": str(tmp_path / "home")}
    assert new_settings([], work, env) == []
    (work / ".claude" / "settings.json").write_text("{}")
    assert new_settings([".claude/settings.json"], work, env) == []
    (tmp_path / "repo" / ".mcp.json").write_text("{}")  # a git pull brought it
    assert new_settings([".claude/settings.json"], work, env) == ["../.mcp.json"]
    assert new_settings([], work, env) == [".claude/settings.json", "../.mcp.json"]
    (tmp_path / "repo" / ".mcp.json").unlink()  # gone again: nothing new
    assert new_settings([".claude/settings.json", "../.mcp.json"], work, env) == []


def test_a_refused_start_names_the_new_files_and_the_way_on() -> None:
    error = UntrustedSettings([".mcp.json", "../.mcp.json"])
    assert error.files == [".mcp.json", "../.mcp.json"]
    assert str(error).startswith(
        "Claude Code settings appeared in this folder since it was trusted"
        " (.mcp.json, ../.mcp.json)."
    )
    assert str(error).endswith("If you trust them, press Trust and resend.")


def test_a_git_repository_s_local_settings_act_in_its_subfolders(tmp_path: Path) -> None:
    """Claude Code loads the git repository's .claude/settings.local.json from a subfolder
    (tests/test_claude_relay.py shows it with the real CLI), not its .claude/settings.json."""
    repo, work = tmp_path / "repo", tmp_path / "repo" / "src"
    (repo / ".claude").mkdir(parents=True)
    work.mkdir()
    (repo / ".claude" / "settings.local.json").write_text("{}")
    (repo / ".claude" / "settings.json").write_text("{}")
    assert git_root(work) is None and project_settings(work) == []  # not a repository
    (repo / ".git").mkdir()
    assert git_root(work) == repo and git_root(repo) == repo
    assert project_settings(work) == ["../.claude/settings.local.json"]
    assert project_settings(repo) == [".claude/settings.json", ".claude/settings.local.json"]
    (work / ".git").write_text("gitdir: elsewhere")  # a worktree or submodule: its own root
    assert project_settings(work) == []


def test_a_stopped_agent_s_line_says_so_and_offers_trust_alone() -> None:
    text = str(UntrustedSettings([".claude/settings.json"], stopped=True))
    assert "change where the agent connects while it runs, so it was stopped." in text
    assert text.endswith("If you trust them, press Trust these settings.")
