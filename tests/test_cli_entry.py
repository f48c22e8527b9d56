"""The command line starts the same way however it is called."""

from __future__ import annotations

import subprocess
import sys
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
