"""The composer's @ completion: the files of a conversation's working directory."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from app.files import FileLists, rank
from app.routes.api import ConversationId, SupervisorDep
from app.routes.deps import fetch_conversation
from app.workspace import WorkspaceError, usable_cwd

router = APIRouter(prefix="/api")
FILE_LISTS = FileLists()


@router.get("/conversations/{conversation_id}/files")
async def conversation_files(
    conversation_id: ConversationId,
    supervisor: SupervisorDep,
    q: Annotated[str, Query(max_length=200)] = "",
    limit: Annotated[int, Query(ge=1, le=50)] = 12,
) -> dict[str, Any]:
    """The paths under the conversation's working directory that best match q."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    roots = supervisor.settings.roots

    def find() -> dict[str, Any]:
        root = usable_cwd(conversation.cwd, roots)  # (the check an agent's start makes)
        files, truncated = FILE_LISTS.get(root, roots)
        return {"files": rank(files, q, limit), "truncated": truncated}

    try:
        return await asyncio.get_running_loop().run_in_executor(FILE_LISTS.pool, find)
    except WorkspaceError as error:
        raise HTTPException(409, str(error)) from None
