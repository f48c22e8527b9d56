"""The JSON API under /api (see docs/api.md)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse

from app import store
from app.agents.base import PermissionDecision
from app.attachment_store import AttachmentError
from app.config import PERMISSION_MODES, Settings
from app.context import context_view
from app.handoff import is_clear_command, parse_handoff
from app.models import (
    Conversation,
    ConversationCreate,
    ConversationUpdate,
    Handoff,
    HandoffWrite,
    MessageCreate,
    PermissionAnswer,
)
from app.providers import (
    CLAUDE_CLI_PROVIDERS,
    WINDOW_PROVIDERS,
    agent_env,
    default_provider,
    mode_refused,
    provider_infos,
)
from app.routes.deps import fetch_conversation, supervisor_of
from app.supervisor import ConversationError, Supervisor, is_compact_command
from app.supervisor.commands import DEFAULT_TITLE
from app.supervisor.pool import ModelRefused
from app.trust import project_settings, trust_question, trusted_by_claude
from app.unicode_text import has_visible_character
from app.views import conversation_view, entry_view, utc_text
from app.window import validate_setting
from app.workspace import WorkspaceError, usable_cwd

MODEL_FIXED = (
    "Only a Claude Code conversation chooses its model here; this provider's model is set by"
    " its environment variable."
)

router = APIRouter(prefix="/api")
SupervisorDep = Annotated[Supervisor, Depends(supervisor_of)]
T = TypeVar("T")
MAX_ID = 2**63 - 1  # SQLite's largest integer
PAGE_CURSOR = re.compile(r"^\d{1,17}-\d{1,19}$")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ConversationId = Annotated[int, PathParam(ge=1, le=MAX_ID)]
EntryId = Annotated[int, PathParam(ge=1, le=MAX_ID)]
Cursor = Annotated[int | None, Query(ge=1, le=MAX_ID)]  # a timeline position (seq)


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def ask_trust(provider: str, settings: Settings, cwd: Path, trust: bool) -> list[str] | None:
    """The Claude Code project files a new conversation in cwd starts with, trusted (None for
    a provider without them); 409 when some would act and nobody trusted them."""
    if provider not in CLAUDE_CLI_PROVIDERS:
        return None
    found = await asyncio.to_thread(project_settings, cwd)
    if found and not trust:
        env = agent_env(provider, settings, None)
        if not await asyncio.to_thread(trusted_by_claude, env, cwd):
            raise HTTPException(409, trust_question(found))
    return found


def resolve_cwd(settings: Settings, cwd: str | None) -> Path:
    """The conversation's working directory: inside the allowed roots, existing; else 400."""
    try:
        return usable_cwd(settings.cwd_default if cwd is None else cwd, settings.roots)
    except WorkspaceError as error:
        raise HTTPException(400, str(error)) from None


@router.get("/providers")
async def providers(request: Request) -> dict[str, Any]:
    """Every provider, whether it can run here, and the default."""
    infos = provider_infos(_settings(request))
    return {
        "providers": [info.as_dict() for info in infos],
        "default": default_provider(_settings(request), infos),
    }


@router.get("/conversations")
async def list_conversations(
    supervisor: SupervisorDep,
    status: Literal["active", "archived"] = "active",
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    before: Annotated[str | None, Query(pattern=PAGE_CURSOR.pattern, max_length=40)] = None,
    q: Annotated[str, Query(max_length=200)] = "",
) -> dict[str, Any]:
    """Conversations, most recently updated first, one page at a time (`next` → `before`);
    with `q`, only those whose title holds it (the archive's search: all of it, not the pages
    a browser has loaded)."""
    cursor = parse_cursor(before)
    title = store.storable(q.strip())  # as titles are stored (a NUL: PostgreSQL takes none)
    # Taken before the read: every global event counted up to it is in the page (docs/api.md).
    feed = supervisor.hub.feed()

    def read() -> list[Conversation]:
        with supervisor.session() as session:
            return store.list_conversations(
                session=session, status=status, limit=limit, before=cursor, title=title
            )

    page = await supervisor.storage.read(read)
    last = page[-1] if len(page) == limit else None
    return {
        "conversations": [conversation_view(c) for c in page],
        "next": make_cursor(last.updated_at, last.id or 0) if last else None,
        "feed": feed,
    }


