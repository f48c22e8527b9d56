"""Steering a compaction through the HTTP API with the demo agent (SPEC §8)."""

from __future__ import annotations

import time
from pathlib import Path

from sqlmodel import Session

from app import store
from app.db import make_engine
from app.migrate import upgrade
from app.summary import HEADER, NEW_REQUEST
from tests.relay import LiveRelay, make_settings


def talk(relay: LiveRelay, cid: int, *texts: str) -> dict:
    """Send each text as its own turn (queued ones each get theirs) and wait until idle."""
    for text in texts:
        assert relay.send(cid, text).status_code == 202
    return relay.wait_idle(cid)


def messages(view: dict) -> list[dict]:
    return [e for e in view["timeline"] if e["kind"] in ("user", "agent")]


def preview(relay: LiveRelay, cid: int) -> dict:
    response = relay.http.get(f"/api/conversations/{cid}/compact")
    assert response.status_code == 200, response.text
    return response.json()


def compact(relay: LiveRelay, cid: int, **body: object) -> dict:
    response = relay.http.post(f"/api/conversations/{cid}/compact", json=body)
    assert response.status_code == 201, response.text
    return response.json()["compacted_into"]


def pin(relay: LiveRelay, cid: int, entry_id: int) -> list[dict]:
    response = relay.http.put(f"/api/conversations/{cid}/pins/{entry_id}")
    assert response.status_code == 200, response.text
    return response.json()["pins"]


def test_preview_is_what_compact_carries_byte_for_byte(relay: LiveRelay) -> None:
    cid = relay.create(title="Fix login")["id"]
    talk(relay, cid, "why does login fail?", "fix it")
    shown = preview(relay, cid)
    assert shown["summary"].startswith("Conversation: Fix login\nUser: why does login fail?\n")
    assert shown["left_out"]["text"] == "Nothing is left out."
    assert [m["role"] for m in shown["carried"]] == ["user", "agent", "user", "agent"]
    # The message command (no preview) and the confirmed preview carry the same bytes.
    new = relay.send(cid, "/compact").json()["compacted_into"]
    assert new["pending_summary"] == shown["summary"]
    record = relay.http.get(f"/api/conversations/{new['id']}/carry").json()["from"]
    assert (record["kind"], record["edited"], record["summary"]) == (
        "compact",
        False,
        shown["summary"],
    )


def test_preview_counts_what_is_left_out(relay: LiveRelay) -> None:
    cid = relay.create(title="Long")["id"]
    view = talk(relay, cid, *(f"message {i}" for i in range(1, 14)))  # 26 messages
    shown = preview(relay, cid)
    assert shown["left_out"]["text"] == "Left out: the 8 newest messages and 2 older ones."
    sent = messages(view)
    assert [m["entry_id"] for m in shown["left_out"]["newest"]] == [m["id"] for m in sent[-8:]]
    assert shown["left_out"]["older"] == 2
    # The folded list of older ones: the messages before the window, one line each.
    before = shown["left_out"]["older_before"]
    page = relay.http.get(f"/api/conversations/{cid}/message-lines?before={before}").json()
    assert [m["entry_id"] for m in page["messages"]] == [m["id"] for m in sent[:2]]
    assert page["messages"][0]["line"] == "message 1"
    # A pinned older message is carried, not left out.
    pin(relay, cid, sent[0]["id"])
    shown = preview(relay, cid)
    assert shown["left_out"]["text"] == "Left out: the 8 newest messages and 1 older one."
    assert shown["summary"].split("\n")[1:3] == ["Pinned:", "- message 1"]


