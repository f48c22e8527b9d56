"""Find and keep (SPEC §9): search every conversation, export, archive and delete one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Response

from app import export as exporting
from app.routes.api import ConversationId, SupervisorDep
from app.routes.deps import fetch_conversation
from app.search import search
from app.supervisor import ConversationError
from app.views import conversation_view

router = APIRouter(prefix="/api")


@router.get("/search")
async def search_messages(
    supervisor: SupervisorDep,
    q: Annotated[str, Query(min_length=1, max_length=500)],
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """Messages of every conversation (archived ones too) matching q, best first."""

    def read() -> list[dict[str, Any]]:
        with supervisor.session() as session:
            return search(session, q, limit)

    return {"hits": await supervisor.storage.read(read)}


@router.get("/conversations/{conversation_id}/export")
async def export_conversation(
    conversation_id: ConversationId,
    supervisor: SupervisorDep,
    format: exporting.ExportFormat = "md",
    ancestors: bool = False,
) -> Response:
    """The conversation as a Markdown or JSON Lines download, optionally with its ancestors."""
    conversation = await fetch_conversation(supervisor, conversation_id)

    def read() -> str:
        with supervisor.session() as session:
            return exporting.export(session, conversation, format, ancestors)

    body = await supervisor.storage.read(read)
    earlier = ancestors and conversation.compacted_from_id is not None
    name = exporting.file_name(conversation, format, earlier)
    return Response(
        exporting.encode(body),
        media_type=exporting.MEDIA_TYPES[format],
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@router.post("/conversations/{conversation_id}/archive")
async def archive_conversation(
    conversation_id: ConversationId, supervisor: SupervisorDep
) -> dict[str, Any]:
    """Archive a conversation without compacting it."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    try:
        conversation = await supervisor.storage.write(supervisor.archive, conversation)
    except ConversationError as error:
        raise HTTPException(409, str(error)) from None
    return conversation_view(conversation)


@router.delete("/conversations/{conversation_id}", status_code=204)
async def delete_conversation(
    conversation_id: ConversationId, supervisor: SupervisorDep
) -> Response:
    """Delete a conversation, its timeline and its backups."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    try:
        await supervisor.delete(conversation)
    except ConversationError as error:
        raise HTTPException(409, str(error)) from None
    return Response(status_code=204)
