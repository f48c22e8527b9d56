"""The Changes view: git's parsing, a real repository's changes through the API, and a
repository whose own config tries to run commands."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from app import changes, files
from app.changes import (
    ChangesError,
    changes_view,
    diff_lines,
    file_diff,
    open_repo,
    parse_name_status,
    parse_numstat,
)
from app.git import GitResult, GitTimeout
from tests.relay import LiveRelay

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(root: Path, *args: str) -> str:
    found = subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True)
    return found.stdout


def repo(root: Path) -> Path:
    """A repository with one commit: a.txt (3 lines), old.txt, gone.txt, logo.bin."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "me@example.com")
    git(root, "config", "user.name", "Me")
    (root / "a.txt").write_text("one\ntwo\nthree\n")
    (root / "old.txt").write_text("".join(f"line {n}\n" for n in range(20)))
    (root / "gone.txt").write_text("bye\n")
    (root / "logo.bin").write_bytes(b"\x89PNG\0\0\0")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    return root


def change(root: Path) -> None:
    """Every kind of change: modified, staged new, deleted, renamed, binary, untracked."""
    (root / "a.txt").write_text("one\n2\nthree\nfour\n")
    (root / "new.py").write_text("print('hi')\n")
    git(root, "add", "new.py")
    (root / "gone.txt").unlink()
    git(root, "mv", "old.txt", "renamed.txt")
    (root / "logo.bin").write_bytes(b"\x89PNG\0\0\1")
    (root / "notes").mkdir()
    (root / "notes" / "todo.md").write_text("- a\n- b")
    (root / ".gitignore").write_text("*.log\n")
    (root / "debug.log").write_text("ignored\n")


def test_parsing_git_s_lists() -> None:
    named = b"M\0a.txt\0R087\0old name.txt\0new name.txt\0A\0b\0"
    assert parse_name_status(named) == [
        ("M", "a.txt", None),
        ("R", "new name.txt", "old name.txt"),
        ("A", "b", None),
    ]
    counted = b"1\t2\ta.txt\0-\t-\tlogo.bin\0" + b"3\t0\t\0old name.txt\0new name.txt\0"
    assert parse_numstat(counted) == {
        "a.txt": (1, 2),
        "logo.bin": (None, None),
        "new name.txt": (3, 0),
    }
    assert parse_name_status(b"") == [] and parse_numstat(b"") == {}
    header = b"diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@ f\n-a\n+b\n"
    assert diff_lines(header) == (["@@ -1 +1 @@ f", "-a", "+b"], False)
    assert diff_lines(b"diff --git a/x b/x\nBinary files a/x and b/x differ\n") == ([], True)
    assert diff_lines(b"diff --git a/x b/x\nold mode 100644\nnew mode 100755\n") == ([], False)


def test_every_kind_of_change_is_listed_with_its_lines(tmp_path: Path) -> None:
    root = repo(tmp_path / "project")
    change(root)
    view = changes_view(root, [tmp_path])
    assert view["repo"] is True and view["branch"] == "main" and view["truncated"] is False
    assert view["root"] == str(root.resolve())
    assert view["head"] == git(root, "rev-parse", "HEAD").strip()[:12]
    found = {f["path"]: f for f in view["files"]}
    assert [f["path"] for f in view["files"]] == [
        "a.txt",
        "gone.txt",
        "logo.bin",
        "new.py",
        "renamed.txt",
        ".gitignore",  # the untracked ones after the tracked ones (debug.log is ignored)
        "notes/todo.md",
    ]
    assert found["a.txt"] | {} == {
        "path": "a.txt",
        "status": "modified",
        "old_path": None,
        "added": 2,
        "removed": 1,
        "binary": False,
        "directory": False,
    }
    assert (found["gone.txt"]["status"], found["gone.txt"]["removed"]) == ("deleted", 1)
    assert found["logo.bin"]["binary"] is True and found["logo.bin"]["added"] is None
    assert (found["new.py"]["status"], found["new.py"]["added"]) == ("added", 1)
    assert found["renamed.txt"]["status"] == "renamed"
    assert found["renamed.txt"]["old_path"] == "old.txt"
    assert (found["notes/todo.md"]["status"], found["notes/todo.md"]["added"]) == ("untracked", 2)


