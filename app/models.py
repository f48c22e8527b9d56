"""Database tables and the API's request/response schemas."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    StrictBool,
    StrictInt,
    field_validator,
)
from pydantic_core import PydanticCustomError
from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    UniqueConstraint,
    text,
)
from sqlmodel import Field, SQLModel

from app.config import PermissionMode
from app.unicode_text import has_visible_character, is_valid_unicode

EntryKind = Literal["user", "agent", "activity", "line"]
TurnState = Literal["idle", "running", "compacting"]


def _unicode_only(value: object) -> object:
    """Refuse text that cannot be stored as UTF-8 (a lone surrogate such as \\ud800)."""
    if isinstance(value, str) and not is_valid_unicode(value):
        raise PydanticCustomError(
            "unicode", "The text is not valid Unicode (it holds a lone surrogate such as \\ud800)."
        )
    return value


def _visible_title(title: str | None) -> str | None:
    """Refuse a title that looks empty but is not (zero-width or other invisible characters)."""
    if title is not None and " ".join(title.split()) and not has_visible_character(title):
        raise PydanticCustomError("title_invisible", "The title has no visible character.")
    return title


def _no_nul(value: str | None) -> str | None:
    """Refuse a NUL character (PostgreSQL cannot store one; SQLite answers the same)."""
    if value is not None and "\x00" in value:
        raise PydanticCustomError("nul", "The text cannot contain a NUL character.")
    return value


def without_blank_edges(value: str) -> str:
    """A message without the blank lines before and after it: in a bubble they are only
    empty space. Its first line keeps its indentation, its last line its spaces."""
    text = value.rstrip()
    if "\n" not in value[len(text) :]:  # no line break after the text: spaces as typed
        text = value
    lead = len(text) - len(text.lstrip())
    return text[text.rfind("\n", 0, lead) + 1 :]


# Every string a client sends: valid Unicode, checked before any other rule.
Text = Annotated[str, BeforeValidator(_unicode_only)]
# What the user says to the agent, as a message's text is: no NUL (an agent reading it, and
# PostgreSQL storing it, would each see another text).
Said = Annotated[Text, AfterValidator(_no_nul)]
Answer = Annotated[Said, Field(max_length=5000)]  # one answer to one of the agent's questions


# Every integer column holds 64 bits, as SQLite's INTEGER does (ids up to 2**63 - 1 reach the
# database): BIGINT on PostgreSQL; SQLite keeps INTEGER, the name a rowid primary key needs.
BigInt = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)


# SQLite's AUTOINCREMENT: a deleted row's id is never given again (without it, deleting the
# newest conversation gave its id, its links and its tabs' places to the next one; migration
# 0010). PostgreSQL's sequences never reuse one.
NEVER_REUSED = {"sqlite_autoincrement": True}
# The condition of the index a timeline page is read with, written as its query writes it (a
# literal: SQLite uses a partial index only for a query whose terms imply its condition).
NOT_QUEUED = "state != 'queued'"


class Conversation(SQLModel, table=True):
    """A titled thread with one agent session; archived ones are read-only."""

    __table_args__ = (
        Index("ix_conversation_status_updated", "status", "updated_at", "id"),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, primary_key=True, sa_type=BigInt)
    title: str
    provider: str
    status: str = "active"  # active | archived
    cwd: str
    permission_mode: str = "default"
    session_id: str | None = None  # the agent's own session id, for resume
    context_tokens: int | None = Field(default=None, sa_type=BigInt)
    model: str | None = None  # the model the agent last said it uses
    model_window: int | None = Field(default=None, sa_type=BigInt)
    chosen_model: str | None = None  # the user's choice (Claude Code's --model); None: default
    # The user's setting (None = Auto), and the one the agent process was started with.
    auto_compact_window: int | None = Field(default=None, sa_type=BigInt)
    applied_window: int | None = Field(default=None, sa_type=BigInt)
    pending_summary: str | None = None  # /compact carry-over, consumed by the first message
    compacted_from_id: int | None = Field(
        default=None, foreign_key="conversation.id", sa_type=BigInt
    )
    compacted_into_id: int | None = Field(
        default=None, foreign_key="conversation.id", sa_type=BigInt
    )
    turn_active: bool = False  # a turn was running: lets a restart tell it was cut short
    # The highest sequence number stored for this conversation.
    last_seq: int = Field(default=0, sa_type=BigInt)
    # User and agent messages that reached the agent (not queued): the /compact preview's
    # "older ones" without counting a long conversation (kept by app/store.py, migration 0006).
    message_count: int = Field(default=0, sa_type=BigInt)
    # Permission and AskUserQuestion questions waiting for the user's answer (pending entries,
    # kept by app/store.py, migration 0011): the sidebar shows who waits for an answer.
    questions: int = Field(default=0, sa_type=BigInt)
    # What the /compact, /clear or fresh start that made this conversation carried and left
    # out (app/steer.py); None for a conversation that was not compacted from another.
    carry: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # The Claude Code project files trusted for its folder (app/trust.py, migration 0015):
    # an agent start that finds another asks first; None: not recorded yet (the next start
    # records what it finds).
    trusted_settings: list[str] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class Entry(SQLModel, table=True):
    """One item of a conversation's timeline, ordered by seq."""

    __table_args__ = (
        UniqueConstraint("conversation_id", "seq", name="uq_entry_conversation_seq"),
        Index("ix_entry_conversation_kind_seq", "conversation_id", "kind", "seq"),
        Index("ix_entry_conversation_state_seq", "conversation_id", "state", "seq"),
        Index("ix_entry_state_conversation", "state", "conversation_id"),  # startup recovery
        # A timeline page: the last entries that are not queued, however many are (store.py).
        Index(
            "ix_entry_conversation_shown_seq",
            "conversation_id",
            "seq",
            sqlite_where=text(NOT_QUEUED),
            postgresql_where=text(NOT_QUEUED),
        ),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, primary_key=True, sa_type=BigInt)
    conversation_id: int = Field(foreign_key="conversation.id", sa_type=BigInt)
    seq: int = Field(sa_type=BigInt)
    kind: str  # user | agent | activity | line
    text: str = ""
    state: str = "done"  # user: queued|sent; agent: streaming|done|interrupted; line: running|done
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class Attachment(SQLModel, table=True):
    """An image the user attached: uploaded first (entry_id None), then sent with a message.

    In the database, not on disk: every relay node of a cluster serves and sends it.
    """

    __table_args__ = (
        Index("ix_attachment_conversation_entry", "conversation_id", "entry_id"),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, primary_key=True, sa_type=BigInt)
    conversation_id: int = Field(foreign_key="conversation.id", sa_type=BigInt)
    entry_id: int | None = Field(default=None, sa_type=BigInt)  # the message it was sent with
    media_type: str = Field(max_length=20)  # image/png, image/jpeg, image/gif or image/webp
    size: int = Field(sa_type=BigInt)
    content: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class Pin(SQLModel, table=True):
    """A pinned message, held by a conversation; a compaction copies its pins to the successor.

    The message's text is copied: a pin stays whole even when its conversation is deleted.
    """

    __table_args__ = (
        UniqueConstraint("conversation_id", "entry_id", name="uq_pin_conversation_entry"),
    )

    id: int | None = Field(default=None, primary_key=True, sa_type=BigInt)
    conversation_id: int = Field(foreign_key="conversation.id", sa_type=BigInt)
    entry_id: int = Field(sa_type=BigInt)  # the pinned message (maybe of an ancestor)
    source_id: int = Field(sa_type=BigInt)  # the conversation the message was written in
    source_seq: int = Field(sa_type=BigInt)
    role: str  # user | agent
    text: str
    created_at: datetime = Field(default_factory=utcnow)