def make_cursor(updated_at: datetime, conversation_id: int) -> str:
    """A page cursor: where a page ended, as it was then (later updates cannot move it)."""
    micros = (updated_at.astimezone(UTC) - EPOCH) // timedelta(microseconds=1)
    return f"{micros}-{conversation_id}"


def parse_cursor(cursor: str | None) -> tuple[datetime, int] | None:
    """The (time, id) a cursor stands for."""
    if cursor is None:
        return None
    micros, conversation_id = (int(part) for part in cursor.split("-"))
    if conversation_id > MAX_ID:  # 19 digits may exceed a 64-bit integer column
        raise HTTPException(422, "The page cursor is not one this relay gave out.")
    return EPOCH + timedelta(microseconds=micros), conversation_id


@router.post("/conversations", status_code=201)
async def create_conversation(
    body: ConversationCreate, request: Request, supervisor: SupervisorDep
) -> dict[str, Any]:
    """Start a conversation."""
    settings = _settings(request)
    infos = {info.id: info for info in provider_infos(settings)}
    # Left out: the default. Given empty: refused (a script's unset variable, not a choice).
    provider = body.provider
    if provider is None:
        provider = default_provider(settings, list(infos.values()))
    if provider not in infos:
        raise HTTPException(
            422, f"Unknown provider {provider!r}; choose one of {', '.join(infos)}."
        )
    if not infos[provider].available:
        raise HTTPException(
            409, f"{infos[provider].name} cannot run here: {infos[provider].reason}"
        )
    mode = settings.permission_mode if body.permission_mode is None else body.permission_mode
    if mode not in PERMISSION_MODES:
        raise HTTPException(422, f"permission_mode must be one of: {', '.join(PERMISSION_MODES)}.")
    if (refused := mode_refused(provider, mode, settings)) is not None:
        raise HTTPException(409, refused)
    title = " ".join((body.title or "").split()) or DEFAULT_TITLE
    cwd = resolve_cwd(settings, body.cwd)
    trusted = await ask_trust(provider, settings, cwd, body.trust_project)
    conversation = await supervisor.storage.write(
        supervisor.create_conversation,
        title=title,
        provider=provider,
        cwd=cwd,
        permission_mode=mode,
        trusted_settings=trusted,
    )
    return conversation_view(conversation)


@router.get("/conversations/{conversation_id}")
async def get_conversation(
    conversation_id: ConversationId,
    supervisor: SupervisorDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    before: Cursor = None,
) -> dict[str, Any]:
    """A conversation with its latest timeline page and its turn."""
    await supervisor.hub.prepare(conversation_id)  # a cluster node reads its stream first
    try:
        return await supervisor.view(conversation_id, limit=limit, before_seq=before)
    except LookupError:
        raise HTTPException(404, f"No conversation {conversation_id}.") from None


