"""Steering a compaction under /api (SPEC §8; see docs/api.md): preview, edit, pins, record."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, field_validator
from sqlmodel import SQLModel

from app import steer, store
from app.models import Conversation, Text, _no_nul
from app.routes.deps import load_conversation, supervisor_of
from app.summary import one_line
from app.supervisor import ConversationError, Supervisor
from app.unicode_text import has_visible_character
from app.views import conversation_view

router = APIRouter(prefix="/api")
SupervisorDep = Annotated[Supervisor, Depends(supervisor_of)]
MAX_ID = 2**63 - 1
ConversationId = Annotated[int, PathParam(ge=1, le=MAX_ID)]
EntryId = Annotated[int, PathParam(ge=1, le=MAX_ID)]
ARCHIVED = "This conversation is archived; it cannot be compacted again."


class CompactRequest(SQLModel):
    """A confirmed /compact: the preview's revision, and the carry-over if the user edited it."""

    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]

    revision: Text | None = None
    carry_over: Text | None = None  # cut to 3,500 characters; the body limit bounds it first

    _carry_nul = field_validator("carry_over")(_no_nul)


def _archived(supervisor: Supervisor, conversation_id: int) -> HTTPException:
    """The 409 for an archived conversation, naming the one it was compacted into."""
    conversation = load_conversation(supervisor, conversation_id)
    into = conversation.compacted_into_id
    detail = ARCHIVED if into is None else f"{ARCHIVED} It continues in conversation {into}."
    return HTTPException(409, detail)


@router.get("/conversations/{conversation_id}/compact")
async def preview_compact(
    conversation_id: ConversationId, supervisor: SupervisorDep
) -> dict[str, Any]:
    """What /compact would carry and leave out now (the confirmation's preview)."""
    return await supervisor.storage.read(_preview, supervisor, conversation_id)


def _preview(supervisor: Supervisor, conversation_id: int) -> dict[str, Any]:
    conversation = load_conversation(supervisor, conversation_id)
    if conversation.status != "active":
        raise _archived(supervisor, conversation_id)
    with supervisor.session() as session:
        plan = steer.plan_compact(session, conversation)
    return plan.preview(conversation_id)


@router.post("/conversations/{conversation_id}/compact", status_code=201)
async def confirm_compact(
    conversation_id: ConversationId, body: CompactRequest, supervisor: SupervisorDep
) -> JSONResponse:
    """Compact, with the preview's revision and the user's edited carry-over, if any."""
    edited = body.carry_over
    if edited is not None and not has_visible_character(edited):
        raise HTTPException(422, "The carry-over is empty; write one, or cancel.")
    new = await supervisor.storage.write(
        _confirm, supervisor, conversation_id, edited, body.revision
    )
    return JSONResponse({"compacted_into": conversation_view(new)}, status_code=201)


def _confirm(
    supervisor: Supervisor, conversation_id: int, edited: str | None, revision: str | None
) -> Conversation:
    """Compact (a storage job: the status is read in the writer's turn)."""
    conversation = load_conversation(supervisor, conversation_id)
    if conversation.status != "active":
        raise _archived(supervisor, conversation_id)
    try:
        return supervisor.compact(conversation, edited=edited, revision=revision)
    except ConversationError as error:
        if str(error) == ARCHIVED:  # another tab or process compacted it first
            raise _archived(supervisor, conversation_id) from None
        raise HTTPException(409, str(error)) from None


@router.get("/conversations/{conversation_id}/carry")
async def carry_record(
    conversation_id: ConversationId, supervisor: SupervisorDep
) -> dict[str, Any]:
    """What the compaction that made this conversation carried (from), and the one that ended it."""
    return await supervisor.storage.read(_carry, supervisor, conversation_id)


def _carry(supervisor: Supervisor, conversation_id: int) -> dict[str, Any]:
    conversation = load_conversation(supervisor, conversation_id)
    into = None
    if conversation.compacted_into_id is not None:
        with supervisor.session() as session:
            successor = store.get_conversation(
                session=session, conversation_id=conversation.compacted_into_id
            )
        into = successor.carry if successor is not None else None
    return {"from": conversation.carry, "into": into}