def test_a_file_s_diff_from_the_last_commit(tmp_path: Path) -> None:
    root = repo(tmp_path / "project")
    change(root)
    found = open_repo(root / "notes", [tmp_path])  # a subdirectory: the repository's changes
    assert found is not None and found.top == root.resolve()
    diff = file_diff(found, "a.txt")
    assert diff["diff"] == ["@@ -1,3 +1,4 @@", " one", "-two", "+2", " three", "+four"]
    assert (diff["more"], diff["cut"], diff["binary"]) == (0, False, False)
    assert file_diff(found, "notes/todo.md")["diff"] == [
        "@@ -0,0 +1,2 @@",
        "+- a",
        "+- b",
        "\\ No newline at end of file",
    ]
    assert file_diff(found, "renamed.txt", "old.txt")["diff"] == []  # moved whole: no change
    alone = file_diff(found, "renamed.txt")  # without its old path: a file added
    assert (alone["status"], alone["diff"][0]) == ("added", "@@ -0,0 +1,20 @@")
    assert file_diff(found, "logo.bin")["binary"] is True
    assert file_diff(found, "gone.txt")["diff"] == ["@@ -1 +0,0 @@", "-bye"]
    with pytest.raises(changes.NoSuchChange):
        file_diff(found, "debug.log")  # ignored: not a change
    with pytest.raises(changes.NoSuchChange):
        file_diff(found, "../outside.txt")


def test_a_long_diff_is_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = repo(tmp_path / "project")
    (root / "a.txt").write_text("".join(f"{n}\n" for n in range(50)))
    monkeypatch.setattr(changes, "MAX_DIFF_LINES", 10)
    found = open_repo(root, [tmp_path])
    assert found is not None
    diff = file_diff(found, "a.txt")
    assert len(diff["diff"]) == 10 and diff["more"] == 44  # a hunk header and 53 lines
    monkeypatch.setattr(changes, "MAX_DIFF_BYTES", 40)
    diff = file_diff(found, "a.txt")
    assert diff["cut"] is True and len(diff["diff"]) < 10


def test_before_the_first_commit_everything_is_new(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    root.mkdir()
    git(root, "init", "-q", "-b", "trunk")
    (root / "staged.txt").write_text("a\n")
    git(root, "add", "staged.txt")
    (root / "loose.txt").write_text("b\n")
    view = changes_view(root, [tmp_path])
    assert (view["branch"], view["head"]) == ("trunk", None)
    assert [(f["path"], f["status"]) for f in view["files"]] == [
        ("staged.txt", "added"),
        ("loose.txt", "untracked"),
    ]


def test_a_detached_head_and_a_plain_directory(tmp_path: Path) -> None:
    root = repo(tmp_path / "project")
    git(root, "checkout", "-q", "--detach")
    view = changes_view(root, [tmp_path])
    assert view["branch"] is None and view["head"] is not None and view["files"] == []
    plain = tmp_path / "plain"
    plain.mkdir()
    assert changes_view(plain, [tmp_path]) == {
        "repo": False,
        "root": None,
        "branch": None,
        "head": None,
        "files": [],
        "truncated": False,
    }


def test_the_list_is_cut_at_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = repo(tmp_path / "project")
    for n in range(5):
        (root / f"u{n}.txt").write_text("x\n")
    monkeypatch.setattr(changes, "MAX_FILES", 3)
    view = changes_view(root, [tmp_path])
    assert [f["path"] for f in view["files"]] == ["u0.txt", "u1.txt", "u2.txt"]
    assert view["truncated"] is True


def test_a_repository_s_own_config_runs_nothing(tmp_path: Path) -> None:
    """An agent that may only edit files could otherwise run commands through the relay: a
    filter's clean and process commands, an external diff, a textconv, fsmonitor and a
    post-index-change hook are each a command in .git/config that a plain `git diff` runs."""
    root = repo(tmp_path / "project")
    ran = tmp_path / "ran"
    hooks = root / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "post-index-change").write_text(f"#!/bin/sh\necho hook >> {ran}\n")
    (hooks / "post-index-change").chmod(0o755)
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n")
    settings = {
        "filter.evil.clean": f"echo clean >> {ran}; cat",
        "filter.evil.process": f"echo process >> {ran}",
        "filter.evil.required": "true",
        "filter.e.v.i.l.clean": f"echo dotted >> {ran}; cat",
        "diff.evil.command": f"echo command >> {ran}",
        "diff.evil.textconv": f"echo textconv >> {ran}; cat",
        "diff.external": f"echo external >> {ran}",
        "core.fsmonitor": f"echo fsmonitor >> {ran}; false",
        "color.diff": "always",
        "diff.noprefix": "true",
    }
    for key, value in settings.items():
        git(root, "config", key, value)
    (root / "a.txt").write_text("one\nTWO\nthree\n")
    os.utime(root / "a.txt", (1, 1))  # stat-dirty: git reads it again
    (root / "loose.txt").write_text("x\n")
    unsafe = subprocess.run(["git", "diff", "HEAD"], cwd=root, capture_output=True, check=False)
    assert ran.exists(), unsafe  # (the test's premise: plain git runs them)
    ran.unlink()
    view = changes_view(root, [tmp_path])
    found = open_repo(root, [tmp_path])
    assert found is not None
    assert file_diff(found, "a.txt")["diff"] == [
        "@@ -1,3 +1,3 @@",
        " one",
        "-two",
        "+TWO",
        " three",
    ]
    assert file_diff(found, "loose.txt")["diff"] == ["@@ -0,0 +1 @@", "+x"]
    assert {f["path"] for f in view["files"]} == {"a.txt", ".gitattributes", "loose.txt"}
    assert not ran.exists(), ran.read_text()


