"""The attachment table: plain functions over a Session, as app/store.py's."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Connection, delete, func, or_, update
from sqlmodel import Session, col, select

from app.attachments import MAX_UNSENT, Image
from app.models import Attachment, Conversation

GONE = "An attached image is no longer there (removed, or sent already): attach it again."


class AttachmentError(Exception):
    """An attachment cannot be stored or sent; the message says why."""


def add_attachment(
    *, session: Session, conversation_id: int, media_type: str, content: bytes
) -> Attachment:
    """Store an uploaded image (of the type attachments.media_type_of read) for a message."""
    # The conversation's row locked (PostgreSQL; SQLite has one writer): two nodes' uploads
    # count and add one at a time.
    session.exec(
        select(Conversation.id).where(Conversation.id == conversation_id).with_for_update()
    ).first()
    unsent = session.exec(
        select(func.count())
        .select_from(Attachment)
        .where(Attachment.conversation_id == conversation_id)
        .where(col(Attachment.entry_id).is_(None))
    ).one()
    if unsent >= MAX_UNSENT:
        raise AttachmentError(
            f"This conversation already has {MAX_UNSENT} images waiting to be sent:"
            " send them or remove some first."
        )
    attachment = Attachment(
        conversation_id=conversation_id, media_type=media_type, size=len(content), content=content
    )
    session.add(attachment)
    session.commit()
    session.refresh(attachment, ["id", "created_at"])
    return attachment


def describe(*, session: Session, conversation_id: int, ids: Sequence[int]) -> list[dict[str, Any]]:
    """What a message's data says of its images ({id, media_type, size}, in the order given):
    each must be unsent and this conversation's (AttachmentError)."""
    if len(set(ids)) != len(ids):
        raise AttachmentError("The same image is attached twice.")
    rows = session.exec(
        select(Attachment.id, Attachment.media_type, Attachment.size)
        .where(col(Attachment.id).in_(ids))
        .where(Attachment.conversation_id == conversation_id)
        .where(col(Attachment.entry_id).is_(None))
    ).all()
    found = {row[0]: {"id": row[0], "media_type": row[1], "size": row[2]} for row in rows}
    if len(found) != len(ids):
        raise AttachmentError(GONE)
    return [found[i] for i in ids]


def claim(
    connection: Connection, conversation_id: int, ids: Collection[int], entry_id: int
) -> None:
    """Mark the images sent with a message, in its transaction (AttachmentError: one was taken)."""
    result = connection.execute(
        update(Attachment)
        .where(col(Attachment.id).in_(list(ids)))
        .where(col(Attachment.conversation_id) == conversation_id)
        .where(col(Attachment.entry_id).is_(None))
        .values(entry_id=entry_id)
    )
    if result.rowcount != len(ids):
        raise AttachmentError(GONE)


def unsent(*, session: Session, conversation_id: int) -> list[dict[str, Any]]:
    """The images uploaded to a conversation and not sent yet, oldest first."""
    rows = session.exec(
        select(Attachment.id, Attachment.media_type, Attachment.size)
        .where(Attachment.conversation_id == conversation_id)
        .where(col(Attachment.entry_id).is_(None))
        .order_by(col(Attachment.id))
    ).all()
    return [{"id": row[0], "media_type": row[1], "size": row[2]} for row in rows]


def get_attachment(*, session: Session, attachment_id: int) -> Attachment | None:
    """One attachment, bytes included."""
    return session.get(Attachment, attachment_id)


def remove_unsent(*, session: Session, conversation_id: int, attachment_id: int) -> bool:
    """Delete an image not sent yet (the composer's ✕); False when there is none such."""
    result = session.connection().execute(
        delete(Attachment)
        .where(col(Attachment.id) == attachment_id)
        .where(col(Attachment.conversation_id) == conversation_id)
        .where(col(Attachment.entry_id).is_(None))
    )
    session.commit()
    return bool(result.rowcount)


def images(*, session: Session, ids: Sequence[int]) -> list[Image]:
    """A message's images as its agent is sent them, in their order (one gone is left out)."""
    rows = session.exec(
        select(Attachment.id, Attachment.media_type, Attachment.content).where(
            col(Attachment.id).in_(ids)
        )
    ).all()
    found = {row[0]: Image(row[1], row[2]) for row in rows}
    return [found[i] for i in ids if i in found]


def delete_for_conversation(connection: Connection, conversation_id: int) -> None:
    """A deleted conversation's images go with it (in its transaction)."""
    connection.execute(delete(Attachment).where(col(Attachment.conversation_id) == conversation_id))


def move(connection: Connection, old: int, new: int, entry_ids: Collection[int]) -> None:
    """Messages moved from conversation old to new (by /compact) take their images, and the
    images waiting unsent in old wait in new (in the move's transaction)."""
    waiting = col(Attachment.entry_id).is_(None)
    moved = col(Attachment.entry_id).in_(list(entry_ids)) if entry_ids else None
    connection.execute(
        update(Attachment)
        .where(col(Attachment.conversation_id) == old)
        .where(waiting if moved is None else or_(waiting, moved))
        .values(conversation_id=new)
    )


def release(connection: Connection, entry_id: int) -> None:
    """A message taken back from the queue (Edit) gives its images back, unsent."""
    connection.execute(
        update(Attachment).where(col(Attachment.entry_id) == entry_id).values(entry_id=None)
    )
