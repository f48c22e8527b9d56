"""Database work off the event loop: one writer thread that works in bursts, a few readers.

The writer runs jobs in the order they were submitted, so a conversation's writes keep
their order. It takes every job queued when it looks as one burst: on SQLite their commits
skip the per-commit fsync, and one fsync of the write-ahead log then makes the whole burst
durable (what `synchronous=FULL` does per commit) before any of them is answered. What a
job hands to the loop (`soon`: hub events, tasks, futures) runs there, in order, after that
fsync and before the job's caller resumes: a message is stored before it is acknowledged
or shown. Readers (pages, lists, login sessions) run beside the writer on a small pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import event, make_url
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

READERS = 4  # reader threads (SQLite's WAL lets them read while the writer writes)
MAX_BURST = 64  # jobs one fsync covers at most


@dataclass
class _Job:
    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    effects: list[tuple[Callable[..., Any], tuple[Any, ...]]] = field(default_factory=list)
    result: Any = None
    error: BaseException | None = None


class Storage:
    """Runs the relay's database work in threads; the event loop only awaits it."""

    def __init__(self, engine: Engine, readers: int = READERS) -> None:
        self.engine = engine
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self.loop_io = 0  # statements run on the loop thread (must stay 0; tests check)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="oarlock-db-read")
        self._local = threading.local()  # .job: the writer's current job; .relaxed
        self.wal = _wal_file(engine)
        event.listen(engine, "before_cursor_execute", self._check_thread)
        if self.wal is not None:
            event.listen(engine, "checkout", self._durability)
            event.listen(engine, "commit", self._wrote)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer; the running loop is where results and effects are delivered."""
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self._writer = threading.Thread(target=self._write_loop, name="oarlock-db-writer")
        self._writer.daemon = True
        self._writer.start()

    async def stop(self) -> None:
        """Finish the queued jobs, then stop the threads."""
        if self._writer is not None:
            self._jobs.put(None)
            await asyncio.to_thread(self._writer.join, 30)
            self._writer = None
        self._readers.shutdown(wait=False)

    # -- running work --------------------------------------------------------------------------

    async def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run fn in the writer thread, after every job submitted before it."""
        result: T = await self.submit(fn, *args, **kwargs)
        return result

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        """Queue fn for the writer thread; the future resolves after its burst is durable."""
        if self._writer is None or self.loop is None:
            raise RuntimeError("storage is not running")
        future: asyncio.Future[T] = self.loop.create_future()
        self._jobs.put(_Job(partial(fn, *args, **kwargs), future))
        return future

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run fn in a reader thread (it must not write)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, partial(fn, *args, **kwargs))

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call fn on the loop: now when on it, after the current job's burst from the writer."""
        job: _Job | None = getattr(self._local, "job", None)
        if job is not None:
            job.effects.append((fn, args))
        elif self.loop is None or threading.get_ident() == self.loop_thread:
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def on_loop(self) -> bool:
        """True on the event loop's thread (or before the storage started)."""
        return self.loop_thread is None or threading.get_ident() == self.loop_thread

    # -- the writer ----------------------------------------------------------------------------

    def _write_loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._jobs.get()
            if first is None:
                return
            burst = [first]
            while len(burst) < MAX_BURST:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                burst.append(job)
            self._local.relaxed = True  # commits of this burst: no fsync each (one below)
            self._local.wrote = False
            try:
                for job in burst:
                    self._local.job = job
                    try:
                        job.result = job.fn()
                    except BaseException as error:  # noqa: BLE001 - handed to its caller
                        job.error = error
                    finally:
                        self._local.job = None
            finally:
                self._local.relaxed = False
            try:
                self._sync()
            except OSError as error:  # not durable: no job of the burst may claim it is
                log.exception("cannot sync the database's log")
                for job in burst:
                    job.error = job.error or error
            assert self.loop is not None
            self.loop.call_soon_threadsafe(self._finish, burst)

    def _sync(self) -> None:
        """Make the burst's commits durable: fsync SQLite's write-ahead log once."""
        if self.wal is None or not self._local.wrote:
            return
        try:
            fd = os.open(self.wal, os.O_RDONLY)
        except FileNotFoundError:  # checkpointed away: what it held is in the synced database
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _finish(burst: list[_Job]) -> None:
        """On the loop: each job's effects, then its caller, in the order they were queued."""
        for job in burst:
            for fn, args in job.effects:
                try:
                    fn(*args)
                except Exception:  # one failing effect must not hide the others
                    log.exception("an effect of a database job failed")
            if job.future.done():  # its caller was cancelled
                continue
            if job.error is not None:
                job.future.set_exception(job.error)
            else:
                job.future.set_result(job.result)

    # -- engine hooks --------------------------------------------------------------------------

    def _durability(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        """The writer's connections commit without fsync (the burst syncs); others with."""
        relaxed = bool(getattr(self._local, "relaxed", False))
        if record.info.get("relaxed", False) != relaxed:
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA synchronous={'NORMAL' if relaxed else 'FULL'}")
            cursor.close()
            record.info["relaxed"] = relaxed

    def _wrote(self, _connection: Any) -> None:
        """A commit (of a transaction that may have written): the burst needs its fsync."""
        self._local.wrote = True

    def _check_thread(self, *_args: Any) -> None:
        if self.loop_thread is not None and threading.get_ident() == self.loop_thread:
            self.loop_io += 1
            log.error("database I/O on the event loop thread", stack_info=True)


def _wal_file(engine: Engine) -> Path | None:
    """The write-ahead log of a SQLite file database, or None."""
    if engine.dialect.name != "sqlite":
        return None
    database = make_url(str(engine.url)).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(f"{database}-wal")
