"""Images attached to a message: which ones the relay takes, and how an agent is sent them.

Pure functions; storing them is app/store.py's, their routes app/routes/attachments.py's.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# The Messages API refuses an image whose base64 text is over 5 MiB: 3.75 MiB of bytes.
MAX_IMAGE_BYTES = 5 * 1024 * 1024 * 3 // 4
MAX_PER_MESSAGE = 5  # 5 images at their largest stay under the API's 32 MB request
MAX_UNSENT = 10  # uploaded to a conversation and not sent yet (each can be removed)
UPLOAD_PATH = re.compile(r"/api/conversations/[0-9]+/attachments")
# The raster types the Messages API reads. Never SVG: it is a document that can run script.
MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
TYPES_TEXT = "PNG, JPEG, GIF or WebP"


def body_limit(path: str, default: int) -> int:
    """The largest request body for path: an image's on the upload route, else default."""
    return MAX_IMAGE_BYTES if UPLOAD_PATH.fullmatch(path) else default


def is_image_upload(path: str, content_type: str) -> bool:
    """An image's bytes sent to the upload route (a type a page cannot send cross-origin
    without a preflight, which the relay never grants: safe from forged requests)."""
    kind = content_type.split(";")[0].strip().lower()
    return UPLOAD_PATH.fullmatch(path) is not None and (
        kind.startswith("image/") or kind == "application/octet-stream"
    )


@dataclass(frozen=True)
class Image:
    """An attached image as an agent is sent it."""

    media_type: str
    content: bytes


def sniff(content: bytes) -> str | None:
    """The image type the bytes are (their signature), or None: the declared type is not trusted."""
    if content.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if content.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if content.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(content) >= 12 and content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return "image/webp"
    return None


def upload_problem(content: bytes) -> tuple[int, str] | None:
    """Why an upload is refused (status, message), or None."""
    if not content:
        return 422, "The image is empty."
    if len(content) > MAX_IMAGE_BYTES:
        return 413, f"The image is over the limit of {MAX_IMAGE_BYTES} bytes."
    if sniff(content) is None:
        return 415, f"Only {TYPES_TEXT} images can be attached."
    return None


def content_blocks(text: str, images: Sequence[Image]) -> str | list[dict[str, Any]]:
    """A user message's content: the text alone, or the images (first, as the API advises)
    and then the text."""
    if not images:
        return text
    blocks: list[dict[str, Any]] = [
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": image.media_type,
                "data": base64.b64encode(image.content).decode("ascii"),
            },
        }
        for image in images
    ]
    blocks.append({"type": "text", "text": text})
    return blocks
