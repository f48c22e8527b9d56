"""Images attached to a message: the upload, the checks, the message, and what the agent gets."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from app.attachments import (
    MAX_IMAGE_BYTES,
    MAX_UNSENT,
    Image,
    ImageRefused,
    content_blocks,
    media_type_of,
)
from app.db import get_session
from app.models import Attachment
from tests.images import GIF, SVG, encoded, png
from tests.relay import LiveRelay


def upload(relay: LiveRelay, cid: int, content: bytes, kind: str = "image/png") -> httpx.Response:
    return relay.http.post(
        f"/api/conversations/{cid}/attachments", content=content, headers={"Content-Type": kind}
    )


def uploaded(relay: LiveRelay, cid: int, content: bytes, kind: str = "image/png") -> int:
    return relay.attach(cid, content, kind)


def send(relay: LiveRelay, cid: int, text: str, attachments: list[int]) -> httpx.Response:
    body: dict[str, Any] = {"text": text, "attachments": attachments}
    return relay.http.post(f"/api/conversations/{cid}/messages", json=body)


def agent_texts(view: dict[str, Any]) -> list[str]:
    return [e["text"] for e in view["timeline"] if e["kind"] == "agent"]


def refused(content: bytes) -> tuple[int, str]:
    with pytest.raises(ImageRefused) as caught:
        media_type_of(content)
    return caught.value.status, str(caught.value)


def test_the_type_is_read_from_the_image_itself() -> None:
    assert media_type_of(png()) == "image/png"
    assert media_type_of(encoded("JPEG")) == "image/jpeg"
    assert media_type_of(GIF) == "image/gif"
    assert media_type_of(encoded("WEBP")) == "image/webp"
    only_types = (415, "Only PNG, JPEG, GIF or WebP images can be attached.")
    assert refused(SVG) == only_types
    assert refused(encoded("BMP")) == only_types  # an image, not one the API reads
    damaged = (422, "The image cannot be read: it is damaged or cut short.")
    cut = png(64, 64)
    assert refused(cut[: len(cut) - 20]) == damaged
    # Damaged before Pillow can even open them (a review: "Only PNG, JPEG…" for a PNG): a
    # header cut short or wrong, after one of the four's signatures.
    bad_header = cut[:29] + bytes([cut[29] ^ 0xFF]) + cut[30:]  # the IHDR chunk's checksum
    for content in (cut[:40], cut[:8], bad_header, b"\x89PNG\r\n\x1a\nnot a png at all"):
        assert refused(content) == damaged
    for kind in ("GIF", "JPEG", "WEBP"):
        assert refused(encoded(kind)[:20]) == damaged, kind
    too_wide = (422, "The image is over 8000 pixels wide or tall (the Messages API's limit).")
    assert refused(png(8001, 1)) == too_wide
    assert media_type_of(png(8000, 1)) == "image/png"
    assert refused(b"") == (422, "The image is empty.")
    too_big = png() + b"\x00" * MAX_IMAGE_BYTES
    assert refused(too_big) == (413, f"The image is over the limit of {MAX_IMAGE_BYTES} bytes.")


def test_images_go_before_the_text_as_base64() -> None:
    assert content_blocks("hi", []) == "hi"
    blocks = content_blocks("what is this?", [Image("image/gif", GIF)])
    assert blocks == [
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": "image/gif",
                "data": base64.b64encode(GIF).decode(),
            },
        },
        {"type": "text", "text": "what is this?"},
    ]


def test_an_image_is_uploaded_sent_with_a_message_and_served(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    image = png()
    response = upload(relay, cid, image)
    assert response.status_code == 201, response.text
    stored = response.json()
    assert stored == {"id": stored["id"], "media_type": "image/png", "size": len(image)}
    # The type comes from the bytes: a GIF declared as PNG is a GIF.
    gif = uploaded(relay, cid, GIF, "image/png")
    sent = send(relay, cid, "what do you see?", [stored["id"], gif])
    assert sent.status_code == 202, sent.text
    described = [
        {"id": stored["id"], "media_type": "image/png", "size": len(image)},
        {"id": gif, "media_type": "image/gif", "size": len(GIF)},
    ]
    assert sent.json()["data"]["attachments"] == described
    view = relay.wait_idle(cid)
    (message,) = [e for e in view["timeline"] if e["kind"] == "user"]
    assert message["data"]["attachments"] == described
    # The agent got both, in order (the demo agent says what it was sent).
    assert "With 2 images (image/png, image/gif)." in agent_texts(view)[0]
    served = relay.http.get(f"/api/attachments/{stored['id']}")
    assert served.status_code == 200
    assert served.content == image
    assert served.headers["content-type"] == "image/png"
    assert served.headers["x-content-type-options"] == "nosniff"
    assert served.headers["cache-control"] == "no-store"  # off a shared computer's disk
    # Its own policy beside the relay's: a browser holds both (the stricter wins).
    policies = served.headers.get_list("content-security-policy")
    assert "default-src 'none'; sandbox" in policies
    assert any("frame-ancestors 'none'" in policy for policy in policies)
    # Sent once: the same image cannot go with another message.
    again = send(relay, cid, "and again", [stored["id"]])
    assert again.status_code == 409
    assert "no longer there" in again.json()["detail"]
    assert relay.http.get("/api/attachments/999999").status_code == 404


def test_what_is_not_an_image_is_refused_and_nothing_is_stored(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    svg = upload(relay, cid, SVG, "image/svg+xml")
    assert svg.status_code == 415
    assert svg.json()["detail"] == "Only PNG, JPEG, GIF or WebP images can be attached."
    # Not an image type: refused at the door, saying what the route takes (a review: "The API
    # accepts application/json only", and JSON was taken).
    for kind in ("text/plain", "application/json"):
        wrong = upload(relay, cid, png(), kind)
        assert (wrong.status_code, wrong.json()) == (
            415,
            {"detail": "An image is uploaded as image/… or application/octet-stream."},
        ), kind
    # A type a browser sends for a file it does not know: taken, the bytes decide.
    assert upload(relay, cid, GIF, "application/octet-stream").json()["media_type"] == "image/gif"
    big = upload(relay, cid, png() + b"\x00" * MAX_IMAGE_BYTES)
    assert big.status_code == 413
    assert big.json()["detail"] == f"Request body over the limit of {MAX_IMAGE_BYTES} bytes."
    assert upload(relay, cid, b"").status_code == 422
    assert upload(relay, 999999, png()).status_code == 404
    # Another conversation's image, or one that never was, is not sent; the message neither.
    other = relay.create()["id"]
    theirs = uploaded(relay, other, png())
    refused = send(relay, cid, "look", [theirs])
    assert refused.status_code == 409
    assert send(relay, cid, "look", [theirs, theirs]).status_code == 409
    assert send(relay, cid, "look", list(range(1, 7))).status_code == 422  # over 5
    mine = uploaded(relay, cid, png())
    for loose in (True, str(mine), float(mine)):  # (an API review: true was image 1)
        assert send(relay, cid, "look", [loose]).status_code == 422, loose  # type: ignore[list-item]
    assert [e for e in relay.get(cid)["timeline"] if e["kind"] == "user"] == []


def test_unsent_images_are_capped_and_can_be_removed(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    ids = [uploaded(relay, cid, png()) for _ in range(MAX_UNSENT)]
    full = upload(relay, cid, png())
    assert full.status_code == 409
    assert "send them or remove some first" in full.json()["detail"]
    removed = relay.http.delete(f"/api/conversations/{cid}/attachments/{ids[0]}")
    assert removed.status_code == 204
    assert relay.http.get(f"/api/attachments/{ids[0]}").status_code == 404
    assert relay.http.delete(f"/api/conversations/{cid}/attachments/{ids[0]}").status_code == 404
    uploaded(relay, cid, png())  # room again
    assert send(relay, cid, "these", ids[1:3]).status_code == 202
    relay.wait_idle(cid)
    # A sent image is the message's: it cannot be removed.
    assert relay.http.delete(f"/api/conversations/{cid}/attachments/{ids[1]}").status_code == 404


def test_compact_with_an_image_is_text_for_the_agent(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    sent = send(relay, cid, "/compact", [uploaded(relay, cid, png())])
    assert sent.status_code == 202, sent.text  # not 201 with a successor
    view = relay.wait_idle(cid)
    assert view["status"] == "active"
    assert "You said: “/compact”" in agent_texts(view)[0]


def test_a_message_taken_back_gives_its_images_back(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    assert relay.send(cid, "slow").status_code == 202  # a long turn: the next one waits
    image = uploaded(relay, cid, png())
    queued = send(relay, cid, "then this", [image]).json()
    assert queued["state"] == "queued"
    back = relay.http.delete(f"/api/conversations/{cid}/messages/{queued['id']}")
    assert back.status_code == 200, back.text
    assert back.json()["data"]["attachments"][0]["id"] == image  # for the composer
    assert send(relay, cid, "now with it", [image]).status_code == 202  # unsent again
    view = relay.wait_idle(cid, timeout=60)
    assert "With 1 image (image/png)." in agent_texts(view)[-1]


def test_a_deleted_conversation_takes_its_images(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    sent, unsent = uploaded(relay, cid, png()), uploaded(relay, cid, GIF)
    assert send(relay, cid, "keep", [sent]).status_code == 202
    relay.wait_idle(cid)
    assert relay.http.delete(f"/api/conversations/{cid}").status_code == 204
    for image in (sent, unsent):
        assert relay.http.get(f"/api/attachments/{image}").status_code == 404


def test_an_export_says_which_images_a_message_had(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    ids = [uploaded(relay, cid, png()), uploaded(relay, cid, GIF)]
    assert send(relay, cid, "two pictures", ids).status_code == 202
    relay.wait_idle(cid)
    exported = relay.http.get(f"/api/conversations/{cid}/export", params={"format": "md"}).text
    assert "## You\n\ntwo pictures\n\n*With 2 images: image/png, image/gif.*\n" in exported


def test_deepseek_is_never_sent_an_image(relay: LiveRelay, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSeek's API takes no images: the relay refuses them before storing anything."""
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-key")
    cid = relay.create(provider="deepseek")["id"]
    title = relay.get(cid)["title"]
    refused = upload(relay, cid, png())
    assert refused.status_code == 409
    assert refused.json()["detail"] == "DeepSeek does not take images: send the text alone."
    other = relay.create()["id"]
    sent = send(relay, cid, "look", [uploaded(relay, other, png())])
    assert sent.status_code == 409
    assert sent.json()["detail"] == "DeepSeek does not take images: send the text alone."
    view = relay.get(cid)
    assert (view["title"], view["timeline"]) == (title, [])


