"""Shared fixtures: a live relay per test, the fake Messages API, and Debian's Chromium."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.agents.copilot import INSTALL_HINT, copilot_cli_path
from app.db import make_engine
from tests import postgres
from tests.browser import Pages
from tests.claude_env import use_fake_anthropic
from tests.fake_anthropic import FakeAnthropic
from tests.relay import HANGS_ENV, LiveRelay, make_settings, migrated


def pytest_configure(config: pytest.Config) -> None:
    """The run's file of relays that did not stop (report_hang), shared with the workers."""
    if not hasattr(config, "workerinput"):  # the controller (or a run without workers)
        folder = tempfile.mkdtemp(prefix="oarlock-hangs-")
        atexit.register(shutil.rmtree, folder, True)  # after the summary has shown it
        os.environ[HANGS_ENV] = str(Path(folder) / "hangs.txt")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Show where each relay that did not stop was stuck (the tests went on without it)."""
    path = os.environ.get(HANGS_ENV)
    if hasattr(config, "workerinput") or path is None or not Path(path).is_file():
        return
    terminalreporter.section("relays that did not stop")
    terminalreporter.write(Path(path).read_text(encoding="utf-8"))


@pytest.fixture(scope="session", autouse=True)
def postgres_server() -> Iterator[None]:
    """With OARLOCK_TEST_DB=postgres, one throwaway PostgreSQL server for the whole session."""
    try:
        if postgres.SELECTED == "postgres":
            postgres.start()
        yield
    finally:
        postgres.stop()  # even when a test failed: nothing is left running


@pytest.fixture(autouse=True)
def drop_test_databases() -> Iterator[None]:
    """Drop the PostgreSQL databases a test created (after its relay has stopped)."""
    try:
        yield
    finally:
        postgres.drop_created()


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A fresh database: a SQLite file, or PostgreSQL with OARLOCK_TEST_DB=postgres."""
    return postgres.database_url(tmp_path) or f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture
def engine(url: str) -> Iterator[Engine]:
    """An engine on a fresh, migrated database of the kind under test (a file may override it)."""
    migrated(url)
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    """The fake Anthropic Messages API the real CLI talks to (a file may override `fake`)."""
    with FakeAnthropic() as server:
        yield server


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeAnthropic) -> Path:
    """The agent environment the relay passes on: a fresh HOME and the fake API."""
    return use_fake_anthropic(monkeypatch, tmp_path / "home", fake.base_url)


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[LiveRelay]:
    """A running relay with the demo agent, on a fresh SQLite file (or PostgreSQL database)."""
    with LiveRelay(make_settings(tmp_path / "data")) as live:
        yield live


@pytest.fixture
def pages(browser: Any) -> Iterator[Pages]:
    """Logged-in, watched browser pages (tests/browser.py); closed after the test."""
    watched = Pages(browser)
    try:
        yield watched
    finally:
        watched.close()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """Launch Debian's Chromium (Playwright's own browsers are never downloaded)."""
    executable = os.environ.get("OARLOCK_TEST_CHROMIUM") or shutil.which("chromium")
    args = [*browser_type_launch_args.get("args", []), "--disable-gpu", "--disable-quic"]
    return {**browser_type_launch_args, "executable_path": executable, "args": args}


@pytest.fixture(scope="session")
def cli() -> str:
    """The installed Copilot CLI; its absence fails the tests (make test installs it)."""
    path = copilot_cli_path(os.environ.get("OARLOCK_COPILOT_CLI"))
    if path is None or not os.access(path, os.X_OK):
        pytest.fail(f"The Copilot CLI is not installed. {INSTALL_HINT}", pytrace=False)
    return path


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One HOME for every Copilot test: the CLI unpacks itself (~235 MB) under it once."""
    return tmp_path_factory.mktemp("copilot-home")
