"""The header's Changes view: what git sees changed in a conversation's repository."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Query

from app.changes import ChangesError, NoSuchChange, changes_view, file_diff, open_repo
from app.git import GitError, GitMissing
from app.routes.api import ConversationId, SupervisorDep
from app.routes.deps import fetch_conversation
from app.workspace import WorkspaceError, usable_cwd

router = APIRouter(prefix="/api")
# Threads of its own: a big repository's diff never holds the @ list's (or the relay's) threads.
POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="oarlock-changes")
T = TypeVar("T")
NO_GIT = "git is not installed on the relay's machine: the changes cannot be shown."
NOT_A_REPO = "The working directory is not in a git repository."


async def _in_git(supervisor: SupervisorDep, conversation_id: int, read: Callable[..., T]) -> T:
    """read(cwd, roots) in the view's threads; its failures as 409s with a message."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    roots = supervisor.settings.roots

    def run() -> T:
        return read(usable_cwd(conversation.cwd, roots), roots)

    try:
        return await asyncio.get_running_loop().run_in_executor(POOL, run)
    except NoSuchChange as error:
        raise HTTPException(404, str(error)) from None
    except GitMissing:
        raise HTTPException(409, NO_GIT) from None
    except (WorkspaceError, ChangesError, GitError) as error:
        raise HTTPException(409, str(error)) from None


@router.get("/conversations/{conversation_id}/changes")
async def conversation_changes(
    conversation_id: ConversationId, supervisor: SupervisorDep
) -> dict[str, Any]:
    """The files changed since the last commit in the conversation's repository."""
    return await _in_git(supervisor, conversation_id, changes_view)


@router.get("/conversations/{conversation_id}/changes/diff")
async def conversation_change_diff(
    conversation_id: ConversationId,
    supervisor: SupervisorDep,
    path: Annotated[str, Query(min_length=1, max_length=4096)],
    old_path: Annotated[str | None, Query(min_length=1, max_length=4096)] = None,
) -> dict[str, Any]:
    """One changed file's diff (path from the repository's top, and a rename's old path, as
    the list gives them)."""

    def read(cwd: Any, roots: Any) -> dict[str, Any]:
        repo = open_repo(cwd, roots)
        if repo is None:
            raise ChangesError(NOT_A_REPO)
        return file_diff(repo, path, old_path)

    return await _in_git(supervisor, conversation_id, read)
