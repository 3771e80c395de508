"""Who is calling the HTTP API: the operator token (admin), the read-only token, or a
signed per-session token (SPEC §10 ``POST /api/v1/sessions/{id}/token``).

A session token is ``sjs1.<payload>.<signature>``: the payload is base64url JSON
``{"s": session_id, "exp": unix seconds}``, the signature an HMAC-SHA256 under a key
derived from the deployment's secret key (so rotating that key revokes every token)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass

from jobs.crypto import load_or_create_key
from jobs.settings import Settings

PREFIX = "sjs1."
DEFAULT_TTL_SEC = 12 * 3600
MAX_TTL_SEC = 7 * 24 * 3600
_PURPOSE = b"skilljobs/session-token/v1"


@dataclass(frozen=True)
class Identity:
    """``kind`` is ``admin``, ``read`` or ``session`` (then ``session_id`` is set)."""

    kind: str
    session_id: str = ""

    @property
    def actor(self) -> str:
        """The name the audit trail records for this caller."""
        return f"session:{self.session_id}" if self.kind == "session" else self.kind

    @property
    def can_change(self) -> bool:
        return self.kind == "admin"


ADMIN = Identity("admin")
READ = Identity("read")


def signing_key(settings: Settings) -> bytes:
    """The session-token key: derived from the secret key, never the key itself."""
    configured = settings.secret_key.get_secret_value() if settings.secret_key else None
    secret = load_or_create_key(settings.data_dir, configured)
    return hmac.new(secret, _PURPOSE, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue(
    key: bytes, session_id: str, ttl_sec: int, *, now: float | None = None
) -> tuple[str, int]:
    """A token for ``session_id`` and the time it expires."""
    expires = int((time.time() if now is None else now) + ttl_sec)
    payload = _b64(json.dumps({"s": session_id, "exp": expires}, separators=(",", ":")).encode())
    sig = _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())
    return f"{PREFIX}{payload}.{sig}", expires


def verify(key: bytes, token: str, *, now: float | None = None) -> Identity | None:
    """The session identity the token grants, or ``None`` (forged, malformed, expired)."""
    if not token.startswith(PREFIX):
        return None
    payload, _, sig = token[len(PREFIX) :].partition(".")
    expected = _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())
    if not sig or not hmac.compare_digest(sig.encode(), expected.encode()):
        return None
    try:
        data = json.loads(_unb64(payload))
        session_id, expires = data["s"], data["exp"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(session_id, str) or not session_id or not isinstance(expires, int):
        return None
    if expires <= (time.time() if now is None else now):
        return None
    return Identity("session", session_id)


def _equal(supplied: str, secret: str | None) -> bool:
    return bool(secret) and hmac.compare_digest(supplied.encode(), (secret or "").encode())


def secret_of(value: object) -> str | None:
    get = getattr(value, "get_secret_value", None)
    return (get() or None) if get is not None else None


def identify(settings: Settings, key: bytes | None, supplied: str | None) -> Identity | None:
    """The caller's identity from a presented token; ``None`` when it grants nothing.

    A caller presenting nothing is nobody, on loopback too: any local process (a skill
    included) can reach a loopback port, so being local proves nothing. ``skilljobs web``
    and ``up`` always run with an admin token (generated when none is configured)."""
    admin = secret_of(settings.api_token)
    read = secret_of(settings.api_read_token)
    if not supplied:
        return None
    if _equal(supplied, admin):
        return ADMIN
    if _equal(supplied, read):
        return READ
    if key is not None and supplied.startswith(PREFIX):
        return verify(key, supplied)
    return None


# --- the browser session: the page's HttpOnly cookie ------------------------------------

#: the cookie ``POST /api/v1/session`` sets for the page (HttpOnly, SameSite=Strict, no
#: Max-Age: it lasts while the browser runs), so every tab is signed in without the token
#: living in page script storage
COOKIE = "skilljobs_session"
BROWSER_PREFIX = "sjb1."
BROWSER_TTL_SEC = 12 * 3600
_BROWSER = b"skilljobs/browser-session/v1"


def _fingerprint(key: bytes, token: str) -> str:
    """Binds a cookie to the token it was made from: a changed token ends the session."""
    return _b64(hmac.new(key, b"fp:" + token.encode(), hashlib.sha256).digest()[:12])


def _browser_sig(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, _BROWSER + b"." + payload.encode(), hashlib.sha256).digest())


def issue_browser(
    key: bytes, kind: str, token: str, *, ttl_sec: int = BROWSER_TTL_SEC, now: float | None = None
) -> str:
    """The cookie value of a browser session for an ``admin`` or ``read`` token."""
    expires = int((time.time() if now is None else now) + ttl_sec)
    data = {"k": kind, "exp": expires, "fp": _fingerprint(key, token)}
    payload = _b64(json.dumps(data, separators=(",", ":")).encode())
    return f"{BROWSER_PREFIX}{payload}.{_browser_sig(key, payload)}"


def verify_browser(
    key: bytes, settings: Settings, value: str, *, now: float | None = None
) -> Identity | None:
    """The identity a browser-session cookie grants, or None (forged, expired, or made
    from a token that is no longer the configured one)."""
    if not value.startswith(BROWSER_PREFIX):
        return None
    payload, _, sig = value[len(BROWSER_PREFIX) :].partition(".")
    if not sig or not hmac.compare_digest(sig.encode(), _browser_sig(key, payload).encode()):
        return None
    try:
        data = json.loads(_unb64(payload))
        kind, expires, fp = data["k"], data["exp"], data["fp"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(expires, int) or expires <= (time.time() if now is None else now):
        return None
    token = secret_of(settings.api_token if kind == "admin" else settings.api_read_token)
    if kind not in ("admin", "read") or not token or not isinstance(fp, str):
        return None
    if not hmac.compare_digest(fp.encode(), _fingerprint(key, token).encode()):
        return None
    return ADMIN if kind == "admin" else READ


def cookie_value(header: bytes) -> str | None:
    """Our cookie's value in a ``Cookie`` request header."""
    from http.cookies import CookieError, SimpleCookie

    jar = SimpleCookie()
    try:
        jar.load(header.decode("latin-1"))
    except CookieError:
        return None
    found = jar.get(COOKIE)
    return found.value if found is not None else None


class TokenKey:
    """The session-token key, derived on first use (the key file may not exist yet when
    the app is built)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._key: bytes | None = None

    def get(self) -> bytes:
        if self._key is None:
            self._key = signing_key(self.settings)
        return self._key
