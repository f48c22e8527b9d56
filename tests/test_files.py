"""The composer's @ completion: ranking paths, listing a working directory, the API."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from app import files
from app.files import FileLists, list_files, rank
from tests.relay import LiveRelay

PATHS = [
    "docs/readme-old.txt",
    "README.md",
    "app/reader.py",
    "tests/test_reader.py",
    "app/main.py",
    "static/r/e/a/d.js",
]


def test_rank_prefers_a_name_that_starts_with_the_query() -> None:
    assert rank(PATHS, "rea") == [
        "README.md",  # the name starts with it, shortest first
        "app/reader.py",
        "docs/readme-old.txt",
        "tests/test_reader.py",  # the name contains it
        "static/r/e/a/d.js",  # its letters in order
    ]


def test_rank_matches_the_path_and_letters_in_order_case_insensitively() -> None:
    assert rank(PATHS, "APP/M") == ["app/main.py"]
    assert rank(PATHS, "tsrd") == ["tests/test_reader.py"]
    assert rank(PATHS, "zz") == []


def test_rank_with_no_query_gives_the_shortest_paths_first() -> None:
    assert rank(PATHS, "", limit=3) == ["README.md", "app/main.py", "app/reader.py"]


def tree(root: Path) -> Path:
    for name in (
        "src/app.py",
        "src/lib/util.py",
        "notes.txt",
        ".hidden/secret.txt",
        "node_modules/pkg/index.js",
        "build/out.bin",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    return root


def test_a_plain_directory_is_walked_without_hidden_or_dependency_directories(
    tmp_path: Path,
) -> None:
    files, truncated = list_files(tree(tmp_path))
    assert (files, truncated) == (["notes.txt", "src/app.py", "src/lib/util.py"], False)
    assert list_files(tmp_path, limit=2) == (["notes.txt", "src/app.py"], True)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_git_work_tree_lists_what_git_does_ignored_files_left_out(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / ".gitignore").write_text("notes.txt\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "src/app.py"], cwd=root, check=True)
    (root / "gone.txt").write_text("x")
    subprocess.run(["git", "add", "gone.txt"], cwd=root, check=True)
    (root / "gone.txt").unlink()  # tracked, deleted: not offered (a dogfood run saw it offered)
    files, truncated = list_files(root)
    # tracked and untracked alike, .gitignore obeyed; git's rules, not the walk's
    assert sorted(files) == sorted(
        [
            ".gitignore",
            ".hidden/secret.txt",
            "build/out.bin",
            "node_modules/pkg/index.js",
            "src/app.py",
            "src/lib/util.py",
        ]
    )
    assert not truncated


def test_a_listing_is_kept_for_a_while(tmp_path: Path) -> None:
    lists = FileLists()
    assert lists.get(tree(tmp_path))[0] == ["notes.txt", "src/app.py", "src/lib/util.py"]
    (tmp_path / "later.txt").write_text("x")
    assert "later.txt" not in lists.get(tmp_path)[0]  # a burst of keystrokes lists once


def test_the_api_ranks_the_files_of_the_conversation_s_directory(relay: LiveRelay) -> None:
    cwd = tree(relay.settings.roots[0] / "work" / "project")
    cid = relay.create(cwd=str(cwd))["id"]
    found = relay.http.get(f"/api/conversations/{cid}/files", params={"q": "util"})
    assert found.status_code == 200
    assert found.json() == {"files": ["src/lib/util.py"], "truncated": False}
    assert relay.http.get("/api/conversations/999/files").status_code == 404
    stranger = httpx.get(f"{relay.base}/api/conversations/{cid}/files", params={"q": "util"})
    assert stranger.status_code == 401  # the names of the files are the owner's to see
    long = relay.http.get(f"/api/conversations/{cid}/files", params={"q": "x" * 201})
    assert long.status_code == 422
    shutil.rmtree(cwd)  # gone since the conversation was made: said, not a 500
    gone = relay.http.get(f"/api/conversations/{cid}/files", params={"q": "zz"})
    assert gone.status_code == 409
    assert gone.json() == {"detail": f"The working directory {cwd} does not exist."}


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_repository_s_own_config_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a hostile review: `git ls-files --others` ran the repository's core.fsmonitor
    (a file an agent or an unpacked archive can write) with the relay's whole environment."""
    root = tree(tmp_path / "repo")
    ran = tmp_path / "ran"
    git(root, "init", "-q")
    git(root, "config", "core.fsmonitor", f"env > {ran}; false")
    monkeypatch.setenv("OARLOCK_TOKEN", "secret-token")
    files, _ = list_files(root)
    assert "src/app.py" in files  # git's list
    assert not ran.exists()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_repository_above_the_workspace_roots_is_not_used(tmp_path: Path) -> None:
    """A home's dotfiles repository ignoring everything (`*`) listed nothing below it."""
    git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("*\n")
    root = tree(tmp_path / "work")
    assert list_files(root)[0] == []  # without the ceiling: the home's repository's rules
    assert list_files(root, ceiling=[root])[0] == ["notes.txt", "src/app.py", "src/lib/util.py"]


def test_names_that_are_not_utf8_are_left_out(tmp_path: Path) -> None:
    (tree(tmp_path) / os.fsdecode(b"caf\xe9.txt")).write_text("x")  # a JSON answer cannot hold it
    assert list_files(tmp_path)[0] == ["notes.txt", "src/app.py", "src/lib/util.py"]


@pytest.mark.parametrize("in_git", [False, True])
def test_names_with_a_control_character_are_left_out(tmp_path: Path, in_git: bool) -> None:
    # A review: "new\nline.txt" was offered, and picking it put a newline in the composer.
    root = tree(tmp_path)
    for name in ("new\nline.txt", "bell\x07.txt", "c1\x85.txt", "tab\there.txt"):
        (root / name).write_text("x")
    (root / "rtl\u202etxt.exe").write_text("x")  # a format character: shown as its code
    if in_git:
        git(root, "init", "-q")
    listed = list_files(root)[0]
    assert "src/app.py" in listed and "rtl\u202etxt.exe" in listed
    assert [name for name in listed if name.endswith(".txt") and "/" not in name] == ["notes.txt"]


def test_a_walk_stops_at_its_time_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "WALK_SECONDS", 0.0)  # spent after the first directory
    assert list_files(tree(tmp_path)) == (["notes.txt"], True)


def test_a_listing_is_made_again_once_old_and_once_for_callers_at_the_same_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real = files.list_files

    def counted(root: Path, ceiling: object = ()) -> tuple[list[str], bool]:
        calls.append(root)
        time.sleep(0.2)  # a slow tree: the other callers come while it is listed
        return real(root)

    monkeypatch.setattr(files, "list_files", counted)
    lists = FileLists()
    root = tree(tmp_path)
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda _: lists.get(root), range(4)))
    assert len(calls) == 1 and all(a == answers[0] for a in answers)
    monkeypatch.setattr(files, "CACHE_SECONDS", 0.0)  # old at once: listed again
    (root / "later.txt").write_text("x")
    assert "later.txt" in lists.get(root)[0]
    assert len(calls) == 2