def test_counts_of_a_300_message_conversation(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    upgrade(settings.db_url)
    engine = make_engine(settings.db_url)
    with Session(engine, expire_on_commit=False) as session:
        conversation = store.create_conversation(
            session=session,
            title="Big",
            provider="demo",
            cwd=str(tmp_path),
            permission_mode="default",
        )
        for seq in range(1, 301):
            kind = "user" if seq % 2 else "agent"
            store.add_entry(
                session=session, conversation=conversation, seq=seq, kind=kind, text=f"m{seq}"
            )
        store.add_entry(session=session, conversation=conversation, seq=301, kind="activity")
    engine.dispose()
    live = LiveRelay(settings).start()
    try:
        shown = preview(live, conversation.id or 0)
        assert shown["left_out"]["text"] == "Left out: the 8 newest messages and 276 older ones."
        assert shown["summary"].split("\n")[1] == "User: m277"
    finally:
        live.stop()


def test_an_edited_carry_over_is_cut_marked_and_sent(relay: LiveRelay) -> None:
    cid = relay.create(title="Edit me")["id"]
    talk(relay, cid, "hello")
    shown = preview(relay, cid)
    edited = "Keep: the login fix.\n" + "x" * 3_600
    new = compact(relay, cid, revision=shown["revision"], carry_over=edited)
    assert new["pending_summary"] == edited[:3_500]
    record = relay.http.get(f"/api/conversations/{new['id']}/carry").json()
    assert record["from"]["edited"] is True
    assert record["from"]["summary"] == edited[:3_500]
    # The old conversation shows the same record (what its compaction carried).
    assert relay.http.get(f"/api/conversations/{cid}/carry").json()["into"] == record["from"]
    view = talk(relay, new["id"], "go on")
    agent = messages(view)[-1]["text"]
    # The demo quotes its prompt: header, the edited text, then the request.
    assert f"{HEADER} Keep: the login fix. xxx" in agent
    assert messages(view)[0]["text"] == "go on"
    assert NEW_REQUEST not in messages(view)[0]["text"]


def test_an_unchanged_carry_over_is_not_an_edit(relay: LiveRelay) -> None:
    cid = relay.create(title="Same")["id"]
    talk(relay, cid, "hello")
    shown = preview(relay, cid)
    new = compact(relay, cid, revision=shown["revision"], carry_over=shown["summary"])
    assert new["pending_summary"] == shown["summary"]
    record = relay.http.get(f"/api/conversations/{new['id']}/carry").json()["from"]
    assert record["edited"] is False


def test_a_stale_preview_is_refused_and_nothing_changes(relay: LiveRelay) -> None:
    cid = relay.create(title="Stale")["id"]
    talk(relay, cid, "one")
    shown = preview(relay, cid)
    talk(relay, cid, "two")  # the carry-over the preview showed is no longer the one
    response = relay.http.post(
        f"/api/conversations/{cid}/compact", json={"revision": shown["revision"]}
    )
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "The conversation changed since this preview; check the new one and confirm again."
    )
    assert relay.get(cid)["status"] == "active"
    fresh = preview(relay, cid)
    assert fresh["revision"] != shown["revision"]
    compact(relay, cid, revision=fresh["revision"])


def test_compacting_an_archived_conversation_says_where_it_went(relay: LiveRelay) -> None:
    cid = relay.create(title="Twice")["id"]
    shown = preview(relay, cid)
    new = compact(relay, cid, revision=shown["revision"])  # the first tab confirms
    for response in (  # the second tab confirms its preview, or asks for a new one
        relay.http.post(f"/api/conversations/{cid}/compact", json={"revision": shown["revision"]}),
        relay.http.get(f"/api/conversations/{cid}/compact"),
    ):
        assert response.status_code == 409
        assert response.json()["detail"] == (
            "This conversation is archived; it cannot be compacted again."
            f" It continues in conversation {new['id']}."
        )
    archived = relay.http.get("/api/conversations?status=archived").json()["conversations"]
    assert [c["id"] for c in archived] == [cid]
    active = relay.http.get("/api/conversations").json()["conversations"]
    assert [c["id"] for c in active] == [new["id"]]


def test_bad_carry_overs_are_refused_and_store_nothing(relay: LiveRelay) -> None:
    cid = relay.create(title="Bad")["id"]
    base = f"/api/conversations/{cid}/compact"
    for body in (  # raw JSON: a lone surrogate cannot be encoded by the client's json
        '{"carry_over": " \\n\\u200b "}',
        '{"carry_over": "a\\u0000b"}',
        '{"carry_over": "\\ud800"}',
        '{"carry_over": 5}',
        '{"other": 1}',
    ):
        headers = {"content-type": "application/json"}
        response = relay.http.post(base, content=body, headers=headers)
        assert response.status_code == 422, (body, response.text)
    assert relay.get(cid)["status"] == "active"
    assert relay.http.get(f"/api/conversations/{cid}/carry").json() == {"from": None, "into": None}


