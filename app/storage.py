"""Database work off the event loop: one writer thread, one syncer thread, a few readers.

The writer runs jobs in the order they were submitted, so a conversation's writes keep
their order, and takes every job queued when it looks as one burst. On SQLite its commits
skip the per-commit fsync (synchronous=NORMAL: a commit is in the write-ahead log, safe from
a crash of the process); the syncer then fsyncs the log once for every burst written
meanwhile, which is what synchronous=FULL does per commit, while the writer goes on.
What a job hands to the loop (`soon`: hub events, tasks, futures) runs there, in order,
as soon as the job has committed; the job's caller resumes after the fsync (`write`: a
user's message is acknowledged only once it would survive a power cut) or at once
(`write_early`: the agent's records). Readers (pages, lists, sessions) run beside them.
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

from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.db import sqlite_file

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

READERS = 4  # reader threads (SQLite's WAL lets them read while the writer writes)
MAX_BURST = 64  # jobs one fsync covers at most


@dataclass
class _Job:
    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    early: bool = False  # answered once committed, before the burst's fsync
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
        self._syncs: queue.SimpleQueue[list[_Job] | None] = queue.SimpleQueue()
        self._syncer: threading.Thread | None = None
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="oarlock-db-read")
        self._aside = ThreadPoolExecutor(1, thread_name_prefix="oarlock-db-aside")  # write_aside
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
        self._syncer = threading.Thread(target=self._sync_loop, name="oarlock-db-syncer")
        for thread in (self._writer, self._syncer):
            thread.daemon = True
            thread.start()

    async def stop(self) -> None:
        """Finish the queued jobs and the reads under way (those not begun are cancelled),
        then stop the threads: the engine is disposed of next, and a connection handed back
        after that stayed open in a discarded pool."""
        if self._writer is not None:
            self._jobs.put(None)  # the writer ends after the queued jobs, then the syncer
            await asyncio.to_thread(self._writer.join, 30)
            if self._syncer is not None:
                await asyncio.to_thread(self._syncer.join, 30)
            self._writer = self._syncer = None
        for pool in (self._readers, self._aside):
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)

    # -- running work --------------------------------------------------------------------------

    async def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run fn in the writer thread, after every job submitted before it."""
        result: T = await self.submit(fn, *args, **kwargs)
        return result

    async def write_early(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """As write, but answered (effects included) once committed, before the fsync.

        For the agent's own records: a process crash loses none of them (the commit is in
        the log), a power cut may lose the newest; a later durable write's fsync covers them.
        """
        result: T = await self._queue(partial(fn, *args, **kwargs), early=True)
        return result

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        """Queue fn for the writer thread; the future resolves after its burst is durable."""
        return self._queue(partial(fn, *args, **kwargs), early=False)

    def _queue(self, fn: Callable[[], T], *, early: bool) -> asyncio.Future[T]:
        if self._writer is None or self.loop is None:
            raise RuntimeError("storage is not running")
        future: asyncio.Future[T] = self.loop.create_future()
        self._jobs.put(_Job(fn, future, early))
        return future

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run fn in a reader thread (it must not write: see write_aside)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, partial(fn, *args, **kwargs))

    async def write_aside(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a write in a thread of its own, in no order with the writer's jobs or the reads.

        For a short write that must not wait behind them and keeps its own order with them
        (the cluster's lease renewal: a job or a read may wait seconds on Redis).
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._aside, partial(fn, *args, **kwargs))

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call fn on the loop: now when on it, after the current job's burst from the writer."""
        if self.loop is None or threading.get_ident() == self.loop_thread:
            fn(*args)  # (jobs run in the writer thread, never on the loop's)
            return
        # (Looked up only off the loop: a thread that never set .job pays for an exception.)
        job: _Job | None = getattr(self._local, "job", None)
        if job is not None:
            job.effects.append((fn, args))
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def on_loop(self) -> bool:
        """True on the event loop's thread (or before the storage started)."""
        return self.loop_thread is None or threading.get_ident() == self.loop_thread

    # -- the writer ----------------------------------------------------------------------------

    def _write_loop(self) -> None:
        assert self.loop is not None
        stopping = False
        while not stopping:
            first = self._jobs.get()
            if first is None:
                break
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
            self._local.relaxed = True  # commits of this burst: no fsync each (the syncer's)
            self._local.wrote = False
            durable: list[_Job] = []
            try:
                for job in burst:
                    self._local.job = job
                    try:
                        job.result = job.fn()
                    except BaseException as error:  # noqa: BLE001 - handed to its caller
                        job.error = error
                    finally:
                        self._local.job = None
                    # Its effects now (tabs, tasks): committed, in the log, safe from a crash
                    # of the process; its caller once the log is synced, unless early.
                    self.loop.call_soon_threadsafe(self._effects, job)
                    if job.early:
                        self.loop.call_soon_threadsafe(self._answer, [job])
                    else:
                        durable.append(job)
            finally:
                self._local.relaxed = False
            if durable and self.wal is not None and self._local.wrote:
                self._syncs.put(durable)  # synced while the next burst is written
            elif durable:
                self.loop.call_soon_threadsafe(self._answer, durable)
        self._syncs.put(None)

    def _sync_loop(self) -> None:
        """Fsync the log for every burst written since the last fsync, then answer them."""
        assert self.loop is not None
        stopping = False
        while not stopping:
            first = self._syncs.get()
            if first is None:
                return
            waiting = list(first)
            while True:
                try:
                    more = self._syncs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                waiting += more
            try:
                self._sync()
            except OSError as error:  # not durable: no job of these may claim it is
                log.exception("cannot sync the database's log")
                for job in waiting:
                    job.error = job.error or error
            self.loop.call_soon_threadsafe(self._answer, waiting)

    def _sync(self) -> None:
        """Make what was committed durable: fsync SQLite's write-ahead log (as FULL does)."""
        assert self.wal is not None
        try:
            fd = os.open(self.wal, os.O_RDONLY)
        except FileNotFoundError:  # checkpointed away: what it held is in the synced database
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _effects(job: _Job) -> None:
        """On the loop: what a job handed to it, in order."""
        for fn, args in job.effects:
            try:
                fn(*args)
            except Exception:  # one failing effect must not hide the others
                log.exception("an effect of a database job failed")

    @staticmethod
    def _answer(jobs: list[_Job]) -> None:
        """On the loop: resume each job's caller with its result or its error."""
        for job in jobs:
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
    database = sqlite_file(engine.url.render_as_string(hide_password=False))
    return None if database is None else Path(f"{database}-wal")
