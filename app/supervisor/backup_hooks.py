"""Backups (SPEC §6): jobs handed to app/backup_files.py, never awaited here."""

from __future__ import annotations

import logging
import os

from app import store
from app.backup_files import Job, Outcome
from app.models import Conversation, Entry
from app.supervisor.base import SupervisorState
from app.supervisor.runner import _logged
from app.views import conversation_view, effective_window
from app.window import ENV_VAR

log = logging.getLogger(__name__)


class BackupHooks(SupervisorState):
    """The backup jobs of a conversation (mixed into Supervisor)."""

    def _backup_window(self, conversation: Conversation) -> int | None:
        resolved = effective_window(conversation, os.environ.get(ENV_VAR))
        return resolved.window if resolved else None

    def _backup_figure(self, conversation: Conversation, used: int) -> None:
        """Check a new context figure against the rails (a backup may follow)."""
        window = self._backup_window(conversation)
        if window is None:
            # Not before the window is known (Claude Code says it at the end of its first turn):
            # the same figure with its window would fire the free rail as a second backup.
            return
        job = Job(
            conversation.id or 0, "figure", used=used, window=window, upto_seq=conversation.last_seq
        )
        self.storage.soon(self.backups.submit, job)

    def _backup_before(
        self,
        conversation: Conversation,
        trigger: str,
        link: Entry | None = None,
        upto_seq: int | None = None,
    ) -> None:
        """Back up a conversation before a compaction, from its timeline as it is now (or up
        to upto_seq)."""
        job = Job(
            conversation.id or 0,
            "before",
            used=conversation.context_tokens,
            window=self._backup_window(conversation),
            trigger=trigger,
            upto_seq=conversation.last_seq if upto_seq is None else upto_seq,
            link_entry_id=link.id if link is not None else None,
        )
        self.storage.soon(self.backups.submit, job)

    def _on_backup(self, outcome: Outcome) -> None:
        """A backup job ended: link it (header, compaction line) or say why it failed."""
        try:
            self.storage.submit(self._record_backup, outcome).add_done_callback(_logged)
        except RuntimeError:  # the relay is stopping: the backup's file is there all the same
            log.info("backup of conversation %s not linked (shutdown)", outcome.conversation_id)

    def _record_backup(self, outcome: Outcome) -> None:
        cid = outcome.conversation_id
        with self.session() as session:
            conversation = store.get_conversation(session=session, conversation_id=cid)
            if conversation is None:
                return
            if outcome.error is not None:
                data = {"type": "backup", "trigger": outcome.trigger}
                self._line(session, conversation, outcome.error, level="warning", data=data)
                return
            if outcome.link_entry_id is not None:
                runner = self.runners.get(cid)
                entry = (
                    runner.compaction
                    if runner is not None
                    and runner.compaction is not None
                    and runner.compaction.id == outcome.link_entry_id
                    else store.get_entry(session=session, entry_id=outcome.link_entry_id)
                )
                if entry is not None:  # (gone when the compaction ended without a result)
                    data = {**entry.data, "backup": outcome.name}
                    self._save(session, conversation, entry, data=data)
            view = conversation_view(conversation)
            view["backup"] = outcome.name
            self.hub.emit(cid, {"type": "conversation", "conversation": view})