def test_pins_head_the_carry_over_and_survive_two_compactions(relay: LiveRelay) -> None:
    cid = relay.create(title="Pins")["id"]
    view = talk(relay, cid, "Use bcrypt, not md5", "ok")
    first = messages(view)[0]
    agent = messages(view)[1]
    pins = pin(relay, cid, first["id"])
    assert pins == pin(relay, cid, first["id"])  # pinning twice keeps one pin
    pin(relay, cid, agent["id"])
    new = relay.send(cid, "/compact").json()["compacted_into"]
    lines = new["pending_summary"].split("\n")
    assert lines[:4] == [
        "Conversation: Pins",
        "Pinned:",
        "- Use bcrypt, not md5",
        "- " + " ".join(agent["text"].split()),
    ]
    assert "User: Use bcrypt, not md5" not in lines  # shown once, under Pinned:
    assert lines[4] == "User: ok"
    carried = relay.http.get(f"/api/conversations/{new['id']}/pins").json()["pins"]
    assert [p["entry_id"] for p in carried] == [first["id"], agent["id"]]
    # In the new conversation a carried pin can be unpinned; the old one keeps its pins.
    response = relay.http.delete(f"/api/conversations/{new['id']}/pins/{agent['id']}")
    assert [p["entry_id"] for p in response.json()["pins"]] == [first["id"]]
    assert len(relay.http.get(f"/api/conversations/{cid}/pins").json()["pins"]) == 2
    talk(relay, new["id"], "next step")
    newer = relay.send(new["id"], "/compact").json()["compacted_into"]
    assert newer["pending_summary"].split("\n")[1:4] == [
        "Pinned:",
        "- Use bcrypt, not md5",
        "User: next step",
    ]
    kept = relay.http.get(f"/api/conversations/{newer['id']}/pins").json()["pins"]
    assert [(p["entry_id"], p["conversation_id"]) for p in kept] == [(first["id"], cid)]


def test_clear_carries_the_pins_with_or_without_a_handoff(relay: LiveRelay) -> None:
    cid = relay.create(title="Clear")["id"]
    view = talk(relay, cid, "keep this")
    pin(relay, cid, messages(view)[0]["id"])
    new = relay.send(cid, "/clear").json()["compacted_into"]
    assert new["pending_summary"] == "Conversation: Clear\nPinned:\n- keep this"
    record = relay.http.get(f"/api/conversations/{new['id']}/carry").json()["from"]
    assert (record["kind"], record["left_out"]["text"]) == ("clear", "Left out: 1 message.")
    assert record["source"] is None  # the pins alone: no handoff was saved
    talk(relay, new["id"], "please save a handoff")
    newer = relay.send(new["id"], "/clear").json()["compacted_into"]
    # A review: its record said "Carried here: 1 pinned", not the handoff it carries.
    assert relay.http.get(f"/api/conversations/{newer['id']}/carry").json()["from"]["source"] == (
        "handoff"
    )
    assert newer["pending_summary"].split("\n")[:3] == [
        "[Handoff from the previous session]",
        "Pinned:",
        "- keep this",
    ]
    assert newer["pending_summary"].split("\n")[3].startswith("Done: ")


def test_start_fresh_from_a_backup_carries_the_pins(relay: LiveRelay) -> None:
    cid = relay.create(title="Fresh")["id"]
    view = talk(relay, cid, "keep this")
    pin(relay, cid, messages(view)[0]["id"])
    name = "1-backup-1st-Jan-2026-1-00am.md"
    folder = relay.supervisor.backups.files.folder(cid)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("# Session Backup\n\nbody\n", encoding="utf-8")
    response = relay.http.post(f"/api/conversations/{cid}/backups/{name}/fresh")
    assert response.status_code == 201, response.text
    new = response.json()["compacted_into"]
    assert new["pending_summary"] == (
        f"[Carry-over context from backup {name}]\nPinned:\n- keep this\n# Session Backup\n\nbody"
    )
    assert relay.http.get(f"/api/conversations/{new['id']}/carry").json()["from"]["source"] == (
        "backup"
    )
    # /compact again before any message carries that carry-over on: its record says so.
    again = relay.send(new["id"], "/compact").json()["compacted_into"]
    record = relay.http.get(f"/api/conversations/{again['id']}/carry").json()["from"]
    assert (record["source"], record["left_out"]["text"]) == ("earlier", "Nothing is left out.")


