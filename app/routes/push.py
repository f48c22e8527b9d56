"""Web Push subscriptions (SPEC §9 Notify): the relay's public key, subscribe, unsubscribe."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import ConfigDict
from sqlalchemy import func
from sqlmodel import Field, SQLModel, select

from app.db import get_session
from app.models import PushSubscription, Text
from app.notify import MAX_SUBSCRIPTIONS, Notifier
from app.push import MAX_ENDPOINT, key_problem
from app.security import COOKIE
from app.storage import Storage

router = APIRouter(prefix="/api/push", tags=["notify"])


class PushKeys(SQLModel):
    """The browser's keys of a subscription (PushSubscription.toJSON().keys)."""

    p256dh: Text = Field(max_length=100)
    auth: Text = Field(max_length=50)


class PushSubscriptionCreate(SQLModel):
    """A browser's PushSubscription.toJSON() (expirationTime is accepted and not used)."""

    model_config = ConfigDict(extra="ignore")  # type: ignore[assignment]

    endpoint: Text = Field(max_length=MAX_ENDPOINT)
    keys: PushKeys
    expirationTime: float | None = None  # the Push API's own name


class PushUnsubscribe(SQLModel):
    """Which subscription to forget."""

    endpoint: Text = Field(max_length=MAX_ENDPOINT)


def notifier_of(request: Request) -> Notifier:
    """The running notifier."""
    notifier: Notifier = request.app.state.notifier
    return notifier


def storage_of(request: Request) -> Storage:
    """The relay's database threads."""
    storage: Storage = request.app.state.supervisor.storage
    return storage


async def browser_session(request: Request) -> str | None:
    """The key of the request's login session; 403 when the relay has a token and there is none."""
    sessions = request.app.state.sessions
    if sessions is None:
        return None  # no token (loopback only): no sessions to tie subscriptions to
    session_id = request.cookies.get(COOKIE)
    if not session_id or not await asyncio.to_thread(sessions.valid, session_id):
        raise HTTPException(
            403, "Turn notifications on from a logged-in browser (a bearer token has no browser)."
        )
    key: str = sessions.key(session_id)
    return key


@router.get("/key")
async def push_key(request: Request) -> dict[str, str]:
    """The relay's VAPID public key: the applicationServerKey browsers subscribe with."""
    return {"public_key": notifier_of(request).public_key}


@router.post("/subscriptions", status_code=201)
async def subscribe(body: PushSubscriptionCreate, request: Request) -> dict[str, Any]:
    """Store this browser's push subscription (again: its keys and session are updated)."""
    notifier = notifier_of(request)
    problem = notifier.endpoint_problem(body.endpoint) or key_problem(
        body.keys.p256dh, body.keys.auth
    )
    if problem is not None:
        raise HTTPException(422, problem)
    session_key = await browser_session(request)
    await storage_of(request).write(_store, notifier, body, session_key)
    return {"endpoint": body.endpoint}


def _store(notifier: Notifier, body: PushSubscriptionCreate, session_key: str | None) -> None:
    """Store or update a subscription (a storage job)."""
    with get_session(notifier.engine) as session:
        row = session.exec(
            select(PushSubscription).where(PushSubscription.endpoint == body.endpoint)
        ).first()
        if row is None:
            count = session.exec(select(func.count()).select_from(PushSubscription)).one()
            if count >= MAX_SUBSCRIPTIONS:
                raise HTTPException(
                    409,
                    f"The relay holds {MAX_SUBSCRIPTIONS} push subscriptions already; turn "
                    "notifications off in a browser you no longer use.",
                )
            row = PushSubscription(endpoint=body.endpoint, p256dh="", auth="")
        row.p256dh, row.auth, row.session_key = body.keys.p256dh, body.keys.auth, session_key
        row.token_tag = notifier.token_tag
        session.add(row)
        session.commit()


@router.delete("/subscriptions", status_code=204)
async def unsubscribe(body: PushUnsubscribe, request: Request) -> Response:
    """Forget a push subscription (nothing happens when it is unknown)."""
    await storage_of(request).write(notifier_of(request).remove, body.endpoint)
    return Response(status_code=204)
