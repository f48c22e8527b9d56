"""The command line starts the same way however it is called."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", ["app", "app.cli"])
def test_python_m_gives_the_oarlock_command(module: str) -> None:
    # `python -m app.cli serve` did nothing at all (exit 0, no output): no main guard.
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "serve" in done.stdout and "migrate" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("command", "env", "said"),
    [
        (["serve", "--port", "99999"], {}, "--port: Input should be less than or equal to 65535"),
        (["serve", "--port", "0"], {}, "--port: Input should be greater than or equal to 1"),
        (["migrate"], {"OARLOCK_PORT": "abc"}, "OARLOCK_PORT: Input should be a valid integer"),
        (["migrate"], {"OARLOCK_AGENT_MEMORY": "lots"}, "OARLOCK_AGENT_MEMORY: 'lots' is not"),
        (
            ["migrate"],
            {"OARLOCK_CONTEXT_SOFT": "100000", "OARLOCK_CONTEXT_HARD": "50000"},
            "The configuration: OARLOCK_CONTEXT_HARD must not be below OARLOCK_CONTEXT_SOFT.",
        ),
        (
            ["migrate"],
            {"OARLOCK_DATA_DIR": "{file}"},
            "The data directory {file} cannot be used: it is not a directory.",
        ),
        # An operator's review: each of these was taken and failed later, or said too little.
        (
            ["migrate"],
            {"OARLOCK_DATABASE_URL": "mysql://u@127.0.0.1/x"},
            "OARLOCK_DATABASE_URL: oarlock runs on SQLite (sqlite:////path/oarlock.db) or "
            "PostgreSQL (postgresql://…), not mysql",
        ),
        (
            ["migrate"],
            {"OARLOCK_DATABASE_URL": "sqlite:///:memory:"},
            "OARLOCK_DATABASE_URL: an in-memory SQLite database keeps nothing",
        ),
        (
            ["migrate"],
            {"OARLOCK_PUSH_CONTACT": "notaurl"},
            "OARLOCK_PUSH_CONTACT: must be a mailto: or https: URL",
        ),
        (
            ["migrate"],
            {"OARLOCK_PUSH_SERVICES": "https://push.example/x"},
            "OARLOCK_PUSH_SERVICES: 'https://push.example/x' is not a host name",
        ),
        (
            ["migrate"],
            {"OARLOCK_OPENAI_BASE_URL": "notaurl"},
            "OARLOCK_OPENAI_BASE_URL: must be an http:// or https:// URL with a host",
        ),
        (
            ["migrate"],
            {"OARLOCK_DEEPSEEK_BASE_URL": "https://"},
            "OARLOCK_DEEPSEEK_BASE_URL: must be an http:// or https:// URL with a host",
        ),
        (["migrate"], {"OARLOCK_NODE_ID": " "}, "OARLOCK_NODE_ID: must be a name"),
        (
            ["migrate"],
            {"OARLOCK_REDIS_URL": "redis://:sek@rit@127.0.0.1:1/0"},
            "OARLOCK_REDIS_URL: cannot be read as a Redis URL",
        ),
        (
            ["migrate"],
            {"OARLOCK_DATABASE_URL": "garbage"},
            "OARLOCK_DATABASE_URL: cannot be read as a database URL",
        ),
        # A self-hoster's review: each of these was a traceback, printed part of a password,
        # or was taken and failed later without naming its setting.
        (
            ["migrate"],
            {"OARLOCK_DATABASE_URL": "postgresql://u:sek@rit:1234@127.0.0.1:1/x"},
            "in a password, write @ as %40",
        ),
        (
            ["migrate"],
            {"OARLOCK_DATABASE_URL": "postgresql://u:ab@sekrit@127.0.0.1:1/x"},
            "OARLOCK_DATABASE_URL: cannot be read as a database URL",
        ),
        (["migrate"], {"OARLOCK_LOG_LEVEL": "loud"}, "OARLOCK_LOG_LEVEL: must be one of debug"),
        (["migrate"], {"OARLOCK_MAX_MESSAGE_BYTES": "0"}, "OARLOCK_MAX_MESSAGE_BYTES: Input"),
        (["migrate"], {"OARLOCK_REQUEST_TIMEOUT": "-1"}, "OARLOCK_REQUEST_TIMEOUT: Input"),
        (["migrate"], {"OARLOCK_AGENT_IDLE_TIMEOUT": "-5"}, "OARLOCK_AGENT_IDLE_TIMEOUT: Input"),
        (["migrate"], {"OARLOCK_DEMO_DELAY": "-1"}, "OARLOCK_DEMO_DELAY: Input"),
        (
            ["migrate"],
            {"OARLOCK_TRUSTED_PROXIES": "10.0.0.1,not-an-ip"},
            "OARLOCK_TRUSTED_PROXIES: 'not-an-ip' is not an IP address",
        ),
        (
            ["migrate"],
            {"OARLOCK_ALLOWED_HOSTS": "https://oar.example.com"},
            "OARLOCK_ALLOWED_HOSTS: 'https://oar.example.com' is not a host name",
        ),
        (
            ["migrate"],
            {"OARLOCK_ALLOWED_ORIGINS": "oar.example.com"},
            "OARLOCK_ALLOWED_ORIGINS: 'oar.example.com' is not an origin",
        ),
        (
            ["migrate"],
            {"OARLOCK_REDIS_URL": "http://127.0.0.1:1"},
            "OARLOCK_REDIS_URL: must start with redis://",
        ),
        (
            ["migrate"],
            {"OARLOCK_REDIS_URL": "redis://:sekrit/yz@127.0.0.1:1/0"},
            "OARLOCK_REDIS_URL: cannot be read as a Redis URL",
        ),
        (
            ["migrate"],
            {"OARLOCK_ALLOWED_HOSTS": "*"},
            "OARLOCK_ALLOWED_HOSTS: '*' is not a host name",
        ),
        (
            ["serve"],
            {"OARLOCK_WORKSPACE_ROOTS": "{file}/..", "OARLOCK_DEFAULT_CWD": "{file}.missing"},
            "OARLOCK_DEFAULT_CWD: {file}.missing is not a directory.",
        ),
        (
            ["serve"],
            {"OARLOCK_WORKSPACE_ROOTS": "{file}"},
            "OARLOCK_WORKSPACE_ROOTS: {file} is not a directory.",
        ),
        (
            ["serve"],
            {"OARLOCK_DEFAULT_CWD": "/"},
            "OARLOCK_DEFAULT_CWD: / is not inside OARLOCK_WORKSPACE_ROOTS",
        ),
        (
            ["serve"],
            {"OARLOCK_BACKUPS_DIR": "{file}"},
            "OARLOCK_BACKUPS_DIR: {file} is not a directory.",
        ),
        (
            ["serve"],
            {"OARLOCK_DEFAULT_PROVIDER": "gpt"},
            "OARLOCK_DEFAULT_PROVIDER: 'gpt' is not one of",
        ),
        (
            ["serve"],
            {"OARLOCK_HOST": "nosuchhost.invalid"},
            "The host nosuchhost.invalid cannot be used (OARLOCK_HOST or --host)",
        ),
        (
            ["serve"],
            {"OARLOCK_DATABASE_URL": "postgresql://u:sekrit@127.0.0.1:1/x"},
            "The database postgresql://u:***@127.0.0.1:1/x cannot be used: connection failed",
        ),
    ],
)
def test_a_setting_that_cannot_be_used_is_one_line_not_a_traceback(
    tmp_path: Path, command: list[str], env: dict[str, str], said: str
) -> None:
    # A dogfood run: a bad port printed a URL that did not answer, and a data directory that
    # is a file, a database URL that is not one, … each gave a 30-140 line traceback.
    file = tmp_path / "a-file"
    file.write_text("")
    last = refused(command, {k: v.format(file=file) for k, v in env.items()}, tmp_path)
    assert said.format(file=file) in last
    assert "sekrit" not in last
    assert not (tmp_path / "data" / "oarlock.db").exists()  # refused before making anything


def refused(command: list[str], env: dict[str, str], cwd: Path) -> str:
    """Run `python -m app <command>` with env as its only OARLOCK_* settings: it must end with
    status 1 and no traceback; its last line (serve logs its start before it)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OARLOCK_")}
    environ |= env
    done = subprocess.run(
        [sys.executable, "-m", "app", *command],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "sekrit" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def test_migrate_says_whether_it_created_upgraded_or_found_the_schema_current(
    tmp_path: Path,
) -> None:
    # It said "Database is up to date" also for a database it had just created.
    from alembic import command

    from app.migrate import alembic_config

    environ = {k: v for k, v in os.environ.items() if not k.startswith("OARLOCK_")}

    def migrate(data: Path) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "app", "migrate", "--data-dir", str(data)],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    head = alembic_config("sqlite://").get_main_option("script_location")
    newest = sorted(Path(head or "").glob("versions/0*.py"))[-1].name[:4]
    fresh = tmp_path / "fresh"
    assert migrate(fresh).startswith(f"Created the database's tables (schema {newest}): sqlite:")
    assert migrate(fresh).startswith(f"Database is up to date (schema {newest}): sqlite:")
    old = tmp_path / "old"
    old.mkdir()
    command.upgrade(alembic_config(f"sqlite:///{old / 'oarlock.db'}"), "0012")
    said = migrate(old)
    assert said.startswith(f"Upgraded the database's schema 0012 → {newest}: sqlite:"), said


