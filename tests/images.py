"""Small real images for the attachment tests (valid files, not only their signatures)."""

from __future__ import annotations

import io
import struct
import zlib

import PIL.Image


def png(width: int = 2, height: int = 2, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A valid PNG of one colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


# A 1×1 GIF (the smallest valid one: a white pixel).
GIF = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00"
    b"!\xf9\x04\x01\x00\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
)
SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'


def encoded(fmt: str, size: tuple[int, int] = (4, 3)) -> bytes:
    """An image of that size in a format Pillow writes (JPEG, WEBP, BMP...)."""
    out = io.BytesIO()
    PIL.Image.new("RGB", size, (10, 120, 60)).save(out, format=fmt)
    return out.getvalue()