def test_a_refused_message_changes_nothing_not_even_the_title(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    title = relay.get(cid)["title"]
    gone = send(relay, cid, "A secret plan for the refused message", [123456])
    assert gone.status_code == 409
    twice = uploaded(relay, cid, png())
    assert send(relay, cid, "Twice", [twice, twice]).json()["detail"] == (
        "The same image is attached twice."
    )
    huge = send(relay, cid, "hi", [2**63])  # past any id: refused, not a 500
    assert huge.status_code == 422
    view = relay.get(cid)
    assert (view["title"], view["timeline"]) == (title, [])


def test_images_move_with_the_queue_into_a_compacted_conversation(relay: LiveRelay) -> None:
    old = relay.create()["id"]
    assert relay.send(old, "slow").status_code == 202  # running: the next message waits
    queued_image, waiting = uploaded(relay, old, png()), uploaded(relay, old, GIF)
    queued = send(relay, old, "what is in this image?", [queued_image]).json()
    compacted = relay.http.post(f"/api/conversations/{old}/messages", json={"text": "/compact"})
    assert compacted.status_code == 201, compacted.text
    new = compacted.json()["compacted_into"]["id"]
    # The image left unsent waits in the new conversation's composer.
    listed = relay.http.get(f"/api/conversations/{new}/attachments").json()["attachments"]
    assert [image["id"] for image in listed] == [waiting]
    relay.wait_idle(old, timeout=60)
    # The old conversation deleted: the moved message's image is the new one's, it stays. (Its
    # agent is retired after its turn, archived: the delete waits for that.)
    deleted = relay.http.delete(f"/api/conversations/{old}")
    assert deleted.status_code == 204, deleted.text
    assert relay.http.get(f"/api/attachments/{queued_image}").status_code == 200
    view = relay.wait_idle(new, timeout=60)
    assert [e["id"] for e in view["timeline"] if e["kind"] == "user"] == [queued["id"]]
    assert "With 1 image (image/png)." in agent_texts(view)[-1]


def test_a_moved_message_taken_back_can_be_sent_again(relay: LiveRelay) -> None:
    old = relay.create()["id"]
    assert relay.send(old, "slow").status_code == 202
    assert relay.send(old, "slow too").status_code == 202  # moved too: it runs there first
    image = uploaded(relay, old, png())
    queued = send(relay, old, "this one", [image]).json()
    compacted = relay.http.post(f"/api/conversations/{old}/messages", json={"text": "/compact"})
    new = compacted.json()["compacted_into"]["id"]
    back = relay.http.delete(f"/api/conversations/{new}/messages/{queued['id']}")
    assert back.status_code == 200, back.text
    listed = relay.http.get(f"/api/conversations/{new}/attachments").json()["attachments"]
    assert [i["id"] for i in listed] == [image]
    assert send(relay, new, "this one", [image]).status_code == 202


def test_a_resent_message_goes_with_its_images_and_edit_gives_them_back(
    relay: LiveRelay,
) -> None:
    cid = relay.create()["id"]
    image = uploaded(relay, cid, png())
    first = send(relay, cid, "look again", [image]).json()
    relay.wait_idle(cid)
    relay.mark_cut(first["id"])
    assert relay.send(cid, "slow").status_code == 202  # the resend waits behind it
    resent = relay.http.post(f"/api/conversations/{cid}/messages/{first['id']}/resend")
    assert resent.status_code == 202, resent.text
    assert resent.json()["data"]["attachments"] == first["data"]["attachments"]
    back = relay.http.delete(f"/api/conversations/{cid}/messages/{resent.json()['id']}")
    assert back.status_code == 200, back.text
    assert send(relay, cid, "look again", [image]).status_code == 202  # unsent again
    view = relay.wait_idle(cid, timeout=60)
    assert "With 1 image (image/png)." in agent_texts(view)[-1]


def test_an_image_is_claimed_by_one_message_only() -> None:
    """Two nodes may check the same image at once; the second claim finds it taken."""
    from sqlmodel import Session, SQLModel, create_engine

    from app import attachment_store
    from app.attachment_store import AttachmentError
    from app.models import Conversation

    engine = create_engine("sqlite://")
    SQLModel.metadata.create_all(engine)
    with Session(engine) as session:
        conversation = Conversation(title="t", provider="demo", cwd="/", permission_mode="default")
        session.add(conversation)
        session.commit()
        cid = conversation.id or 0
        stored = attachment_store.add_attachment(
            session=session, conversation_id=cid, media_type="image/png", content=png()
        )
        ids = [stored.id or 0]
        attachment_store.claim(session.connection(), cid, ids, 7)
        with pytest.raises(AttachmentError):
            attachment_store.claim(session.connection(), cid, ids, 8)


def test_a_message_whose_image_is_gone_says_so(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    assert relay.send(cid, "slow").status_code == 202
    image = uploaded(relay, cid, png())
    assert send(relay, cid, "and this", [image]).status_code == 202
    with get_session(relay.app.state.engine) as session:  # gone behind the relay's back
        session.delete(session.get(Attachment, image))
        session.commit()
    view = relay.wait_idle(cid, timeout=60)
    lines = [e["text"] for e in view["timeline"] if e["kind"] == "line"]
    assert "1 image(s) of this message no longer exist; it was sent without them." in lines
    assert "With 1 image" not in agent_texts(view)[-1]


def test_an_archived_conversation_takes_no_image(relay: LiveRelay) -> None:
    old = relay.create()["id"]
    compacted = relay.http.post(f"/api/conversations/{old}/messages", json={"text": "/compact"})
    assert compacted.status_code == 201, compacted.text
    refused = upload(relay, old, png())
    assert refused.status_code == 409
    assert refused.json()["detail"] == "This conversation is archived; it can be read, not written."
