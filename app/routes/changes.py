"""The header's Changes view: what git sees changed in a conversation's repository."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Query

from app.changes import ChangesError, NoSuchChange, changes_view, file_diff, open_repo
from app.git import GitMissing, GitTimeout
from app.routes.api import ConversationId, SupervisorDep
from app.routes.deps import fetch_conversation
from app.routes.files import FILE_LISTS
from app.workspace import WorkspaceError, usable_cwd

router = APIRouter(prefix="/api")
T = TypeVar("T")
NO_GIT = "git is not installed on the relay's machine: the changes cannot be shown."
NOT_A_REPO = "The working directory is not in a git repository."


async def _in_git(supervisor: SupervisorDep, conversation_id: int, read: Callable[..., T]) -> T:
    """read(cwd, roots) in the file listings' threads; its failures as 409s with a message."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    roots = supervisor.settings.roots

    def run() -> T:
        return read(usable_cwd(conversation.cwd, roots), roots)

    try:
        return await asyncio.get_running_loop().run_in_executor(FILE_LISTS.pool, run)
    except NoSuchChange as error:
        raise HTTPException(404, str(error)) from None
    except (WorkspaceError, ChangesError, GitTimeout) as error:
        raise HTTPException(409, str(error)) from None
    except GitMissing:
        raise HTTPException(409, NO_GIT) from None


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
) -> dict[str, Any]:
    """One changed file's diff (path from the repository's top, as the list gives it)."""

    def read(cwd: Any, roots: Any) -> dict[str, Any]:
        repo = open_repo(cwd, roots)
        if repo is None:
            raise ChangesError(NOT_A_REPO)
        return file_diff(repo, path)

    return await _in_git(supervisor, conversation_id, read)
