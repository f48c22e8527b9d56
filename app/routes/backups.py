"""Backups of a conversation under /api (SPEC §6; see docs/api.md)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response

from app.backups import NAME, carry_over
from app.render import render_backup
from app.routes.deps import fetch_conversation, load_conversation, supervisor_of
from app.supervisor import ConversationError, Supervisor
from app.views import conversation_view

router = APIRouter(prefix="/api")
SupervisorDep = Annotated[Supervisor, Depends(supervisor_of)]
ConversationId = Annotated[int, PathParam(ge=1, le=2**63 - 1)]
BackupName = Annotated[str, PathParam(max_length=80, pattern=NAME.pattern)]


def _read(supervisor: Supervisor, conversation_id: int, name: str) -> str:
    try:
        return supervisor.backups.files.read(conversation_id, name)
    except LookupError:
        raise HTTPException(404, f"No backup {name} in conversation {conversation_id}.") from None


@router.get("/conversations/{conversation_id}/backups")
def list_backups(conversation_id: ConversationId, supervisor: SupervisorDep) -> dict[str, Any]:
    """A conversation's backups, newest first."""
    load_conversation(supervisor, conversation_id)
    files = supervisor.backups.files
    infos = []
    for name in files.names(conversation_id):
        try:
            infos.append(files.info(conversation_id, name))
        except OSError:
            continue  # unreadable: left out of the list
    return {"backups": infos}


@router.get("/conversations/{conversation_id}/backups/{name}")
def get_backup(
    conversation_id: ConversationId,
    name: BackupName,
    supervisor: SupervisorDep,
    download: Annotated[bool, Query()] = False,
) -> Response:
    """One backup's Markdown (as an attachment with ?download=true)."""
    load_conversation(supervisor, conversation_id)
    headers = {"content-disposition": f'attachment; filename="{name}"'} if download else {}
    markdown = _read(supervisor, conversation_id, name)
    return Response(markdown, media_type="text/markdown; charset=utf-8", headers=headers)


@router.get("/conversations/{conversation_id}/backups/{name}/rendered")
def rendered_backup(
    conversation_id: ConversationId, name: BackupName, supervisor: SupervisorDep
) -> dict[str, Any]:
    """One backup rendered as sanitized HTML, with its list fields."""
    load_conversation(supervisor, conversation_id)
    markdown = _read(supervisor, conversation_id, name)
    info = supervisor.backups.files.info(conversation_id, name)
    return {**info, "html": render_backup(markdown)}


@router.post("/conversations/{conversation_id}/backups/{name}/fresh", status_code=201)
async def start_fresh(
    conversation_id: ConversationId, name: BackupName, supervisor: SupervisorDep
) -> JSONResponse:
    """Archive the conversation; its successor's first message carries this backup."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    if conversation.status != "active":
        raise HTTPException(409, "This conversation is archived; it cannot be compacted again.")
    markdown = await asyncio.to_thread(_read, supervisor, conversation_id, name)
    try:
        new = await supervisor.storage.write(
            supervisor.compact, conversation, carry=carry_over(name, markdown)
        )
    except ConversationError as error:
        raise HTTPException(409, str(error)) from None
    return JSONResponse({"compacted_into": conversation_view(new)}, status_code=201)
