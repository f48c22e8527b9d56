"""The real `claude` CLI run as a user runs it in a terminal (the user's environment, a cwd)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import claude_agent_sdk

CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
TIMEOUT = 60


def terminal(cwd: Path, prompt: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `claude -p` in cwd with this process's environment, as a terminal user would."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [str(CLI), "-p", prompt, *args],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
