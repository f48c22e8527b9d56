"""Steering a compaction (SPEC §8): the preview, the edited carry-over, pins, the record."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlmodel import Session

from app import store
from app.handoff import carry_over as handoff_carry_over
from app.handoff import handoff_text
from app.models import Conversation, Entry, Pin
from app.summary import (
    SUMMARY_MESSAGES,
    SummaryMessage,
    build_summary,
    cut_carry,
    cut_line,
    left_out,
    left_out_text,
    one_line,
    with_pins,
)

CarryKind = Literal["compact", "clear", "backup"]
STALE = "The conversation changed since this preview; check the new one and confirm again."


def role_of(entry: Entry) -> Literal["user", "agent"]:
    """A message entry's role."""
    return "user" if entry.kind == "user" else "agent"


def message_view(entry: Entry, *, pinned: bool = False) -> dict[str, Any]:
    """A message as one line (what a carry-over or the left-out list shows of it)."""
    return {
        "entry_id": entry.id,
        "seq": entry.seq,
        "role": role_of(entry),
        "line": cut_line(one_line(entry.text)),
        "pinned": pinned,
    }


def pin_view(pin: Pin) -> dict[str, Any]:
    """A pin as JSON: the message it holds, as one line and whole."""
    return {
        "entry_id": pin.entry_id,
        "conversation_id": pin.source_id,
        "seq": pin.source_seq,
        "role": pin.role,
        "line": cut_line(one_line(pin.text)),
        "text": pin.text,
    }


@dataclass
class Plan:
    """What a compaction carries and leaves out: the preview, and the record stored after."""

    kind: CarryKind
    summary: str | None  # the carry-over as built (unedited)
    pins: list[Pin]
    carried: list[Entry] = field(default_factory=list)  # chosen messages with a line
    newest: list[Entry] = field(default_factory=list)  # the newest left out (not pinned)
    older: int = 0  # older messages left out (not pinned)
    older_before: int | None = None  # they are the messages before this seq
    edited: bool = False
    # What the carry-over holds besides pins and chosen messages, named in the record: "handoff"
    # (/clear), "backup" (a fresh start), "earlier" (a pending carry-over, carried on).
    source: str | None = None
    # The summary without the text of a reply still streaming, when it carries one: the
    # revision's, so that the reply growing between the preview and the confirmation does not
    # make the preview stale (its end does, once: then it is a message like the others).
    steady: str | None = None

    @property
    def revision(self) -> str:
        """Names this carry-over and its left-out list: a preview is stale once it changes."""
        parts = [
            self.kind,
            self.summary if self.steady is None else self.steady,
            [pin.entry_id for pin in self.pins],
            [entry.id for entry in self.newest],
            self.older,
        ]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    @property
    def left_out_text(self) -> str:
        """The confirmation's "Left out: …" sentence."""
        return left_out_text(len(self.newest), self.older, whole=self.kind != "compact")

    def record(self, conversation_id: int) -> dict[str, Any]:
        """What is stored on the successor (visible from both conversations)."""
        return {
            "kind": self.kind,
            "from_id": conversation_id,
            "edited": self.edited,
            "source": self.source,
            "summary": self.summary,
            "pins": [pin_view(pin) for pin in self.pins],
            "carried": [message_view(entry) for entry in self.carried],
            "left_out": {
                "text": self.left_out_text,
                "newest": [message_view(entry) for entry in self.newest],
                "older": self.older,
                "older_before": self.older_before,
            },
        }

    def preview(self, conversation_id: int) -> dict[str, Any]:
        """The preview the /compact confirmation shows."""
        return {**self.record(conversation_id), "revision": self.revision}


def plan_compact(session: Session, conversation: Conversation) -> Plan:
    """What /compact would carry: reads the last 24 messages, the pins and one count.

    A carry-over still pending in a conversation of no message yet is carried on unchanged:
    the agent knows nothing newer, and the queued messages move on as they are.
    """
    cid = conversation.id or 0
    pins = store.list_pins(session=session, conversation_id=cid)
    if conversation.pending_summary is not None and not conversation.message_count:
        summary = conversation.pending_summary
        return Plan(kind="compact", summary=summary, pins=pins, source="earlier")
    window = store.recent_messages(session=session, conversation_id=cid)
    pinned = {pin.entry_id for pin in pins}
    messages = [SummaryMessage(role_of(m), m.text, m.id in pinned) for m in window]
    summary = build_summary(conversation.title, messages, [pin.text for pin in pins])
    chosen, newest = window[:SUMMARY_MESSAGES], window[SUMMARY_MESSAGES:]
    steady = None
    if any(m.state == "streaming" for m in chosen):
        without = [
            SummaryMessage(role_of(m), "" if m.state == "streaming" else m.text, m.id in pinned)
            for m in window
        ]
        steady = build_summary(conversation.title, without, [pin.text for pin in pins])
    total = store.count_messages(session=session, conversation_id=cid)
    older = left_out(total)[1]
    start = window[0].seq if window else None
    # A pinned message is carried under Pinned:, never left out.
    pinned_older = sum(
        1 for pin in pins if pin.source_id == cid and start is not None and pin.source_seq < start
    )
    return Plan(
        kind="compact",
        summary=summary,
        pins=pins,
        carried=[m for m in chosen if one_line(m.text) and m.id not in pinned],
        newest=[m for m in newest if m.id not in pinned],
        older=max(0, older - pinned_older),
        older_before=start if older else None,
        steady=steady,
    )


def plan_fresh(
    session: Session, conversation: Conversation, carry: str | None, kind: CarryKind
) -> Plan:
    """What /clear (the latest handoff) or a backup's fresh start carries: pins first."""
    cid = conversation.id or 0
    pins = store.list_pins(session=session, conversation_id=cid)
    texts = [pin.text for pin in pins]
    if kind == "clear":
        latest = store.latest_handoff(session=session, cwd=conversation.cwd)
        carry = handoff_carry_over(handoff_text(latest)) if latest is not None else None
    if carry is not None:
        summary: str | None = with_pins(carry, texts)
    elif texts:  # no handoff: the pins alone, as a summary of no message (SPEC §8)
        summary = build_summary(conversation.title, [], texts)
    else:
        summary = None
    total = store.count_messages(session=session, conversation_id=cid)
    own_pins = sum(1 for pin in pins if pin.source_id == cid)
    source = None if carry is None else "handoff" if kind == "clear" else "backup"
    older = max(0, total - own_pins)
    return Plan(kind=kind, summary=summary, pins=pins, older=older, source=source)


def apply_edit(plan: Plan, edited: str | None) -> Plan:
    """Carry the user's edited text instead (cut to 3,500); unchanged text is not an edit."""
    if edited is None:
        return plan
    text = cut_carry(edited)
    if text == plan.summary:
        return plan
    # The text is the user's now: no message is listed as carried (pins stay pinned).
    plan.summary, plan.edited, plan.carried = text, True, []
    return plan