class LoginSession(SQLModel, table=True):
    """A browser's login: only a keyed hash of its cookie is stored, never the cookie."""

    __tablename__ = "login_session"

    id: int | None = Field(default=None, primary_key=True, sa_type=BigInt)
    # HMAC-SHA256 of the cookie value keyed with the token: a new token matches no row.
    key: str = Field(unique=True, max_length=64)
    created_at: datetime = Field(default_factory=utcnow)
    # Unix time: compared in SQL, no time zone to get wrong.
    expires_at: int = Field(sa_type=BigInt)


class Handoff(SQLModel, table=True):
    """A handoff for a project (a working directory); the newest one per project wins."""

    __table_args__ = (Index("ix_handoff_cwd_id", "cwd", "id"),)

    id: int | None = Field(default=None, primary_key=True, sa_type=BigInt)
    cwd: str
    done: str
    next: str
    files: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    source: str = "agent"  # agent (the save_handoff tool) | user (written in the 🧠 modal)
    conversation_id: int | None = Field(default=None, foreign_key="conversation.id", sa_type=BigInt)
    created_at: datetime = Field(default_factory=utcnow)


class PushSubscription(SQLModel, table=True):
    """A browser's Web Push subscription; it ends with the login session it was made in."""

    __tablename__ = "push_subscription"

    id: int | None = Field(default=None, primary_key=True, sa_type=BigInt)
    endpoint: str = Field(unique=True, max_length=2048)  # the push service's URL for it
    p256dh: str = Field(max_length=100)  # the browser's public key (base64url)
    auth: str = Field(max_length=50)  # the browser's auth secret (base64url)
    # The login session's key (None when the relay runs without a token): logging out, or the
    # session expiring, deletes the subscription with it.
    session_key: str | None = Field(
        default=None, max_length=64, foreign_key="login_session.key", ondelete="CASCADE"
    )
    # HMAC of a fixed text keyed with the token it was made under: a new token stops its pushes
    # (the login_session rows of an old token stay until they expire).
    token_tag: str | None = Field(default=None, max_length=64)
    created_at: datetime = Field(default_factory=utcnow)


