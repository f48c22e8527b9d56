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
    content_blocks,
    sniff,
    upload_problem,
)
from tests.images import GIF, SVG, png
from tests.relay import LiveRelay


def upload(relay: LiveRelay, cid: int, content: bytes, kind: str = "image/png") -> httpx.Response:
    return relay.http.post(
        f"/api/conversations/{cid}/attachments", content=content, headers={"Content-Type": kind}
    )


def uploaded(relay: LiveRelay, cid: int, content: bytes, kind: str = "image/png") -> int:
    response = upload(relay, cid, content, kind)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def send(relay: LiveRelay, cid: int, text: str, attachments: list[int]) -> httpx.Response:
    body: dict[str, Any] = {"text": text, "attachments": attachments}
    return relay.http.post(f"/api/conversations/{cid}/messages", json=body)


def agent_texts(view: dict[str, Any]) -> list[str]:
    return [e["text"] for e in view["timeline"] if e["kind"] == "agent"]


def test_the_type_is_read_from_the_bytes() -> None:
    assert sniff(png()) == "image/png"
    assert sniff(b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert sniff(GIF) == "image/gif"
    assert sniff(b"RIFF\x10\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert sniff(SVG) is None
    assert sniff(b"RIFF\x10\x00\x00\x00WAVE") is None  # a RIFF that is not WebP
    assert upload_problem(b"") == (422, "The image is empty.")
    assert upload_problem(SVG) == (415, "Only PNG, JPEG, GIF or WebP images can be attached.")
    too_big = png() + b"\x00" * MAX_IMAGE_BYTES
    assert upload_problem(too_big) == (
        413,
        f"The image is over the limit of {MAX_IMAGE_BYTES} bytes.",
    )
    assert upload_problem(png()) is None


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
    assert served.headers["content-security-policy"] == "default-src 'none'; sandbox"
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
    text = upload(relay, cid, png(), "text/plain")  # not an image type: refused at the door
    assert text.status_code == 415
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
    refused = upload(relay, cid, png())
    assert refused.status_code == 409
    assert refused.json()["detail"] == "DeepSeek does not take images: send the text alone."
    other = relay.create()["id"]
    sent = send(relay, cid, "look", [uploaded(relay, other, png())])
    assert sent.status_code == 409
    assert sent.json()["detail"] == "DeepSeek does not take images: send the text alone."
    assert relay.get(cid)["timeline"] == []
