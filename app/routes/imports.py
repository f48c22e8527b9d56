"""Sessions started in a terminal: list the workspace roots' Claude Code sessions, import one."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, StrictBool

from app import imports
from app.agents.transcript import config_dir, live_sessions
from app.config import PermissionMode, Settings
from app.models import Conversation
from app.providers import agent_env, mode_refused, provider_infos
from app.routes.api import SupervisorDep, ask_trust, resolve_cwd
from app.supervisor import Supervisor
from app.views import conversation_view, utc_text

router = APIRouter(prefix="/api")
SessionId = Annotated[str, PathParam(pattern=imports.SESSION_ID.pattern, max_length=36)]


class ImportOptions(BaseModel):
    """What a client may choose for an imported conversation."""

    model_config = ConfigDict(extra="forbid")

    permission_mode: PermissionMode | None = None
    trust_project: StrictBool = False  # the folder's own Claude Code settings may act


def claude_config(settings: Settings) -> Path:
    """The config directory the relay's Claude Code agents use (CLAUDE_CONFIG_DIR or ~/.claude)."""
    return config_dir(agent_env("claude", settings, None))


def _running_in_terminal(config: Path, session_id: str) -> int | None:
    """The pid of a CLI outside this relay that has the session open, if any."""
    return next((s.pid for s in live_sessions(config) if s.session_id == session_id), None)


@router.get("/claude-sessions")
async def list_claude_sessions(request: Request, supervisor: SupervisorDep) -> dict[str, Any]:
    """Claude Code sessions whose cwd is inside the workspace roots, newest first."""
    settings: Settings = request.app.state.settings
    config = claude_config(settings)
    # Which of the sessions it looks at conversations hold: those do not count to its cap.
    ids = await asyncio.to_thread(imports.candidate_ids, config, settings.roots)
    held = await supervisor.storage.read(_holders, supervisor, ids)
    found, more = await asyncio.to_thread(imports.list_sessions, config, settings.roots, held)
    return {
        "config_dir": str(config),
        "sessions": [
            {
                "session_id": s.session_id,
                "cwd": s.cwd,
                "title": s.title,
                "updated_at": utc_text(datetime.fromtimestamp(s.updated_at, UTC)),
                "size": s.size,
                "conversation_id": held.get(s.session_id),
            }
            for s in found
        ],
        "more": more,
    }


@router.post("/claude-sessions/{session_id}/import", status_code=201)
async def import_claude_session(
    session_id: SessionId,
    request: Request,
    supervisor: SupervisorDep,
    body: ImportOptions | None = None,
) -> dict[str, Any]:
    """Create a conversation that resumes the session, its history in the timeline."""
    settings: Settings = request.app.state.settings
    config = claude_config(settings)
    claude = next(info for info in provider_infos(settings) if info.id == "claude")
    if not claude.available:
        raise HTTPException(409, f"{claude.name} cannot run here: {claude.reason}")
    mode = (body and body.permission_mode) or settings.permission_mode
    if (refused := mode_refused("claude", mode, settings)) is not None:
        raise HTTPException(409, refused)
    path = imports.find_transcript(config, session_id)
    if path is None:
        raise HTTPException(404, f"No Claude Code session {session_id} in {config / 'projects'}.")
    held = await supervisor.storage.read(_holder, supervisor, session_id)
    if held is not None:
        raise HTTPException(409, f"This session is already conversation {held}.")
    try:
        cwd, title = await asyncio.to_thread(imports.session_summary, path)
    except OSError as error:
        raise HTTPException(
            404, f"The session's transcript cannot be read: {error.strerror}."
        ) from None
    if cwd is None:
        raise HTTPException(422, "The session's transcript names no working directory.")
    resolved = resolve_cwd(settings, cwd)  # 400 when outside the roots or gone
    # (a terminal's Claude Code asked already: trusted)
    trusted = await ask_trust("claude", settings, resolved, bool(body and body.trust_project))
    pid = await asyncio.to_thread(_running_in_terminal, config, session_id)
    if pid is not None:
        raise HTTPException(
            409, f"This session is still open in a terminal (process {pid}); quit it there first."
        )
    try:
        history = await asyncio.to_thread(imports.read_history, path)
    except OSError as error:
        raise HTTPException(
            404, f"The session's transcript cannot be read: {error.strerror}."
        ) from None

    def save() -> Conversation:
        with supervisor.session() as session:
            # Checked again: another import may have finished while the transcript was read.
            held = imports.holder(session, session_id)
            if held is not None:
                raise HTTPException(409, f"This session is already conversation {held}.")
            return imports.save_import(
                session,
                title=title or "Imported session",
                cwd=str(resolved),
                session_id=session_id,
                permission_mode=mode,
                trusted_settings=trusted,
                history=history,
                entries=imports.notes(session_id, str(resolved), history) + history.entries,
            )

    conversation = await supervisor.storage.write(save)
    view = conversation_view(conversation)
    supervisor.hub.broadcast({"type": "conversation", "conversation": view})
    return view


def _holders(supervisor: Supervisor, session_ids: list[str]) -> dict[str, int]:
    """The conversations that already resume these sessions (in a storage thread)."""
    with supervisor.session() as session:
        return imports.holders(session, session_ids)


def _holder(supervisor: Supervisor, session_id: str) -> int | None:
    """The conversation that already resumes the session, if any (in a storage thread)."""
    with supervisor.session() as session:
        return imports.holder(session, session_id)
