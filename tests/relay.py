"""A real relay for tests: uvicorn in a thread on a free port, a fresh database."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import io
import json
import os
import shutil
import socket
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import httpx
import uvicorn
import uvicorn.server
from websockets.sync.client import ClientConnection, connect

from app.cli import RelayServer, server_options
from app.config import Settings
from app.db import get_session
from app.main import create_app
from app.migrate import upgrade
from app.models import Entry
from tests import postgres

TOKEN = "test-token-0123456789"
SQLITE = "sqlite:///"


class _PromptSleeps:
    """uvicorn.server's asyncio, its sleeps cut to 5 ms.

    uvicorn looks for `should_exit` every 100 ms and gives open connections a fixed 100 ms
    before its shutdown: stopping a test relay took about 185 ms, once per test. Only the
    test relays' uvicorn is changed; what they serve is not.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def sleep(delay: float, result: Any = None) -> Any:
        return await asyncio.sleep(min(delay, 0.005), result)


uvicorn.server.asyncio = _PromptSleeps()  # type: ignore[attr-defined]

LOOP_ENV = "OARLOCK_TEST_LOOP"  # "uvloop": test relays on uvicorn's loop (else CheckedLoop)


class CheckedLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, noting each call that is not thread-safe made from another thread.

    uvloop does not check: a timer cancelled from the storage writer's thread was the cause
    found for test processes that died with a segfault elsewhere. Here such a call is noted
    (call_soon, which a future's or an event's setting makes too; call_later and call_at;
    a timer's cancel), and the relay's stop fails the test.
    """

    def __init__(self) -> None:
        super().__init__()
        self.thread: int | None = None
        self.wrong: list[str] = []

    def run_forever(self) -> None:
        self.thread = threading.get_ident()
        super().run_forever()

    def _note(self, what: str) -> None:
        if self.thread is not None and threading.get_ident() != self.thread:
            stack = "".join(traceback.format_stack(limit=12)[:-2])
            self.wrong.append(f"{what} from thread {threading.current_thread().name}:\n{stack}")

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        self._note(f"call_soon({callback!r})")
        return super().call_soon(callback, *args, context=context)

    def call_at(
        self, when: float, callback: Any, *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        self._note(f"call_at({callback!r})")
        return super().call_at(when, callback, *args, context=context)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        self._note(f"cancel of {handle!r}")
        super()._timer_handle_cancelled(handle)  # type: ignore[misc]


_template: Path | None = None
_template_lock = threading.Lock()


def migrated(url: str) -> None:
    """Bring a test database to the newest migration.

    A new SQLite file is a copy of one migrated once per test process (Alembic's steps took
    about 70 ms a relay); an existing file (a relay started again on its data) and PostgreSQL
    are migrated as the relay's start migrates them. The migrations themselves are tested
    in tests/test_migrations.py.
    """
    global _template
    target = Path(url.removeprefix(SQLITE))
    if not url.startswith(SQLITE) or target.exists():
        upgrade(url)
        return
    with _template_lock:
        if _template is None:
            made = Path(tempfile.mkdtemp(prefix="oarlock-template-")) / "template.db"
            atexit.register(shutil.rmtree, made.parent, True)
            upgrade(SQLITE + str(made))
            _template = made
    with (
        contextlib.closing(sqlite3.connect(_template)) as source,
        contextlib.closing(sqlite3.connect(target)) as copy,
    ):
        source.backup(copy)


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings for a test relay living in data_dir."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # as the relay makes it
    workspace = data_dir / "work"
    workspace.mkdir(parents=True, exist_ok=True)
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "token": TOKEN,
        "workspace_roots": [data_dir],
        "default_cwd": workspace,
        "demo_delay": 0.005,
        "port": free_port(),
    }
    if "database_url" not in overrides and (url := postgres.database_url(data_dir)):
        values["database_url"] = url  # OARLOCK_TEST_DB=postgres: a database per data directory
    values.update(overrides)
    return Settings(**values)


def loop_option() -> dict[str, Any]:
    """The test relays' event loop: CheckedLoop, or uvicorn's own (OARLOCK_TEST_LOOP=uvloop)."""
    if os.environ.get(LOOP_ENV) == "uvloop":
        return {}  # what `oarlock serve` runs on (make test's PostgreSQL run)
    return {"loop": "tests.relay:CheckedLoop"}


class LiveRelay:
    """A running relay and clients that talk to it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        migrated(settings.db_url)
        self.app = create_app(settings)
        self.server = RelayServer(
            uvicorn.Config(
                self.app,
                host="127.0.0.1",
                port=settings.port,
                log_level="warning",
                **server_options(settings),  # the protocol and limits `oarlock serve` uses
                **loop_option(),
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.base = f"http://127.0.0.1:{settings.port}"
        self.http = httpx.Client(
            base_url=self.base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )
        self._cookie: str | None = None

    def start(self) -> LiveRelay:
        """Start serving and wait until it answers."""
        # The relay's start collects every generation, then freezes what is left (app/main.py).
        # In a test process holding every earlier test's objects, that walk took about 100 ms
        # a relay. Frozen here first, they are out of its sight; the relay's stop thaws them
        # with its own.
        gc.freeze()
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the relay did not start")
            time.sleep(0.02)
        return self

    def __enter__(self) -> LiveRelay:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Shut down (lifespan included) and wait for the thread."""
        self.http.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)
        if self.thread.is_alive():  # (left running: the run's summary shows where it hangs)
            report_hang(self)
        # Every database call ran off the event loop (app/storage.py counts those that did not).
        assert self.app.state.supervisor.storage.loop_io == 0, "database I/O on the event loop"
        loop = self.app.state.supervisor.storage.loop
        wrong = loop.wrong if isinstance(loop, CheckedLoop) else []
        assert not wrong, "calls on the event loop from another thread:\n" + "\n".join(wrong)

    def login(self) -> str:
        """A new browser session: the Cookie header value a login by URL sets."""
        with httpx.Client(base_url=self.base, timeout=30) as client:
            response = client.get(f"/?token={TOKEN}")
        assert response.status_code == 303, response.text
        return response.headers["set-cookie"].split(";")[0]

    @property
    def cookie(self) -> str:
        """The Cookie header of one logged-in browser (the same for the relay's life)."""
        if self._cookie is None:
            self._cookie = self.login()
        return self._cookie

    @property
    def supervisor(self) -> Any:
        """The relay's supervisor (to read state, never to drive it)."""
        return self.app.state.supervisor

    def create(self, **body: Any) -> dict[str, Any]:
        """Create a conversation (demo agent unless told otherwise)."""
        body.setdefault("provider", "demo")
        response = self.http.post("/api/conversations", json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def attach(self, conversation_id: int, content: bytes, kind: str = "image/png") -> int:
        """Upload an image for the conversation's next message; its id."""
        response = self.http.post(
            f"/api/conversations/{conversation_id}/attachments",
            content=content,
            headers={"Content-Type": kind},
        )
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def mark_cut(self, entry_id: int) -> None:
        """Mark a sent message as a relay restart leaves one whose turn it cut."""
        with get_session(self.app.state.engine) as session:
            entry = session.get(Entry, entry_id)
            assert entry is not None
            entry.data = {**entry.data, "cut": "unknown"}
            session.add(entry)
            session.commit()

    def send(self, conversation_id: int, text: str) -> httpx.Response:
        """Post a message."""
        return self.http.post(f"/api/conversations/{conversation_id}/messages", json={"text": text})

    def get(self, conversation_id: int) -> dict[str, Any]:
        """The conversation with its timeline."""
        response = self.http.get(f"/api/conversations/{conversation_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def wait_idle(self, conversation_id: int, timeout: float = 30) -> dict[str, Any]:
        """Wait until the conversation has no running turn and nothing queued."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.get(conversation_id)
            if view["turn"] == {"state": "idle", "queued": 0}:
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"conversation {conversation_id} still busy: {view['turn']}")
            time.sleep(0.02)

    def wait_for(self, conversation_id: int, predicate: Any, timeout: float = 30) -> dict[str, Any]:
        """Wait until predicate(conversation view) is true."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.get(conversation_id)
            if predicate(view):
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met: {json.dumps(view)[:2000]}")
            time.sleep(0.02)

    @contextmanager
    def socket(self, origin: str | None = None) -> Iterator[ClientConnection]:
        """A WebSocket logged in with the cookie, from the relay's own origin."""
        headers = {"Cookie": self.cookie, "Origin": origin or self.base}
        url = f"ws://127.0.0.1:{self.settings.port}/ws"
        with connect(url, additional_headers=headers, open_timeout=10) as ws:
            yield ws


HANGS_ENV = "OARLOCK_TEST_HANGS"  # the file report_hang appends to (tests/conftest.py)


def report_hang(relay: LiveRelay) -> None:
    """A relay that did not stop: its tasks' and threads' stacks, for the run's summary.

    Seen twice in session 38 (a cluster node after its control channel was taken away by an
    ACL), never reproduced on demand; the harness went on without a word.
    """
    out = io.StringIO()
    out.write(f"A relay on port {relay.settings.port} did not stop within 30 s.\n")
    for connection in list(relay.server.server_state.connections):  # (what uvicorn waits on)
        out.write(f"-- connection {type(connection).__name__} {vars(connection).get('client')}\n")
    loop = relay.supervisor.storage.loop
    for task in asyncio.all_tasks(loop) if loop is not None else ():
        out.write(f"-- task {task.get_name()}\n")
        awaiting: Any = task.get_coro()
        while awaiting is not None:  # the whole chain of awaits (print_stack shows its first)
            frame = getattr(awaiting, "cr_frame", None) or getattr(awaiting, "ag_frame", None)
            if frame is not None:
                code = frame.f_code
                out.write(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}\n")
            awaiting = getattr(awaiting, "cr_await", None) or getattr(awaiting, "ag_await", None)
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        out.write(f"-- thread {names.get(ident, ident)}\n{''.join(traceback.format_stack(frame))}")
    path = os.environ.get(HANGS_ENV)
    if path is None:
        sys.__stderr__.write(out.getvalue())
        return
    with open(path, "a", encoding="utf-8") as report:
        report.write(out.getvalue() + "\n")


# Events of a frame not read yet, per socket; forgotten with the socket. (Keyed by id(ws), a
# socket that a test left without clean-up lent its events to a later one given its id: a
# cluster test's new socket got a stale "conversation" event before its "hello".)
_pending: WeakKeyDictionary[ClientConnection, deque[dict[str, Any]]] = WeakKeyDictionary()


def receive(ws: ClientConnection, timeout: float = 10) -> dict[str, Any]:
    """The next event of a socket (a frame holds one event, or an array of them)."""
    pending = _pending.setdefault(ws, deque())
    if not pending:
        message = json.loads(ws.recv(timeout=timeout))
        pending.extend(message if isinstance(message, list) else [message])
    return pending.popleft()


def receive_until(
    ws: ClientConnection, predicate: Any, timeout: float = 30
) -> list[dict[str, Any]]:
    """Every message up to and including the first one matching predicate."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        message = receive(ws, max(0.01, deadline - time.monotonic()))
        seen.append(message)
        if predicate(message):
            return seen


def gone_error(conversation_id: int) -> dict[str, Any]:
    """The socket's answer about a conversation that does not exist (a tab drops it)."""
    detail = f"No conversation {conversation_id}."
    return {"type": "error", "detail": detail, "conversation_id": conversation_id, "gone": True}
