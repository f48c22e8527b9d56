"""Images attached to a message: which ones the relay takes, and how an agent is sent them.

Pure functions; storing them is app/store.py's, their routes app/routes/attachments.py's.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# The Messages API refuses an image whose base64 text is over 5 MiB: 3.75 MiB of bytes.
MAX_IMAGE_BYTES = 5 * 1024 * 1024 * 3 // 4
MAX_PER_MESSAGE = 5  # images one message takes
MAX_UNSENT = 10  # uploaded to a conversation and not sent yet (each can be removed)
UPLOAD_PATH = re.compile(r"/api/conversations/[0-9]+/attachments")
# The raster types the Messages API reads. Never SVG: it is a document that can run script.
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}
TYPES_TEXT = "PNG, JPEG, GIF or WebP"
# How each of the four begins: one Pillow cannot even open (its header cut or damaged) is a
# damaged image of that type, not another type.
SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")
MAX_SIDE = 8000  # pixels: the Messages API refuses an image wider or taller
TOO_WIDE = f"The image is over {MAX_SIDE} pixels wide or tall (the Messages API's limit)."


def body_limit(method: str, path: str, default: int) -> int:
    """The largest request body: an image's for a POST to the upload route, else default."""
    return MAX_IMAGE_BYTES if method == "POST" and UPLOAD_PATH.fullmatch(path) else default


def is_upload(path: str) -> bool:
    """The route images are uploaded to (its body an image's bytes, not JSON)."""
    return UPLOAD_PATH.fullmatch(path) is not None


def is_image_type(content_type: str) -> bool:
    """A Content-Type an image's bytes may come with (one a page cannot send cross-origin
    without a preflight, which the relay never grants: safe from forged requests)."""
    kind = content_type.split(";")[0].strip().lower()
    return kind.startswith("image/") or kind == "application/octet-stream"


@dataclass(frozen=True)
class Image:
    """An attached image as an agent is sent it."""

    media_type: str
    content: bytes


class ImageRefused(Exception):
    """An upload that is not an image the relay takes: status and message for the answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def media_type_of(content: bytes) -> str:
    """The image's type, read by Pillow from its bytes (the declared type is not trusted);
    ImageRefused when it is empty, too big, not one of the four types, or cannot be read."""
    if not content:
        raise ImageRefused(422, "The image is empty.")
    if len(content) > MAX_IMAGE_BYTES:
        raise ImageRefused(413, f"The image is over the limit of {MAX_IMAGE_BYTES} bytes.")
    import PIL.Image  # (here: the relay starts without it, most never see an upload)

    kind: str | None = None
    try:
        with PIL.Image.open(io.BytesIO(content)) as image:
            kind, size = FORMATS.get(image.format or ""), image.size
            if kind is None:
                raise ImageRefused(415, f"Only {TYPES_TEXT} images can be attached.")
            image.verify()  # (a PNG's every chunk and checksum: a cut one fails)
    except PIL.Image.DecompressionBombError:
        raise ImageRefused(422, TOO_WIDE) from None
    except (PIL.UnidentifiedImageError, OSError, SyntaxError, ValueError):
        if kind is None and not content.startswith(SIGNATURES) and not _is_webp(content):
            # not an image Pillow knows (SVG, text, anything else)
            raise ImageRefused(415, f"Only {TYPES_TEXT} images can be attached.") from None
        raise ImageRefused(422, "The image cannot be read: it is damaged or cut short.") from None
    if max(size) > MAX_SIDE or min(size) < 1:
        raise ImageRefused(422, TOO_WIDE)
    return kind


def _is_webp(content: bytes) -> bool:
    return content[:4] == b"RIFF" and content[8:12] == b"WEBP"


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
