"""Backup files on disk and the jobs that write them, off the event loop (SPEC §6).

Layout: `<data dir>/backups/<conversation id>/<n>-backup-<…>.md`, 0600 files in 0700
directories (like the database), numbered from 1, created with O_EXCL so none is ever
overwritten. `rails.json` beside them keeps the rails' state, so a relay restart does not
fire `tokens_50k` again for a conversation already backed up.

The supervisor hands jobs over and returns at once; each conversation's jobs run one at a
time, in order, in a worker thread (they read the timeline and write files). What a job
ends with (a file written, or an error) comes back on the event loop through `notify`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from app import store
from app.backups import Item, Rails, Source, decide, file_name, header, number_of, render
from app.db import get_session

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
RAILS_FILE = "rails.json"
DRAIN_SECONDS = 10.0


class BackupFiles:
    """The backup directories under one data directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, conversation_id: int) -> Path:
        """The directory of one conversation's backups."""
        return self.root / str(int(conversation_id))

    def _ensure(self, conversation_id: int) -> Path:
        for path in (self.root, self.folder(conversation_id)):
            if not path.is_dir():
                path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
                path.chmod(DIR_MODE)
        return self.folder(conversation_id)

    def names(self, conversation_id: int) -> list[str]:
        """Backup file names, newest (highest n) first."""
        try:
            with os.scandir(self.folder(conversation_id)) as found:
                # Files only: a FIFO of a backup's name would hang the list's read of it.
                entries = [entry.name for entry in found if entry.is_file()]
        except OSError:  # none yet, or the directory cannot be read: no backups to show
            return []
        numbered = [(n, name) for name in entries if (n := number_of(name)) is not None]
        return [name for _n, name in sorted(numbered, reverse=True)]

    def read(self, conversation_id: int, name: str) -> str:
        """A backup's Markdown; LookupError when there is no such backup."""
        if number_of(name) is None:
            raise LookupError("No such backup.")
        path = self.folder(conversation_id) / name
        if not path.is_file():  # gone, or a directory or FIFO of that name (a FIFO would hang)
            raise LookupError("No such backup.")
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise LookupError("No such backup.") from None

    def info(self, conversation_id: int, name: str) -> dict[str, Any]:
        """A backup as the 🧠 modal lists it: name, trigger, context remaining, time."""
        path = self.folder(conversation_id) / name
        with path.open(encoding="utf-8") as file:
            fields = header("".join(file.readline() for _ in range(12)))
        return {
            "name": name,
            "n": number_of(name),
            "trigger": fields.get("Trigger"),
            "context_remaining": fields.get("Context Remaining"),
            "generated": fields.get("Generated"),
            "size": path.stat().st_size,
        }

    def write(self, conversation_id: int, markdown: str, local: datetime) -> str:
        """Write a new numbered backup (never over another) and return its name."""
        folder = self._ensure(conversation_id)
        existing = self.names(conversation_id)
        n = (number_of(existing[0]) or 0) + 1 if existing else 1
        data = markdown.encode("utf-8")
        # Written whole under a hidden name, then linked under its own: the list never shows a
        # backup still being written (one run listed it empty, its trigger unknown).
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".backup-", suffix=".tmp")
        try:
            try:
                os.fchmod(fd, FILE_MODE)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            while True:
                name = file_name(n, local)
                try:
                    os.link(temporary, folder / name)  # never over another (as O_EXCL)
                except FileExistsError:
                    n += 1
                    continue
                return name
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)  # never leave half a backup

    def load_rails(self, conversation_id: int) -> Rails:
        """The rails as the last backup left them (fresh when unknown)."""
        path = self.folder(conversation_id) / RAILS_FILE
        if not path.is_file():  # none yet (or a FIFO of that name, whose read would hang)
            return Rails()
        try:
            raw = path.read_text(encoding="utf-8")
            data = json.loads(raw)
        except (OSError, ValueError):
            return Rails()
        return Rails.from_dict(data) if isinstance(data, dict) else Rails()

    def save_rails(self, conversation_id: int, rails: Rails) -> None:
        """Keep the rails' state beside the backups (atomically replaced)."""
        folder = self._ensure(conversation_id)
        temporary = folder / f".{RAILS_FILE}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                json.dump(rails.as_dict(), file)
            os.replace(temporary, folder / RAILS_FILE)
        except BaseException:  # a full disk: the rails stay as they were, nothing is left
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


@dataclass(frozen=True)
class Job:
    """A context figure to check, a backup to write before a compaction, or a reset."""

    conversation_id: int
    kind: str  # figure | before | reset
    used: int | None = None
    window: int | None = None
    trigger: str | None = None  # for "before": precompact_auto | precompact_manual
    upto_seq: int | None = None  # the timeline as it was when the job was made
    link_entry_id: int | None = None  # the compaction entry that links the backup