def test_a_work_tree_outside_the_roots_is_refused(tmp_path: Path) -> None:
    root = repo(tmp_path / "roots" / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    git(root, "config", "core.worktree", str(elsewhere))
    with pytest.raises(ChangesError, match="outside the workspace roots"):
        changes_view(root, [tmp_path / "roots"])


def test_an_untracked_symlink_shows_its_target_s_name_not_its_content(tmp_path: Path) -> None:
    root = repo(tmp_path / "project")
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret\n")
    (root / "link").symlink_to(secret)
    view = changes_view(root, [tmp_path])
    assert [(f["path"], f["added"]) for f in view["files"]] == [("link", None)]
    found = open_repo(root, [tmp_path])
    assert found is not None
    assert file_diff(found, "link")["diff"][1] == f"+{secret}"
    # A link to a folder too (a review: an empty entry); its folder is not listed.
    (root / "folder-link").symlink_to(tmp_path)
    assert file_diff(found, "folder-link")["diff"] == ["@@ -0,0 +1 @@", f"+{tmp_path}"]


def test_the_api(relay: LiveRelay) -> None:
    root = repo(relay.settings.roots[0] / "work" / "project")
    change(root)
    cid = relay.create(cwd=str(root / "notes"))["id"]
    listed = relay.http.get(f"/api/conversations/{cid}/changes")
    assert listed.status_code == 200, listed.text
    assert listed.json()["root"] == str(root.resolve())
    assert len(listed.json()["files"]) == 7
    diff = relay.http.get(f"/api/conversations/{cid}/changes/diff", params={"path": "a.txt"})
    assert diff.status_code == 200 and diff.json()["diff"][0] == "@@ -1,3 +1,4 @@"
    missing = relay.http.get(f"/api/conversations/{cid}/changes/diff", params={"path": "zz"})
    assert missing.status_code == 404 and missing.json() == {"detail": "No change to zz."}
    assert relay.http.get(f"/api/conversations/{cid}/changes/diff").status_code == 422
    assert relay.http.get("/api/conversations/999/changes").status_code == 404
    stranger = httpx.get(f"{relay.base}/api/conversations/{cid}/changes")
    assert stranger.status_code == 401  # what changed is the owner's to see
    plain = relay.settings.roots[0] / "work" / "plain"
    plain.mkdir()
    other = relay.create(cwd=str(plain))["id"]
    assert relay.http.get(f"/api/conversations/{other}/changes").json()["repo"] is False
    no_repo = relay.http.get(f"/api/conversations/{other}/changes/diff", params={"path": "x"})
    assert no_repo.status_code == 409
    assert no_repo.json() == {"detail": "The working directory is not in a git repository."}
    shutil.rmtree(plain)
    gone = relay.http.get(f"/api/conversations/{other}/changes")
    assert gone.status_code == 409
    assert gone.json() == {"detail": f"The working directory {plain} does not exist."}


def test_without_git_the_api_says_so(relay: LiveRelay, monkeypatch: pytest.MonkeyPatch) -> None:
    root = repo(relay.settings.roots[0] / "work" / "project")
    cid = relay.create(cwd=str(root))["id"]
    monkeypatch.setenv("PATH", str(root))  # no git on it
    answer = relay.http.get(f"/api/conversations/{cid}/changes")
    assert answer.status_code == 409
    assert answer.json() == {
        "detail": "git is not installed on the relay's machine: the changes cannot be shown."
    }


def test_a_missing_object_is_not_fetched_through_the_repository_s_remote(tmp_path: Path) -> None:
    """Found by a review: a partial clone's missing object made git fetch it through the
    remote the config names, whose `uploadpack` is a command: two files an agent can write
    (.git/config, and a ref naming a commit that is not there) ran it."""
    root = repo(tmp_path / "project")
    ran = tmp_path / "ran"
    with (root / ".git" / "config").open("a") as config:
        config.write(
            "[core]\n\trepositoryformatversion = 1\n[extensions]\n\tpartialClone = origin\n"
            f'[remote "origin"]\n\turl = {root}\n\tpromisor = true\n'
            f'\tuploadpack = "echo ran >> {ran}; false"\n'
        )
    (root / ".git" / "refs" / "heads" / "main").write_text("1" * 40 + "\n")
    plain = ["git", "rev-parse", "-q", "--verify", "HEAD^{commit}"]
    subprocess.run(plain, cwd=root, capture_output=True, check=False)
    assert ran.exists()  # (the premise: plain git runs it)
    ran.unlink()
    with contextlib.suppress(ChangesError):  # (what git says of the missing commit)
        changes_view(root, [tmp_path])
    assert not ran.exists()


def test_an_untracked_repository_inside_is_listed_as_a_folder(tmp_path: Path) -> None:
    """Found by a review: git lists it as "sub/"; reading it as a file failed the whole view
    (a 500) and left a file descriptor open each time."""
    root = repo(tmp_path / "project")
    (root / "sub").mkdir()
    git(root / "sub", "init", "-q")
    (root / "sub" / "f.txt").write_text("x\n")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        view = changes_view(root, [tmp_path])
    assert len(os.listdir("/proc/self/fd")) == before
    assert view["files"] == [
        {
            "path": "sub/",
            "status": "untracked",
            "old_path": None,
            "added": None,
            "removed": None,
            "binary": False,
            "directory": True,
        }
    ]
    found = open_repo(root, [tmp_path])
    assert found is not None
    assert file_diff(found, "sub/")["diff"] == []


def test_a_git_directory_outside_the_roots_is_refused(tmp_path: Path) -> None:
    """Found by a review: a `.git` file pointing at a repository outside the roots showed its
    committed files (as deleted lines), and the @ list its names."""
    secret = repo(tmp_path / "outside" / "secret")
    inside = tmp_path / "roots" / "project"
    inside.mkdir(parents=True)
    (inside / ".git").write_text(f"gitdir: {secret / '.git'}\n")
    roots = [tmp_path / "roots"]
    with pytest.raises(ChangesError, match="outside the workspace roots"):
        changes_view(inside, roots)
    assert files.list_files(inside, roots) == ([".git"], False)  # walked: no names from there
    borrowing = repo(tmp_path / "roots" / "borrowing")
    alternates = borrowing / ".git" / "objects" / "info" / "alternates"
    alternates.write_text(f"{secret / '.git' / 'objects'}\n")
    with pytest.raises(ChangesError, match="outside the workspace roots"):
        changes_view(borrowing, roots)


def test_lists_cut_short_are_read_up_to_their_last_whole_record() -> None:
    """Found by a review: a list cut at its size limit in the middle of a record failed the
    whole view (a 500)."""
    assert parse_name_status(b"M\0a\0R100\0old") == [("M", "a", None)]
    assert parse_name_status(b"M\0a\0R100\0old\0new") == [("M", "a", None)]
    assert parse_name_status(b"M\0a\0M\0b") == [("M", "a", None)]
    assert parse_numstat(b"1\t2\ta\0" + b"3\t0") == {"a": (1, 2)}
    assert parse_numstat(b"1\t2\ta\0" + b"3\t0\t\0old\0new") == {"a": (1, 2)}
    assert parse_numstat(b"1\t2\ta\0x\ty\tb\0") == {"a": (1, 2)}


def test_a_line_ends_only_at_a_newline() -> None:
    """Found by a review: an added line holding U+2028 was shown as two, its second half a
    fake removed line."""
    out = "@@ -1 +1 @@\n-a\n+# ok\u2028-    check(user)\f\r\n".encode()
    assert diff_lines(out) == (["@@ -1 +1 @@", "-a", "+# ok\u2028-    check(user)\f"], False)


def test_odd_names_big_files_and_too_many_filters(tmp_path: Path) -> None:
    root = repo(tmp_path / "project")
    (root / "-").write_text("x\n")  # not git's standard input
    (root / "big.txt").write_text("line\n" * 1_800_000)  # 9 MB: compared as binary
    git(root, "add", "big.txt")
    found = open_repo(root, [tmp_path])
    assert found is not None
    assert file_diff(found, "-")["diff"] == ["@@ -0,0 +1 @@", "+x"]
    big = file_diff(found, "big.txt")
    assert (big["binary"], big["diff"]) == (True, [])
    for n in range(65):
        git(root, "config", f"filter.f{n}.clean", "cat")
    with pytest.raises(ChangesError, match="names 65 filter drivers; at most 64"):
        open_repo(root, [tmp_path])


def test_git_s_error_line_is_the_one_said() -> None:
    said = GitResult(128, b"", "warning: lazy fetching disabled\nfatal: bad object HEAD\n")
    assert said.reason() == "bad object HEAD"
    assert GitResult(1, b"", "").reason() == "git exited with 1"


def test_one_answer_s_git_commands_share_a_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/api.md: all of one answer's git commands together run for at most
    REQUEST_SECONDS; past it the next one is not started (a 409 through the API)."""
    root = repo(tmp_path / "project")
    monkeypatch.setattr(changes, "REQUEST_SECONDS", 0.0)
    with pytest.raises(GitTimeout, match="ran past 0 s"):
        changes_view(root, [tmp_path])
