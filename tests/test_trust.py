"""A folder's own Claude Code settings: found, and trusted only when Claude Code says so."""

from __future__ import annotations

import json
from pathlib import Path

from app.trust import project_settings, trust_question, trusted_by_claude, untrusted_settings


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
    assert untrusted_settings(work, env) == [".mcp.json"]
    for config in ("not json", json.dumps([1]), json.dumps({"projects": {str(work): {}}})):
        (home / ".claude.json").write_text(config)
        assert not trusted_by_claude(env, work)
    accepted = {"projects": {str(work): {"hasTrustDialogAccepted": True}}}
    (home / ".claude.json").write_text(json.dumps(accepted))
    assert trusted_by_claude(env, work) and untrusted_settings(work, env) == []
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
