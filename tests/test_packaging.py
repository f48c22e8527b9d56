"""`pip install .` (not editable) gives a relay that runs: the wheel carries its files.

Offline: the wheel is built with the test environment's setuptools (--no-build-isolation)
and installed with --no-deps into a fresh venv that borrows the test environment's
dependencies through a .pth file (path lines only: the editable install's finder stays out).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx

from tests.relay import TOKEN, free_port

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("static", "templates", "alembic")


def run(*command: str | Path, cwd: Path, env: dict[str, str]) -> str:
    """Run a command to completion; its output, or the failure with everything it said."""
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would import the checkout instead of the wheel."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("OARLOCK")}
    return {**env, **extra}


def build_wheel(tmp_path: Path) -> Path:
    """Build the wheel from a copy of the sources (the checkout gets no build/ or egg-info)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("app", *SHIPPED):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    pip = (sys.executable, "-m", "pip")
    run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, source,
        cwd=tmp_path, env=clean_env())  # fmt: skip
    (wheel,) = dist.glob("oarlock-*.whl")
    return wheel


def fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    """A new venv with the wheel installed and the test environment's packages visible."""
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path, env=clean_env())
    (site,) = venv.glob("lib/python*/site-packages")
    borrowed = [entry for entry in sys.path if entry.endswith("site-packages")]
    (site / "borrowed.pth").write_text("".join(f"{entry}\n" for entry in borrowed))
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
        wheel, cwd=tmp_path, env=clean_env())  # fmt: skip
    return venv


def test_wheel_carries_static_templates_and_migrations(tmp_path: Path) -> None:
    names = set(zipfile.ZipFile(build_wheel(tmp_path)).namelist())
    tracked = run("git", "ls-files", *SHIPPED, cwd=ROOT, env=clean_env()).split()
    wanted = {f"app/{name}" for name in tracked if not name.endswith("README")}
    assert wanted - names == set()
    assert "app/static/app.js" in names
    assert "app/alembic/env.py" in names


def test_installed_wheel_migrates_and_serves_from_another_directory(tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path, build_wheel(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = tmp_path / "data"
    port = free_port()
    env = clean_env(OARLOCK_TOKEN=TOKEN, OARLOCK_PORT=str(port), OARLOCK_DATA_DIR=str(data))
    where = run(venv / "bin" / "python", "-c", "import app; print(app.__file__)", cwd=elsewhere,
                env=env)  # fmt: skip
    assert where.startswith(str(venv)), where  # the installed copy, not the checkout
    migrated = run(venv / "bin" / "oarlock", "migrate", cwd=elsewhere, env=env)
    assert "Created the database's tables" in migrated
    server = subprocess.Popen(
        [venv / "bin" / "oarlock", "serve"],
        cwd=elsewhere,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, server.communicate()[1]
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the installed relay did not start"
                time.sleep(0.1)
            page = client.get("/")
            assert page.status_code == 200
            assert '<script type="module" src="/static/app.js' in page.text
            script = client.get("/static/timeline.js")
            assert script.status_code == 200
            assert script.text == (ROOT / "static" / "timeline.js").read_text()
            login = client.get("/login")
            assert login.status_code == 200
            assert "Paste the access token" in login.text
            assert client.get("/docs").status_code == 200
            created = client.post("/api/conversations", json={"provider": "demo"})
            assert created.status_code == 201, created.text  # the migrated schema is in place
    finally:
        server.send_signal(signal.SIGTERM)
        _, errors = server.communicate(timeout=30)
    assert server.returncode == 0, errors