def test_pin_errors_store_nothing(relay: LiveRelay) -> None:
    cid = relay.create(title="A")["id"]
    other = relay.create(title="B")["id"]
    view = talk(relay, cid, "use a tool")
    tool_only = next(e for e in view["timeline"] if e["kind"] == "activity")
    base = f"/api/conversations/{cid}/pins"
    assert (
        relay.http.put(f"/api/conversations/{other}/pins/{messages(view)[0]['id']}").status_code
        == 404
    )
    assert relay.http.put(f"{base}/{tool_only['id']}").status_code == 404
    assert relay.http.put(f"{base}/999999").status_code == 404
    assert relay.http.delete(f"{base}/{messages(view)[0]['id']}").status_code == 404
    assert relay.http.get(base).json() == {"pins": []}
    entry = messages(view)[0]["id"]
    relay.send(cid, "/compact")
    response = relay.http.put(f"{base}/{entry}")
    assert response.status_code == 409
    assert response.json()["detail"] == "This conversation is archived; its pins cannot change."


def test_a_conversation_with_pins_can_be_deleted(relay: LiveRelay) -> None:
    cid = relay.create(title="Gone")["id"]
    view = talk(relay, cid, "keep this")
    pin(relay, cid, messages(view)[0]["id"])
    new = relay.send(cid, "/compact").json()["compacted_into"]
    assert relay.http.delete(f"/api/conversations/{cid}").status_code == 204
    # The pin carried into the successor holds its own copy of the text.
    kept = relay.http.get(f"/api/conversations/{new['id']}/pins").json()["pins"]
    assert kept[0]["text"] == "keep this"
    assert new["pending_summary"].split("\n")[2] == "- keep this"


def test_fifty_pins_at_most_and_pinning_one_again_is_not_the_fifty_first(
    relay: LiveRelay,
) -> None:
    cid = relay.create(title="Many pins")["id"]
    view = talk(relay, cid, *(f"message {n}" for n in range(26)))
    ids = [entry["id"] for entry in messages(view)]
    for entry_id in ids[: store.MAX_PINS]:
        pin(relay, cid, entry_id)
    base = f"/api/conversations/{cid}/pins"
    one_more = relay.http.put(f"{base}/{ids[store.MAX_PINS]}")
    assert (one_more.status_code, one_more.json()) == (
        409,
        {"detail": "At most 50 messages can be pinned."},
    )
    # Before: 409 too (found by a hostile review); the API says pinning twice keeps one pin.
    assert len(pin(relay, cid, ids[0])) == store.MAX_PINS


def test_a_reply_growing_after_the_preview_does_not_make_it_stale(tmp_path: Path) -> None:
    # Found by a hostile review: confirming /compact while a reply streamed was refused again
    # and again ("The conversation changed since this preview"): the reply's text, stored as
    # it grows, changed the carry-over between each preview and its confirmation.
    with LiveRelay(make_settings(tmp_path / "data", demo_delay=0.15)) as relay:
        cid = relay.create(title="Compacted mid-reply")["id"]
        talk(relay, cid, "one")
        assert relay.send(cid, "slow story please").status_code == 202
        relay.wait_for(cid, lambda view: view["turn"]["state"] != "idle")
        shown = preview(relay, cid)
        deadline = time.monotonic() + 30
        while len(preview(relay, cid)["summary"]) == len(shown["summary"]):
            assert time.monotonic() < deadline, "the reply's stored text never grew"
            time.sleep(0.1)
        assert relay.get(cid)["turn"]["state"] != "idle"  # still streaming
        new = compact(relay, cid, revision=shown["revision"])  # before: 409
        assert new["title"] == "Compacted mid-reply (compacted)"
        # The reply is carried as stored at the confirmation, not as the preview showed it.
        assert len(new["pending_summary"]) > len(shown["summary"])
