"""A throwaway PostgreSQL server for the tests: Debian's binaries, a temp cluster, loopback only.

`OARLOCK_TEST_DB=postgres` makes the storage, API, supervisor, migration and reliability tests
run against it (tests/conftest.py starts one cluster per pytest session, a database per test).
"""

from __future__ import annotations

import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import pytest

SELECTED = os.environ.get("OARLOCK_TEST_DB", "sqlite").strip().lower() or "sqlite"
if SELECTED not in ("sqlite", "postgres"):
    raise RuntimeError(f"OARLOCK_TEST_DB must be sqlite or postgres, not {SELECTED!r}")

PR_SET_PDEATHSIG = 1

# For tests of what only SQLite has (PRAGMAs, its query planner, its file locks).
sqlite_only = pytest.mark.skipif(SELECTED != "sqlite", reason="SQLite only")
postgres_only = pytest.mark.skipif(SELECTED != "postgres", reason="PostgreSQL only")


def postgres_bin() -> Path:
    """The directory of Debian's PostgreSQL server binaries (the newest major version)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4])
    )
    if not found:
        raise RuntimeError(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): `make test` "
            "installs Debian's postgresql package"
        )
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: get SIGINT (a fast shutdown) when the test process dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGINT)


class Cluster:
    """A PostgreSQL server of our own: initdb in a temp dir, `postgres` as a child process."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="oarlock-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.admin: psycopg.Connection | None = None
        self.log = self.root / "postgres.log"
        # PostgreSQL refuses to run as root: run it as the postgres user the package creates.
        self.user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)

    def _run_as(self) -> dict[str, object]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def start(self) -> Cluster:
        """initdb, start the server on a loopback port, wait until it takes connections."""
        binaries = postgres_bin()
        env = {**os.environ, "LC_ALL": "C.UTF-8", "TZ": "UTC"}
        subprocess.run(
            [binaries / "initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "-E", "UTF8"],
            check=True,
            capture_output=True,
            env=env,
            cwd=self.root,
            **self._run_as(),  # type: ignore[arg-type]
        )
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    binaries / "postgres",
                    "-D",
                    self.data,
                    "-p",
                    str(self.port),
                    "-k",
                    self.root,
                    "-c",
                    "listen_addresses=127.0.0.1",
                    # A throwaway server: a crash of the machine may lose it whole, so its
                    # writes need not reach the disk (the relay's own crashes are SIGKILLs
                    # of the relay, which fsync does not change).
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.root,
                preexec_fn=_die_with_parent,  # runs after the switch to the postgres user
                **self._run_as(),  # type: ignore[arg-type]
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.admin = psycopg.connect(self.url("postgres", driver=False), autocommit=True)
                return self
            except psycopg.OperationalError as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = self.log.read_text(errors="replace")
                    self.stop()
                    raise RuntimeError(f"PostgreSQL did not start: {log}") from error
                time.sleep(0.05)

    def url(self, database: str, *, driver: bool = True) -> str:
        """The URL of a database on this server (SQLAlchemy's form, or libpq's)."""
        scheme = "postgresql+psycopg" if driver else "postgresql"
        return f"{scheme}://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database; its SQLAlchemy URL."""
        assert self.admin is not None
        name = f"test_{uuid.uuid4().hex[:16]}"
        self.admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def drop_database(self, url: str) -> bool:
        """Drop a database made by create_database; False while something is connected to it
        (a relay of a module-scoped fixture still using it: the server's end removes it)."""
        assert self.admin is not None
        name = url.rsplit("/", 1)[1]
        # Asked first: DROP DATABASE waits 5 s for the other sessions to end before it fails,
        # and a module's relay stays connected through all its tests (13 × 5 s, schema_fuzz).
        used = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        if self.admin.execute(used, (name,)).fetchone() != (0,):
            return False
        try:
            self.admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        except psycopg.errors.ObjectInUse:
            return False
        return True

    def stop(self) -> None:
        """Fast shutdown (open sessions are ended), wait for it, remove the cluster's files."""
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


_cluster: Cluster | None = None
_created: dict[str, str] = {}  # databases not yet dropped, by the directory they belong to


def start() -> Cluster:
    """Start the session's cluster (once)."""
    global _cluster
    if _cluster is None:
        _cluster = Cluster().start()
    return _cluster


def stop() -> None:
    """Stop the session's cluster, if one was started."""
    global _cluster
    if _cluster is not None:
        _cluster.stop()
        _cluster = None


def database_url(owner: Path) -> str | None:
    """With OARLOCK_TEST_DB=postgres, the database of a data directory (made on first use).

    None on SQLite. A relay restarted on the same directory finds the same database.
    """
    if SELECTED != "postgres":
        return None
    key = str(owner.resolve())
    if key not in _created:
        _created[key] = start().create_database()
    return _created[key]


def drop_created() -> None:
    """Drop the databases nothing uses any more (after each test)."""
    for key, url in list(_created.items()):
        if _cluster is None or _cluster.drop_database(url):
            del _created[key]