@router.patch("/conversations/{conversation_id}")
async def update_conversation(
    conversation_id: ConversationId,
    body: ConversationUpdate,
    request: Request,
    supervisor: SupervisorDep,
) -> dict[str, Any]:
    """Rename a conversation, change its permission mode, its model or its auto-compact
    window."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    changes: dict[str, Any] = {}
    given = body.model_fields_set
    if "title" in given:
        title = " ".join((body.title or "").split())
        if not title:
            raise HTTPException(422, "The title cannot be empty.")
        changes["title"] = title
    if "permission_mode" in given:
        if body.permission_mode not in PERMISSION_MODES:
            raise HTTPException(
                422, f"permission_mode must be one of: {', '.join(PERMISSION_MODES)}."
            )
        changes["permission_mode"] = body.permission_mode
        refused = mode_refused(conversation.provider, body.permission_mode, _settings(request))
        if refused is not None:
            raise HTTPException(409, refused)
    if "auto_compact_window" in given:
        try:
            changes["auto_compact_window"] = validate_setting(body.auto_compact_window)
        except ValueError as error:
            raise HTTPException(422, str(error)) from None
        if conversation.provider not in WINDOW_PROVIDERS:
            raise HTTPException(409, "This provider has no auto-compact window setting.")
    if "chosen_model" in given:
        changes["chosen_model"] = _chosen_model(conversation.provider, body.chosen_model)
    if changes and conversation.status != "active":
        raise HTTPException(409, "This conversation is archived; it can be read, not changed.")
    if changes:
        conversation = await supervisor.storage.write(
            supervisor.update_conversation, conversation, **changes
        )
    if "permission_mode" in changes:  # the live agent too, not only its next start
        await supervisor.apply_mode(conversation)
    if "chosen_model" in changes:
        try:
            await supervisor.apply_model(conversation)
        except ModelRefused as refused:  # put back already: the tabs were told
            raise HTTPException(422, str(refused)) from None
    return conversation_view(conversation)


MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/\[\]-]*")  # "opus", "claude-sonnet-4-5[1m]"


def _chosen_model(provider: str, model: str | None) -> str | None:
    """A model chosen for a conversation, checked (None or "": the provider's default)."""
    if not model:
        return None
    if provider != "claude":
        raise HTTPException(409, MODEL_FIXED)
    if MODEL_NAME.fullmatch(model) is None:
        raise HTTPException(
            422, "A model is a name such as opus, sonnet, haiku or claude-sonnet-4-5."
        )
    return model


@router.get("/conversations/{conversation_id}/context")
async def get_context(conversation_id: ConversationId, supervisor: SupervisorDep) -> dict[str, Any]:
    """Everything the 🧠 modal shows."""
    await fetch_conversation(supervisor, conversation_id)
    report, background_work = await supervisor.agent_context(conversation_id)
    conversation = await fetch_conversation(supervisor, conversation_id)  # after the report
    return context_view(
        conversation,
        env_value=os.environ.get("CLAUDE_CODE_AUTO_COMPACT_WINDOW"),
        turn_running=supervisor.turn_running(conversation),
        background_work=background_work,
        agent_report=report,
    )


@router.post(
    "/conversations/{conversation_id}/messages",
    status_code=202,
    responses={201: {"description": '`/compact` or `/clear` alone: `{"compacted_into": …}`'}},
)
async def send_message(
    conversation_id: ConversationId,
    body: MessageCreate,
    request: Request,
    supervisor: SupervisorDep,
) -> Any:
    """Store a message and queue it for the agent; `/compact` alone compacts instead."""
    limit = _settings(request).max_message_bytes
    # With images, /compact and /clear are text for the agent (SPEC §2: commands alone).
    command = not body.attachments and (
        is_compact_command(body.text) or is_clear_command(body.text)
    )
    problem = _text_problem(body.text, limit)
    if not command and problem is None:
        # One writer job reads the conversation, titles it and stores the message: no read
        # job before it on every message's path.
        title = _title_from(body.text)  # (it has a visible character: _text_problem)
        try:
            entry = await supervisor.storage.write(
                supervisor.send, conversation_id, body.text, title, body.attachments
            )
        except LookupError:
            raise HTTPException(404, f"No conversation {conversation_id}.") from None
        except (ConversationError, AttachmentError) as error:
            raise HTTPException(409, str(error)) from None
        return entry_view(entry)
    conversation = await fetch_conversation(supervisor, conversation_id)
    if problem is not None:  # after the 404: a missing conversation is said first
        raise problem
    if conversation.status != "active":  # before anything changes
        raise HTTPException(409, "This conversation is archived; it cannot be compacted again.")
    try:
        if is_compact_command(body.text):
            new = await supervisor.storage.write(supervisor.compact, conversation)
            return JSONResponse({"compacted_into": conversation_view(new)}, status_code=201)
        # /clear: /compact with the project's latest handoff
        new = await supervisor.storage.write(supervisor.compact, conversation, handoff=True)
        return JSONResponse({"compacted_into": conversation_view(new)}, status_code=201)
    except ConversationError as error:
        raise HTTPException(409, str(error)) from None


def _text_problem(text: str, limit: int) -> HTTPException | None:
    """Why a message's text is refused (413 too long, 422 empty), or None."""
    if len(text.encode()) > limit:
        return HTTPException(413, f"The message is over the limit of {limit} bytes.")
    if not has_visible_character(text):  # blank, or zero-width and other invisible ones alone
        return HTTPException(422, "The message is empty.")
    return None


def _title_from(text: str) -> str:
    """A conversation title from its first message."""
    line = " ".join(text.split())
    return line if len(line) <= 60 else line[:59].rstrip() + "…"


@router.post("/conversations/{conversation_id}/interrupt", status_code=202)
async def interrupt(conversation_id: ConversationId, supervisor: SupervisorDep) -> dict[str, bool]:
    """Stop the running turn (Stop button)."""
    await fetch_conversation(supervisor, conversation_id)
    return {"interrupted": await supervisor.interrupt(conversation_id)}


@router.post("/conversations/{conversation_id}/permissions/{entry_id}")
async def answer_permission(
    conversation_id: ConversationId,
    entry_id: EntryId,
    body: PermissionAnswer,
    supervisor: SupervisorDep,
) -> dict[str, Any]:
    """Allow or deny a tool the agent asked to run; the first answer wins."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    try:
        decision = PermissionDecision(
            body.allow, body.message, answers=body.answers, mode=body.mode
        )
        entry = await supervisor.storage.write(supervisor.answer, conversation, entry_id, decision)
    except ValueError as error:  # answers that do not fit the question
        raise HTTPException(400, str(error)) from None
    except LookupError as error:
        raise HTTPException(404, str(error)) from None
    except ConversationError as error:
        raise HTTPException(409, str(error)) from None
    return entry_view(entry)


def handoff_view(handoff: Handoff | None) -> dict[str, Any] | None:
    """A stored handoff as JSON."""
    if handoff is None:
        return None
    return {
        "id": handoff.id,
        "done": handoff.done,
        "next": handoff.next,
        "files": list(handoff.files),
        "source": handoff.source,
        "conversation_id": handoff.conversation_id,
        "created_at": utc_text(handoff.created_at),
    }


@router.get("/conversations/{conversation_id}/handoff")
async def get_handoff(conversation_id: ConversationId, supervisor: SupervisorDep) -> dict[str, Any]:
    """The latest handoff of the conversation's project (its working directory), or null."""
    conversation = await fetch_conversation(supervisor, conversation_id)

    def read() -> Handoff | None:
        with supervisor.session() as session:
            return store.latest_handoff(session=session, cwd=conversation.cwd)

    latest = await supervisor.storage.read(read)
    return {"cwd": conversation.cwd, "handoff": handoff_view(latest)}


@router.put("/conversations/{conversation_id}/handoff")
async def put_handoff(
    conversation_id: ConversationId, body: HandoffWrite, supervisor: SupervisorDep
) -> dict[str, Any]:
    """Write or edit the project's handoff (stored as its newest one)."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    if conversation.status != "active":
        raise HTTPException(409, "This conversation is archived; it can be read, not changed.")
    try:
        handoff = parse_handoff(body.model_dump())
    except ValueError as error:
        raise HTTPException(422, str(error)) from None
    row = await supervisor.storage.write(
        supervisor.save_handoff, conversation, handoff, source="user"
    )
    return {"cwd": conversation.cwd, "handoff": handoff_view(row)}


async def _on_entry(
    supervisor: Supervisor,
    conversation_id: int,
    job: Callable[[Conversation, int], T],
    entry_id: int,
) -> T:
    """A writer job on one entry of a conversation: 404 when there is no such entry, 409 when
    the conversation refuses it (archived, being deleted, the entry past it)."""
    conversation = await fetch_conversation(supervisor, conversation_id)
    try:
        return await supervisor.storage.write(job, conversation, entry_id)
    except LookupError as error:
        raise HTTPException(404, str(error)) from None
    except ConversationError as error:
        raise HTTPException(409, str(error)) from None


@router.post("/conversations/{conversation_id}/messages/{entry_id}/resend", status_code=202)
async def resend_message(
    conversation_id: ConversationId, entry_id: EntryId, supervisor: SupervisorDep
) -> dict[str, Any]:
    """Queue again, as a new message, a message whose turn a relay restart cut (Resend)."""
    return entry_view(await _on_entry(supervisor, conversation_id, supervisor.resend, entry_id))


@router.post("/conversations/{conversation_id}/lines/{entry_id}/trust", status_code=202)
async def trust_and_resend(
    conversation_id: ConversationId, entry_id: EntryId, supervisor: SupervisorDep
) -> dict[str, Any]:
    """Trust the Claude Code project files a refused agent start's line names (they appeared
    in the folder since it was trusted), and queue its message again (Trust and resend)."""
    job = supervisor.trust_and_resend
    entry = await _on_entry(supervisor, conversation_id, job, entry_id)
    return {"message": None if entry is None else entry_view(entry)}


@router.delete("/conversations/{conversation_id}/messages/{entry_id}")
async def withdraw_message(
    conversation_id: ConversationId, entry_id: EntryId, supervisor: SupervisorDep
) -> dict[str, Any]:
    """Take a queued message back before the agent gets it (Edit); answers with it, text and
    all. 409 once it has gone to the agent."""
    return entry_view(await _on_entry(supervisor, conversation_id, supervisor.withdraw, entry_id))