def test_a_database_a_newer_oarlock_migrated_is_refused_in_one_line(tmp_path: Path) -> None:
    # A self-hoster's review: going back to an older oarlock gave an Alembic traceback.
    env = {"OARLOCK_DATA_DIR": str(tmp_path / "data")}
    migrated = subprocess.run(
        [sys.executable, "-m", "app", "migrate"],
        env={**os.environ, **env},
        capture_output=True,
        timeout=60,
    )
    assert migrated.returncode == 0
    with sqlite3.connect(tmp_path / "data" / "oarlock.db") as database:
        database.execute("UPDATE alembic_version SET version_num = '0099'")
    assert refused(["migrate"], env, tmp_path).endswith(
        "was migrated by a newer oarlock (Can't locate revision identified by '0099'): "
        "run that version, or restore a copy of the data taken before."
    )


def test_a_port_another_program_listens_on_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"OARLOCK_PORT": str(port), "OARLOCK_DATA_DIR": str(tmp_path / "data")}
        env["OARLOCK_WORKSPACE_ROOTS"] = str(tmp_path)
        assert refused(["serve"], env, tmp_path) == (
            f"The port {port} is in use (OARLOCK_PORT or --port): another program listens "
            "there. If it is oarlock, it is running already."
        )


@pytest.mark.skipif(os.geteuid() != 0, reason="Claude Code refuses it as root only")
def test_a_default_mode_claude_code_refuses_here_is_refused_at_start(tmp_path: Path) -> None:
    env = {"OARLOCK_PERMISSION_MODE": "bypassPermissions", "OARLOCK_DATA_DIR": str(tmp_path)}
    line = refused(["serve"], env | {"OARLOCK_WORKSPACE_ROOTS": str(tmp_path)}, tmp_path)
    assert line.startswith(
        "OARLOCK_PERMISSION_MODE: Claude Code refuses bypassPermissions when it runs as root"
    )


def test_the_token_is_printed_to_a_terminal_only(tmp_path: Path) -> None:
    """Found by an operator review: under the documented systemd unit the start's URL, token
    included, went to the journal at every start (readable by more people than the relay's
    own files). A terminal still gets the URL to open, token included."""
    from tests.crash import TOKEN, RelayProcess
    from tests.test_polish_serve import TOKEN as SERVE_TOKEN
    from tests.test_polish_serve import run_serve, stop

    relay = RelayProcess(tmp_path / "logged").start()  # its output: a file
    try:
        deadline = time.monotonic() + 30
        while "oarlock is running" not in relay.log.read_text():
            assert time.monotonic() < deadline, relay.log.read_text()
            time.sleep(0.05)
        said = relay.log.read_text()
        assert TOKEN not in said
        assert "and log in with the token (OARLOCK_TOKEN): it is shown in a terminal only." in said
    finally:
        relay.close()
    lines, port, process = run_serve(tmp_path / "terminal")  # its output: a terminal
    rest = stop(process)
    assert lines[-1].strip() == f"http://127.0.0.1:{port}/?token={SERVE_TOKEN}"
    assert not [line for line in lines + rest if "shown in a terminal only" in line]