@dataclass(frozen=True)
class Outcome:
    """What a job did: a backup written (name) or not (error)."""

    conversation_id: int
    trigger: str
    name: str | None = None
    error: str | None = None
    link_entry_id: int | None = None


def error_text(trigger: str, error: BaseException) -> str:
    """The one timeline line a failed backup becomes."""
    if isinstance(error, OSError) and error.strerror:
        where = f" ({error.filename})" if error.filename else ""
        reason = f"{error.strerror}{where}"
    else:
        reason = str(error) or type(error).__name__
    return f"The backup ({trigger}) could not be written: {reason}"


class Backups:
    """Checks figures against the rails and writes backups, never on the turn's path."""

    def __init__(
        self, root: Path, engine: Engine, notify: Callable[[Outcome], None] | None = None
    ) -> None:
        self.files = BackupFiles(root)
        self.engine = engine
        self.notify = notify
        self._rails: dict[int, Rails] = {}  # touched only by a conversation's serial jobs
        self._latest: dict[int, str | None] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- on the event loop ------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue a job behind the conversation's earlier ones; returns at once."""
        task = asyncio.get_running_loop().create_task(self._run(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def latest(self, conversation_id: int) -> str | None:
        """The newest backup's name (cached after the first look)."""
        if conversation_id not in self._latest:
            names = self.files.names(conversation_id)
            self._latest[conversation_id] = names[0] if names else None
        return self._latest[conversation_id]

    async def forget(self, conversation_id: int) -> None:
        """Delete a conversation's backups, after the jobs already queued for it have run."""
        lock = self._locks.setdefault(conversation_id, asyncio.Lock())
        async with lock:
            await asyncio.to_thread(
                shutil.rmtree, self.files.folder(conversation_id), ignore_errors=True
            )
            if self.files.folder(conversation_id).exists():
                log.warning("backups of deleted conversation %s not removed", conversation_id)
            self._rails.pop(conversation_id, None)
            self._latest.pop(conversation_id, None)
        self._locks.pop(conversation_id, None)

    async def drain(self) -> None:
        """Wait (a while at most) for the jobs already queued: at shutdown."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=DRAIN_SECONDS)

    async def _run(self, job: Job) -> None:
        lock = self._locks.setdefault(job.conversation_id, asyncio.Lock())
        async with lock:
            try:
                outcome = await asyncio.to_thread(self._work, job)
            except Exception:  # a bug here must never reach a turn
                log.exception("backup job failed in conversation %s", job.conversation_id)
                return
        if outcome is None:
            return
        if outcome.name is not None:
            self._latest[job.conversation_id] = outcome.name
        if self.notify is not None:
            self.notify(outcome)

    # -- in the worker thread ---------------------------------------------------------------

    def _work(self, job: Job) -> Outcome | None:
        cid = job.conversation_id
        if job.kind == "reset":
            self._rails[cid] = Rails()
            self._keep_rails(cid)
            return None
        trigger = job.trigger
        if job.kind == "figure":
            if job.used is None:
                return None
            if cid not in self._rails:
                self._rails[cid] = self.files.load_rails(cid)
            trigger, after = decide(job.used, job.window, self._rails[cid])
            if trigger is None:
                return None
            self._rails[cid] = after
            self._keep_rails(cid)  # even if the write fails: one error line, not one per figure
        assert trigger is not None
        try:
            name = self._write(job, trigger)
        except Exception as error:  # noqa: BLE001 - told in the timeline, never a failed turn
            log.warning("backup of conversation %s not written: %s", cid, error)
            return Outcome(cid, trigger, error=error_text(trigger, error))
        return Outcome(cid, trigger, name=name, link_entry_id=job.link_entry_id)

    def _keep_rails(self, conversation_id: int) -> None:
        try:
            self.files.save_rails(conversation_id, self._rails[conversation_id])
        except OSError as error:
            log.warning("rails of conversation %s not saved: %s", conversation_id, error)

    def _write(self, job: Job, trigger: str) -> str:
        with get_session(self.engine) as session:
            conversation = store.get_conversation(
                session=session, conversation_id=job.conversation_id
            )
            if conversation is None:
                raise LookupError("the conversation is gone")
            entries = store.backup_entries(
                session=session, conversation_id=job.conversation_id, upto_seq=job.upto_seq
            )
            items = [Item(e.kind, e.text, e.data) for e in entries]
            now = datetime.now(UTC)
            source = Source(
                title=conversation.title,
                conversation_id=job.conversation_id,
                session_id=conversation.session_id,
                trigger=trigger,
                used=job.used,
                window=job.window,
                generated=now,
                items=items,
            )
        return self.files.write(job.conversation_id, render(source), now.astimezone())