class Lease(SQLModel, table=True):
    """Which relay node runs a conversation's agent, and until when (several nodes only).

    Taken and renewed with the database's clock (now()), so the nodes' clocks do not matter.
    """

    __table_args__ = (Index("ix_lease_node", "node"),)

    conversation_id: int = Field(
        sa_type=BigInt, primary_key=True, sa_column_kwargs={"autoincrement": False}
    )
    node: str
    expires_at: datetime = Field(sa_type=DateTime(timezone=True))  # type: ignore[call-overload]


class ClusterNode(SQLModel, table=True):
    """A live relay node's last heartbeat and its Redis's epoch (several nodes only): nodes on
    different Redis databases are told apart through it (app/cluster/same_redis.py)."""

    __tablename__ = "cluster_node"  # type: ignore[assignment]

    name: str = Field(primary_key=True)
    epoch: str
    lease: float  # its OARLOCK_LEASE_SECONDS: it writes its row every third of it
    seen_at: datetime = Field(sa_type=DateTime(timezone=True))  # type: ignore[call-overload]


class HandoffWrite(SQLModel):
    """A handoff the user writes or edits in the 🧠 modal."""

    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]

    # No per-field limit: the 9,000-character limit is on all three together (app/handoff.py),
    # and the request body is bounded by the security middleware.
    done: Text
    next: Text
    files: list[Text] = Field(default_factory=list, max_length=500)

    _text_nul = field_validator("done", "next")(_no_nul)

    @field_validator("files")
    @classmethod
    def _files_nul(cls, files: list[str]) -> list[str]:
        """Refuse a NUL in any file name, as in the texts."""
        for name in files:
            _no_nul(name)
        return files


class ConversationCreate(SQLModel):
    """What a client may say when it creates a conversation."""

    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]

    title: Text | None = Field(default=None, max_length=200)
    provider: Text | None = None
    cwd: Text | None = Field(default=None, max_length=4096)
    permission_mode: Text | None = None
    trust_project: StrictBool = False  # the folder's own Claude Code settings may act (trust)

    _title = field_validator("title")(_visible_title)
    _title_nul = field_validator("title")(_no_nul)


class ConversationUpdate(SQLModel):
    """What a client may change on a conversation."""

    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]

    title: Text | None = Field(default=None, max_length=200)
    permission_mode: Text | None = None
    # Taken as sent, for window.validate_setting to judge ("100000" or true is not a notch).
    auto_compact_window: Any = None
    chosen_model: Text | None = Field(default=None, max_length=100)

    _title = field_validator("title")(_visible_title)
    _title_nul = field_validator("title")(_no_nul)


class MessageCreate(SQLModel):
    """A message typed by the user."""

    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]

    text: Text
    # Images uploaded to this conversation (POST …/attachments), sent with the text.
    attachments: list[Annotated[StrictInt, Field(ge=1, le=2**63 - 1)]] = Field(
        default_factory=list, max_length=5
    )

    _text_nul = field_validator("text")(_no_nul)
    _text_edges = field_validator("text")(without_blank_edges)


class PermissionAnswer(SQLModel):
    """The user's answer to an agent's permission question."""

    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]

    allow: StrictBool  # true or false: "yes", 1 or "false" would be read as a choice not made
    message: Said = Field(default="", max_length=2000)
    # The answers to an AskUserQuestion: question → answer (app/questions.py checks them).
    answers: dict[Said, Answer] | None = Field(default=None, max_length=20)
    # An approved plan's mode (ExitPlanMode): default or acceptEdits (app/questions.py).
    mode: PermissionMode | None = None


class EntryPublic(SQLModel):
    """A timeline entry as clients see it."""

    id: int
    seq: int
    kind: str
    text: str
    state: str
    data: dict[str, Any]
    html: str | None = None
    created_at: datetime


class ConversationPublic(SQLModel):
    """A conversation as clients see it (without its timeline)."""

    id: int
    title: str
    provider: str
    status: str
    cwd: str
    permission_mode: str
    session_id: str | None
    context_tokens: int | None
    model: str | None
    model_window: int | None
    chosen_model: str | None
    auto_compact_window: int | None
    pending_summary: str | None
    compacted_from_id: int | None
    compacted_into_id: int | None
    questions: int  # questions waiting for the user's answer (the sidebar's "needs you")
    created_at: datetime
    updated_at: datetime
