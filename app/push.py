"""Web Push (RFC 8030/8291/8292): the VAPID key, which endpoints may be used, sending one push.

The only module that encrypts or sends a push. Encryption is http-ece's (RFC 8188 aes128gcm),
the VAPID signature py-vapid's: the two libraries pywebpush is built on. The POST itself goes
through httpx, so that redirects are never followed and nothing of the answer but its status
is read (see endpoint_problem for which URLs the relay will POST to at all).
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import http_ece
import httpx
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from py_vapid import Vapid02

from app.security import is_loopback

KEY_FILE = "vapid_private.pem"
# The push services of Chrome (FCM), Firefox (Mozilla autopush), Edge (WNS) and Safari (Apple):
# a name ending in one of these (after a dot) or equal to one. OARLOCK_PUSH_SERVICES adds more.
PUSH_SERVICES = (
    "fcm.googleapis.com",
    "android.googleapis.com",
    "push.services.mozilla.com",
    "notify.windows.com",
    "push.apple.com",
)
MAX_ENDPOINT = 2048  # characters; real endpoints are a few hundred
TIMEOUT = 10.0  # seconds one push may take (connect, send, answer)
TTL = 24 * 3600  # seconds a push service keeps a push for a phone that is offline
GONE = (404, 410)  # the push service forgot the subscription: the relay forgets it too


def b64url(data: bytes) -> str:
    """Base64url without padding, as the Push API writes keys."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    """Decode base64url with or without padding; ValueError when it is not base64url."""
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as error:
        raise ValueError("not base64url") from error


def load_or_create_vapid(data_dir: Path) -> Vapid02:
    """The relay's VAPID key, from data_dir (created 0600 on first use, as the token is)."""
    path = data_dir / KEY_FILE
    if not path.exists():
        vapid = Vapid02()
        vapid.generate_keys()
        # Created private, never widened: O_EXCL so a file made meanwhile is not overwritten.
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return load_or_create_vapid(data_dir)
        with os.fdopen(fd, "wb") as file:
            file.write(vapid.private_pem())
        return vapid
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    return Vapid02.from_pem(path.read_bytes())


# The order of P-256's group: a private key is a number from 1 to this minus 1.
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def vapid_from_token(token: str) -> Vapid02:
    """The VAPID key derived from the token: every node of a cluster has the same.

    A browser subscribes with the key of the node its page came from, and the node that
    runs the conversation signs the push: a key per node made push services refuse it.
    HKDF-SHA256 gives 48 bytes, reduced to a key with a bias under 2**-64 (FIPS 186-5, A.2.1).
    """
    material = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=b"oarlock VAPID key")
    number = int.from_bytes(material.derive(token.encode()), "big") % (P256_ORDER - 1) + 1
    return Vapid02(private_key=ec.derive_private_key(number, ec.SECP256R1()))


def application_server_key(vapid: Vapid02) -> str:
    """The public key a browser subscribes with (applicationServerKey), base64url."""
    raw = vapid.public_key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return b64url(raw)


def endpoint_problem(url: str, *, services: tuple[str, ...], loopback_http: bool) -> str | None:
    """Why the relay will not POST to this endpoint, or None when it will.

    https to a known push service (default port) only; with loopback_http, also http to
    this machine's loopback addresses (tests, a push server of one's own on this machine).
    """
    if len(url) > MAX_ENDPOINT:
        return f"The push endpoint is longer than {MAX_ENDPOINT} characters."
    # Nothing urlsplit would quietly drop (it strips tabs and newlines, which httpx, the
    # sender, refuses), and a URL the sender itself can read.
    if not url.isprintable() or any(character.isspace() for character in url):
        return "The push endpoint is not a valid URL."
    try:
        parts = urlsplit(url)
        port = parts.port
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL):
        return "The push endpoint is not a valid URL."
    host = (parts.hostname or "").lower()
    if parts.username is not None or parts.password is not None or not host:
        return "The push endpoint is not a valid URL."
    if ":" in host:  # a VAPID token's audience cannot name one (py_vapid refuses to sign)
        return "The push endpoint must name its host, or an IPv4 address."
    if parts.scheme == "http" and loopback_http and is_loopback(host):
        return None
    known = any(host == name or host.endswith("." + name) for name in services)
    if parts.scheme != "https" or port not in (None, 443) or not known:
        return (
            "The push endpoint must be an https URL of a known push service "
            "(add others with OARLOCK_PUSH_SERVICES)."
        )
    return None


def key_problem(p256dh: str, auth: str) -> str | None:
    """Why a subscription's keys are unusable, or None."""
    try:
        point = unb64url(p256dh)
        secret = unb64url(auth)
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
    except ValueError:
        return "keys.p256dh must be a P-256 public key (base64url)."
    if len(point) != 65 or len(secret) != 16:
        return "keys.p256dh must be 65 bytes and keys.auth 16 bytes (base64url)."
    return None


@dataclass(frozen=True)
class Target:
    """Where one push goes: a browser's endpoint and its keys."""

    endpoint: str
    p256dh: str
    auth: str


def encrypt(payload: bytes, target: Target) -> bytes:
    """The payload encrypted for one browser (RFC 8291, aes128gcm)."""
    ephemeral = ec.generate_private_key(ec.SECP256R1())
    return bytes(
        http_ece.encrypt(
            payload,
            private_key=ephemeral,
            dh=unb64url(target.p256dh),
            auth_secret=unb64url(target.auth),
            version="aes128gcm",
        )
    )


def audience(endpoint: str) -> str:
    """The push service's origin, as a VAPID token names it (RFC 8292): scheme and host in
    lower case, a port only if it is not the scheme's own (as a browser writes an origin)."""
    parts = urlsplit(endpoint)
    port = parts.port
    own = {"https": 443, "http": 80}.get(parts.scheme)
    return f"{parts.scheme}://{parts.hostname}" + (f":{port}" if port not in (None, own) else "")


def vapid_headers(vapid: Vapid02, endpoint: str, contact: str) -> dict[str, str]:
    """The Authorization header proving the push comes from this relay (RFC 8292)."""
    claims = {"aud": audience(endpoint), "sub": contact}
    claims["exp"] = int(time.time()) + 12 * 3600
    return {k: str(v) for k, v in vapid.sign(claims).items()}


async def send(
    client: httpx.AsyncClient, vapid: Vapid02, contact: str, target: Target, payload: bytes
) -> int:
    """POST one encrypted push; the push service's status code."""
    headers = vapid_headers(vapid, target.endpoint, contact)
    headers |= {
        "Content-Encoding": "aes128gcm",
        "Content-Type": "application/octet-stream",
        "TTL": str(TTL),
        "Urgency": "high",  # a phone asleep shows it now, not at its next wake-up
    }
    response = await client.post(target.endpoint, content=encrypt(payload, target), headers=headers)
    return response.status_code


def client() -> httpx.AsyncClient:
    """The HTTP client pushes go out with: no redirects, bounded time, no cookies kept."""
    return httpx.AsyncClient(follow_redirects=False, timeout=TIMEOUT)
