"""What the routes share: the supervisor, and loading a conversation or failing with 404."""

from __future__ import annotations

from fastapi import HTTPException, Request

from app import store
from app.models import Conversation
from app.supervisor import Supervisor


async def supervisor_of(request: Request) -> Supervisor:
    """The running supervisor (async: FastAPI runs a plain def dependency in a worker
    thread, a thread round trip before every API request's handler)."""
    supervisor: Supervisor = request.app.state.supervisor
    return supervisor


async def fetch_conversation(supervisor: Supervisor, conversation_id: int) -> Conversation:
    """The conversation, or 404: read in a storage thread, never on the event loop."""
    return await supervisor.storage.read(load_conversation, supervisor, conversation_id)


def load_conversation(supervisor: Supervisor, conversation_id: int) -> Conversation:
    """The conversation, or 404 (it reads the database: call it from a thread)."""
    with supervisor.session() as session:
        conversation = store.get_conversation(session=session, conversation_id=conversation_id)
    if conversation is None:
        raise HTTPException(404, f"No conversation {conversation_id}.")
    return conversation
