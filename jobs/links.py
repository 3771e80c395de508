"""Signed, expiring tokens: the authorization of a link, carried by the link itself.

A token is ``<payload>.<signature>``, both base64url without padding: the payload is JSON
``{"k": kind, "x": expiry (unix seconds), …claims}``, the signature an HMAC-SHA256 under a
key derived from the deployment's secret key for one purpose (rotating the secret key
revokes every token). ``kind`` keeps a token made for one use from being accepted by
another. File links (``/files/<token>``) are the ``file`` kind, scoped to one artifact.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import TYPE_CHECKING, Any

from jobs.crypto import load_or_create_key

if TYPE_CHECKING:
    from jobs.settings import Settings

FILE_KIND = "file"
FILE_ROUTE = "/files/"
DEFAULT_FILE_TTL_SEC = 7 * 24 * 3600
MAX_TOKEN_CHARS = 4096


class LinkError(Exception):
    """A token that does not authorize anything: malformed, forged, expired or misused."""


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A signing key for one purpose, derived from the deployment's secret key."""
    return hmac.new(secret, b"skilljobs/" + purpose.encode(), hashlib.sha256).digest()


def sign(key: bytes, kind: str, claims: dict[str, Any], ttl_sec: float, *, now: float = 0) -> str:
    """A token of ``kind`` carrying ``claims``, valid for ``ttl_sec`` seconds."""
    body = {"k": kind, "x": int((now or time.time()) + ttl_sec), **claims}
    payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
    return f"{payload}.{_b64(_mac(key, payload))}"


def verify(key: bytes, token: str, kind: str, *, now: float = 0) -> dict[str, Any]:
    """The claims of a valid, unexpired token of ``kind``; raises :class:`LinkError`."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        raise LinkError("malformed link")
    payload, _, signature = token.partition(".")
    try:
        given, raw = _unb64(signature), _unb64(payload)
    except ValueError as exc:
        raise LinkError("malformed link") from exc
    if not hmac.compare_digest(given, _mac(key, payload)):
        raise LinkError("invalid link signature")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise LinkError("malformed link") from exc
    if not isinstance(body, dict) or body.get("k") != kind or not isinstance(body.get("x"), int):
        raise LinkError("this link is not for this use")
    if body["x"] < (now or time.time()):
        raise LinkError("this link has expired")
    return body


def file_link_key(settings: Settings) -> bytes:
    """The key that signs file links (reads or creates the deployment's secret key)."""

    configured = settings.secret_key.get_secret_value() if settings.secret_key else None
    return derive_key(load_or_create_key(settings.data_dir, configured), "file-link")


def _path_box(key: bytes) -> Any:
    from cryptography.fernet import Fernet

    return Fernet(base64.urlsafe_b64encode(derive_key(key, "file-path")))


def file_link(key: bytes, job_id: str | None, path: str, ttl_sec: float) -> str:
    """``/files/<token>`` for one delivered file (``job_id`` names the artifact's job).

    The link's readable part holds an opaque id (the path, encrypted), never the server's
    path: whoever holds a link learns nothing about where the file lives."""
    opaque = _path_box(key).encrypt(path.encode("utf-8")).decode("ascii")
    claims: dict[str, Any] = {"f": opaque}
    if job_id:
        claims["j"] = job_id
    return FILE_ROUTE + sign(key, FILE_KIND, claims, ttl_sec)


def file_path(key: bytes, claims: dict[str, Any]) -> str | None:
    """The path a verified file link's opaque id stands for (None: not a file link)."""
    opaque = claims.get("f")
    if not isinstance(opaque, str) or not opaque:
        return None
    from cryptography.fernet import InvalidToken

    try:
        return str(_path_box(key).decrypt(opaque.encode("ascii")).decode("utf-8"))
    except (InvalidToken, ValueError, UnicodeError):
        return None


def _mac(key: bytes, payload: str) -> bytes:
    return hmac.new(key, payload.encode("ascii"), hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(c not in _ALPHABET for c in text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
