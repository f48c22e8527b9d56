"""Images attached to messages: uploaded before the message, served back for its bubble."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi import Path as PathParam

from app import attachment_store
from app.attachment_store import AttachmentError
from app.attachments import ImageRefused, media_type_of
from app.models import Attachment
from app.providers import images_refused
from app.routes.api import ConversationId, SupervisorDep
from app.routes.deps import fetch_conversation
from app.supervisor import Supervisor
from app.supervisor.runner import READ_ONLY

router = APIRouter(prefix="/api")
AttachmentId = Annotated[int, PathParam(ge=1, le=2**63 - 1)]
# An image is shown, never run or sniffed as something else (the type is the stored one, one
# of attachments.MEDIA_TYPES, checked from the bytes at upload).
# Beside the relay's own headers (nosniff, its CSP: both policies hold, the stricter wins);
# no-store as every answer but the static files (a screenshot stays off a shared disk).
SERVED_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cache-Control": "no-store",
    "Content-Disposition": "inline",
}


def _view(attachment: Attachment) -> dict[str, Any]:
    return {"id": attachment.id, "media_type": attachment.media_type, "size": attachment.size}


@router.post("/conversations/{conversation_id}/attachments", status_code=201)
async def upload(
    conversation_id: ConversationId, request: Request, supervisor: SupervisorDep
) -> dict[str, Any]:
    """Store an image (the request's whole body: PNG, JPEG, GIF or WebP bytes) for a message."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    if conversation.status != "active":
        raise HTTPException(409, READ_ONLY)
    if (refused := images_refused(conversation.provider)) is not None:
        raise HTTPException(409, refused)
    content = await request.body()
    try:  # (Pillow reads the header off the loop)
        media_type = await asyncio.to_thread(media_type_of, content)
    except ImageRefused as refused:
        raise HTTPException(refused.status, str(refused)) from None
    try:
        stored = await supervisor.storage.write(
            _add, supervisor, conversation_id, media_type, content
        )
    except AttachmentError as error:
        raise HTTPException(409, str(error)) from None
    return _view(stored)


def _add(
    supervisor: Supervisor, conversation_id: int, media_type: str, content: bytes
) -> Attachment:
    with supervisor.session() as session:
        added = attachment_store.add_attachment(
            session=session, conversation_id=conversation_id, media_type=media_type, content=content
        )
        supervisor.publish_attachments(session, conversation_id)
        return added


@router.get("/conversations/{conversation_id}/attachments")
async def waiting(conversation_id: ConversationId, supervisor: SupervisorDep) -> dict[str, Any]:
    """The images uploaded to the conversation and not sent yet (the composer shows them)."""
    await fetch_conversation(supervisor, conversation_id)
    return {"attachments": await supervisor.storage.read(_unsent, supervisor, conversation_id)}


def _unsent(supervisor: Supervisor, conversation_id: int) -> list[dict[str, Any]]:
    with supervisor.session() as session:
        return attachment_store.unsent(session=session, conversation_id=conversation_id)


@router.delete("/conversations/{conversation_id}/attachments/{attachment_id}", status_code=204)
async def remove(
    conversation_id: ConversationId, attachment_id: AttachmentId, supervisor: SupervisorDep
) -> Response:
    """Remove an image not sent yet (the composer's ✕)."""
    await fetch_conversation(supervisor, conversation_id)
    if not await supervisor.storage.write(_remove, supervisor, conversation_id, attachment_id):
        raise HTTPException(404, f"No unsent image {attachment_id} in this conversation.")
    return Response(status_code=204)


def _remove(supervisor: Supervisor, conversation_id: int, attachment_id: int) -> bool:
    with supervisor.session() as session:
        removed = attachment_store.remove_unsent(
            session=session, conversation_id=conversation_id, attachment_id=attachment_id
        )
        if removed:
            supervisor.publish_attachments(session, conversation_id)
        return removed


@router.get("/attachments/{attachment_id}")
async def image(attachment_id: AttachmentId, supervisor: SupervisorDep) -> Response:
    """An attached image's bytes, as its type."""
    found = await supervisor.storage.read(_get, supervisor, attachment_id)
    if found is None:
        raise HTTPException(404, f"No image {attachment_id}.")
    media_type, content = found
    return Response(content, media_type=media_type, headers=SERVED_HEADERS)


def _get(supervisor: Supervisor, attachment_id: int) -> tuple[str, bytes] | None:
    with supervisor.session() as session:
        found = attachment_store.get_attachment(session=session, attachment_id=attachment_id)
        return None if found is None else (found.media_type, found.content)