@router.get("/conversations/{conversation_id}/message-lines")
async def message_lines(
    conversation_id: ConversationId,
    supervisor: SupervisorDep,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> dict[str, Any]:
    """Messages as one line each, newest page first (the preview's folded list of older ones)."""
    return await supervisor.storage.read(_message_lines, supervisor, conversation_id, before, limit)


def _message_lines(
    supervisor: Supervisor, conversation_id: int, before: int | None, limit: int
) -> dict[str, Any]:
    load_conversation(supervisor, conversation_id)
    with supervisor.session() as session:
        found = store.message_lines(
            session=session, conversation_id=conversation_id, before_seq=before, limit=limit
        )
    return {
        "messages": [steer.message_view(entry) for entry in found],
        "before": found[0].seq if len(found) == limit else None,
    }


@router.get("/conversations/{conversation_id}/pins")
async def list_pins(conversation_id: ConversationId, supervisor: SupervisorDep) -> dict[str, Any]:
    """The conversation's pins (its own and those carried from the ones it was compacted from)."""
    return await supervisor.storage.read(_pins, supervisor, conversation_id)


def _pins(supervisor: Supervisor, conversation_id: int) -> dict[str, Any]:
    load_conversation(supervisor, conversation_id)
    return {"pins": supervisor_pins(supervisor, conversation_id)}


def supervisor_pins(supervisor: Supervisor, conversation_id: int) -> list[dict[str, Any]]:
    """The pins as JSON."""
    with supervisor.session() as session:
        pins = store.list_pins(session=session, conversation_id=conversation_id)
    return [steer.pin_view(pin) for pin in pins]


def _changed(supervisor: Supervisor, conversation_id: int) -> dict[str, Any]:
    """Tell the conversation's tabs its pins changed, and answer with them."""
    pins = supervisor_pins(supervisor, conversation_id)
    supervisor.hub.emit(conversation_id, {"type": "pins", "pins": pins})
    return {"pins": pins}


@router.put("/conversations/{conversation_id}/pins/{entry_id}")
async def pin(conversation_id: ConversationId, entry_id: EntryId, supervisor: SupervisorDep) -> Any:
    """Pin one of the conversation's messages (it heads every carry-over from now on)."""
    return await supervisor.storage.write(_pin, supervisor, conversation_id, entry_id)


def _pin(supervisor: Supervisor, conversation_id: int, entry_id: int) -> dict[str, Any]:
    conversation = load_conversation(supervisor, conversation_id)
    if conversation.status != "active":
        raise HTTPException(409, "This conversation is archived; its pins cannot change.")
    with supervisor.session() as session:
        entry = store.get_entry(session=session, entry_id=entry_id)
        if (
            entry is None
            or entry.conversation_id != conversation_id
            or entry.kind
            not in (
                "user",
                "agent",
            )
        ):
            raise HTTPException(404, f"No message {entry_id} in this conversation.")
        if entry.state == "queued":
            raise HTTPException(
                409, "This message has not reached the agent yet; pin it once sent."
            )
        if entry.state == "streaming":
            raise HTTPException(409, "This message is still being written; pin it once it ends.")
        if not one_line(entry.text):
            raise HTTPException(409, "This message has no text to carry.")
        held = store.count_pins(session=session, conversation_id=conversation_id)
        pinned = store.find_pin(session=session, conversation_id=conversation_id, entry_id=entry_id)
        if held >= store.MAX_PINS and pinned is None:  # pinning one again adds no pin
            raise HTTPException(409, f"At most {store.MAX_PINS} messages can be pinned.")
        store.add_pin(
            session=session, conversation=conversation, entry=entry, role=steer.role_of(entry)
        )
    return _changed(supervisor, conversation_id)


@router.delete("/conversations/{conversation_id}/pins/{entry_id}")
async def unpin(
    conversation_id: ConversationId, entry_id: EntryId, supervisor: SupervisorDep
) -> Any:
    """Unpin a message (one of its own, or one carried from an earlier conversation)."""
    return await supervisor.storage.write(_unpin, supervisor, conversation_id, entry_id)


def _unpin(supervisor: Supervisor, conversation_id: int, entry_id: int) -> dict[str, Any]:
    conversation = load_conversation(supervisor, conversation_id)
    if conversation.status != "active":
        raise HTTPException(409, "This conversation is archived; its pins cannot change.")
    with supervisor.session() as session:
        removed = store.remove_pin(
            session=session, conversation_id=conversation_id, entry_id=entry_id
        )
    if not removed:
        raise HTTPException(404, f"Message {entry_id} is not pinned in this conversation.")
    return _changed(supervisor, conversation_id)
