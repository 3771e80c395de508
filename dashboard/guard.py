"""The HTTP surface's front door: a pure ASGI middleware that decides about a request from
its head alone, before any body byte is read.

In order: the ``Host`` is a loopback name or a configured one (DNS rebinding → 421); a
foreign ``Origin`` and body-less or form-encoded state-changing requests are refused
(CSRF → 403); the caller is identified from its token (401, slower and slower for a
client that keeps guessing) and its identity may do what it asks (403); numbers in the
path and query fit in 64 bits (400); then the body is streamed under a cap (413), and a
JSON body must hold only finite numbers that fit in 64 bits (422, naming the field)."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dashboard.tokens import Identity, TokenKey, cookie_value, identify, verify_browser
from jobs import audit
from jobs.settings import Settings

#: set in the scope when the caller was identified by the page's session cookie
BROWSER_SESSION = "skilljobs.browser_session"
#: where the page signs in and out (a read token may too: it changes no data)
BROWSER_SESSION_PATH = "/api/v1/session"

log = logging.getLogger(__name__)

IDENTITY = "skilljobs.identity"
# The JSON body as the guard parsed it (absent when it did not parse): read it from here
# instead of parsing the body a second time.
PARSED_BODY = "skilljobs.json_body"
MB = 1024 * 1024
INT_MAX = 2**63 - 1
BODY_TIMEOUT_S = 30.0
MAX_DEPTH = 64
DISPATCH_INPUT = frozenset({"input"})
MAX_ID_CHARS = 255

OPEN_EXACT = frozenset({"/", "/healthz", "/readyz", "/favicon.ico"})
OPEN_PREFIXES = ("/static/", "/files/")
HEALTH = frozenset({"/healthz", "/readyz"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Headers a cross-site page cannot send without a CORS preflight (which is never granted).
NON_SIMPLE_HEADERS = (b"authorization", b"x-requested-with", b"x-skilljobs-client")

FREE_FAILURES = 5  # 401s per client per window before answers slow down
FAILURE_WINDOW_S = 60.0
MAX_DELAY_STEPS = 8  # the longest wait, in steps of SKILLJOBS_WEB_AUTH_FAILURE_DELAY_SEC


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit // MB} MB")


class BodyTimeout(HTTPException):
    def __init__(self) -> None:
        super().__init__(408, "the request body did not arrive in time")


class Refusal(Exception):
    """A request refused by the guard: answered with an error envelope."""

    def __init__(self, status: int, error: str, error_type: str = "recoverable") -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.error_type = error_type


@functools.lru_cache(maxsize=512)
def is_loopback(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=8)
def _names(raw: str) -> frozenset[str]:
    return frozenset(h.strip().lower() for h in raw.split(",") if h.strip())


def host_name(value: str) -> str:
    """``example.com:8000`` → ``example.com``; ``[::1]:8000`` → ``::1``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def is_stream(path: str) -> bool:
    parts = path.split("/")
    return path == "/api/v1/events" or (
        len(parts) == 6 and parts[:4] == ["", "api", "v1", "sessions"] and parts[5] == "events"
    )


def session_path(path: str) -> str | None:
    """The session id of ``/api/v1/sessions/{id}/messages|events``, else ``None``."""
    parts = path.split("/")
    if len(parts) == 6 and parts[:4] == ["", "api", "v1", "sessions"]:
        if parts[5] in ("messages", "events") and parts[4]:
            return parts[4]
    return None


def _nonfinite(const: str) -> Any:
    raise ValueError(const)


def check_json(value: Any, where: str = "", depth: int = 0) -> None:
    """Raise ``Refusal`` naming the first field holding an unusable number."""
    if depth > MAX_DEPTH:
        raise Refusal(422, f"{where or 'body'}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, dict):
        for k, v in value.items():
            check_json(v, f"{where}.{k}" if where else str(k), depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_json(v, f"{where}[{i}]", depth + 1)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_MAX:
        raise Refusal(422, f"{where or 'body'}: number out of range (at most 2^63-1)")


NOT_PARSED: Any = object()


def parse_json(body: bytes) -> Any:
    """Refuse a JSON body with NaN/Infinity, 64-bit overflows or absurd nesting; the parsed
    value, or ``NOT_PARSED`` when it is not JSON (a syntax error, left to the app)."""
    try:
        value = json.loads(body, parse_constant=_nonfinite)
        check_json(value)
        return value
    except RecursionError as exc:
        raise Refusal(422, "body: nested too deeply") from exc
    except ValueError as exc:
        # parse_constant raises with the literal; find the field it sits in.
        literal = str(exc)
        if literal in ("NaN", "Infinity", "-Infinity"):
            field = _field_of_constant(body)
            raise Refusal(422, f"{field}: non-finite number ({literal}) is not allowed") from exc
        # Syntax errors are left to the app, which names the position.
        return NOT_PARSED


def _field_of_constant(body: bytes) -> str:
    found: list[str] = []

    def mark(const: str) -> str:
        return f"\x00{const}\x00"

    try:
        data = json.loads(body, parse_constant=mark)
    except ValueError:
        return "body"

    def walk(v: Any, where: str) -> None:
        if found:
            return
        if isinstance(v, str) and v.startswith("\x00") and v.endswith("\x00"):
            found.append(where or "body")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{where}.{k}" if where else str(k))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{where}[{i}]")

    walk(data, "")
    return found[0] if found else "body"


def _too_big(text: str) -> bool:
    digits = text[1:] if text[:1] in "+-" else text
    return digits.isdigit() and len(digits) > 18 and abs(int(text)) > INT_MAX


def check_numbers(path: str, query: str) -> None:
    """Integers in the path and query must fit a 64-bit column (else a 500 from SQL)."""
    for i, seg in enumerate(path.split("/")):
        if len(seg) > 18 and _too_big(seg):
            raise Refusal(400, f"path segment {i}: number out of range (at most 2^63-1)")
    for name, value in parse_qsl(query, keep_blank_values=True):
        if len(value) > 18 and _too_big(value.strip()):
            raise Refusal(400, f"{name}: number out of range (at most 2^63-1)")


def _text_of(raw: bytes, what: str) -> str:
    """``raw`` (percent-encoded) as text; Refusal (400) for NUL or bytes that are not UTF-8."""
    data = unquote_to_bytes(raw.replace(b"+", b" "))
    if b"\x00" in data:
        raise Refusal(400, f"{what} contains a NUL character")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(400, f"{what} is not valid UTF-8 (byte {exc.start})") from exc
    if any("\ud800" <= c <= "\udfff" for c in text):
        raise Refusal(400, f"{what} contains invalid Unicode (a lone surrogate)")
    return text


def check_text(scope: Scope, headers: dict[bytes, bytes]) -> None:
    """NUL and invalid Unicode in the path, the query or a header are a 400 naming where
    (they cannot be stored, and would otherwise surface as a server error)."""
    raw_path = scope.get("raw_path") or str(scope.get("path", "")).encode("utf-8", "replace")
    path = _text_of(raw_path.split(b"?", 1)[0], "the path")
    if path.startswith("/api/"):
        for i, seg in enumerate(path.split("/")):
            if len(seg) > MAX_ID_CHARS:  # no id is longer than its column
                raise Refusal(400, f"path segment {i} is longer than {MAX_ID_CHARS} characters")
    query = scope.get("query_string") or b""
    for pair in query.split(b"&"):
        if not pair:
            continue
        name, _, value = pair.partition(b"=")
        label = _text_of(name, "a query parameter name")
        _text_of(value, f"query parameter {label[:40]!r}")
    for name, value in headers.items():
        if b"\x00" in value:
            raise Refusal(400, f"header {name.decode('latin-1')[:40]!r} contains a NUL character")


def check_json_text(value: Any, where: str = "", skip: frozenset[str] = frozenset()) -> None:
    """Refuse (400, naming the field) a JSON body holding NUL or a lone surrogate in a key
    or a text value; the top-level fields in ``skip`` are judged later (a dispatch's
    ``input`` has its invalid text replaced, not refused)."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                raise Refusal(400, f"{at or 'body'}: contains a NUL character")
            if any("\ud800" <= c <= "\udfff" for c in v):
                raise Refusal(400, f"{at or 'body'}: contains invalid Unicode (a lone surrogate)")
        elif isinstance(v, dict):
            for k, x in v.items():
                name = f"{at}.{k}" if at else str(k)
                stack.append((k, f"{name} (key)"))
                if not (at == "" and k in skip):
                    stack.append((x, name))
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))


class Failures:
    """401s per client address; past a few, each answer waits longer."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[float, int]] = {}

    def delay(self, client: str, step: float) -> float:
        now = time.monotonic()
        start, count = self.seen.get(client, (now, 0))
        if now - start > FAILURE_WINDOW_S:
            start, count = now, 0
        count += 1
        if len(self.seen) > 10_000:
            self.seen.clear()
        self.seen[client] = (start, count)
        return step * min(MAX_DELAY_STEPS, max(0, count - FREE_FAILURES))


class Guard:
    """See the module docstring. ``settings`` is read on each request (tests change it)."""

    def __init__(self, app: ASGIApp, settings: Settings, tokens: TokenKey) -> None:
        self.app = app
        self.settings = settings
        self.tokens = tokens
        self.failures = Failures()

    # --- decisions on the head ----------------------------------------------------------

    def allowed_hosts(self) -> frozenset[str]:
        return _names(str(getattr(self.settings, "allowed_hosts", "") or ""))

    def check_host(self, headers: dict[bytes, bytes]) -> str:
        raw = headers.get(b"host", b"").decode("latin-1")
        if not raw:
            raise Refusal(400, "a Host header is required")
        name = host_name(raw)
        allowed = self.allowed_hosts()
        if is_loopback(name) or name.endswith(".localhost") or name in allowed:
            return raw.strip().lower()
        if raw.strip().lower() in allowed:
            return raw.strip().lower()
        raise Refusal(421, f"host {name!r} is not served here: add it to SKILLJOBS_ALLOWED_HOSTS")

    def check_origin(self, method: str, headers: dict[bytes, bytes], host: str) -> None:
        origin = headers.get(b"origin")
        if origin is not None:
            netloc = urlsplit(origin.decode("latin-1")).netloc.lower()
            if netloc != host and host_name(netloc) not in self.allowed_hosts():
                raise Refusal(403, "cross-origin request refused")
        if method in SAFE_METHODS:
            return
        if headers.get(b"sec-fetch-site", b"") == b"cross-site":
            raise Refusal(403, "cross-site request refused")
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        is_json = ctype == b"application/json" or ctype.endswith(b"+json")
        if not is_json and not any(h in headers for h in NON_SIMPLE_HEADERS):
            raise Refusal(
                403,
                "state-changing requests need a JSON body (Content-Type: application/json) "
                "or an X-Requested-With header",
            )

    def authenticate(self, scope: Scope, headers: dict[bytes, bytes]) -> Identity | None:
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, value = auth.partition(" ")
        supplied = value.strip() if scheme.lower() == "bearer" else ""
        if not supplied and is_stream(scope["path"]):
            query = scope.get("query_string", b"").decode("latin-1")
            supplied = dict(parse_qsl(query)).get("token", "")
        if not supplied and b"cookie" in headers:
            # the page's browser session (HttpOnly, SameSite=Strict: never sent cross-site)
            cookie = cookie_value(headers[b"cookie"])
            if cookie:
                found = verify_browser(self.tokens.get(), self.settings, cookie)
                if found is not None:
                    scope[BROWSER_SESSION] = True
                    return found
        key = self.tokens.get() if supplied.startswith("sjs1.") else None
        identity = identify(self.settings, key, supplied or None)
        if identity is None:
            raise Refusal(
                401,
                "the API token is wrong"
                if supplied
                else "an API token is required: send 'Authorization: Bearer <token>'",
                "config",
            )
        return identity

    @staticmethod
    def authorize(identity: Identity, method: str, path: str) -> None:
        if identity.kind == "admin":
            return
        if identity.kind == "read":
            if method not in SAFE_METHODS and path != BROWSER_SESSION_PATH:
                raise Refusal(403, "this token can read but not change anything")
            return
        if method in SAFE_METHODS and session_path(path) == identity.session_id:
            return
        raise Refusal(403, f"this token is scoped to session {identity.session_id!r}")

    def body_limit(self, path: str) -> int:
        cap = float(getattr(self.settings, "max_request_mb", 16.0))
        mb = cap if path == "/api/v1/dispatch" else min(1.0, cap)
        return int(mb * MB)

    # --- the middleware -------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def _send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            receive = await self.admit(scope, receive)
            await self.app(scope, receive, _send)
        except Refusal as exc:
            if started:
                raise
            await self.refuse(scope, send, exc)
        except (BodyTooLarge, BodyTimeout) as exc:  # if the app let them through
            if started:
                raise
            await self.refuse(scope, send, Refusal(exc.status_code, str(exc.detail)))

    async def admit(self, scope: Scope, receive: Receive) -> Receive:
        """Everything decided on the head; the ``receive`` the app gets."""
        headers = dict(scope.get("headers") or [])
        method: str = scope["method"]
        path: str = scope["path"]
        if path in HEALTH:
            return receive
        host = self.check_host(headers)
        is_open = path in OPEN_EXACT or path.startswith(OPEN_PREFIXES)
        if not is_open:
            self.check_origin(method, headers, host)
            identity = self.authenticate(scope, headers)
            assert identity is not None
            scope[IDENTITY] = identity
            try:
                self.authorize(identity, method, path)
            except Refusal:
                await self.audit_refusal(scope, identity, method, path)
                raise
        elif method not in SAFE_METHODS:
            self.check_origin(method, headers, host)
        check_text(scope, headers)
        check_numbers(path, scope.get("query_string", b"").decode("latin-1"))
        return await self.capped(scope, headers, receive)

    async def capped(self, scope: Scope, headers: dict[bytes, bytes], receive: Receive) -> Receive:
        limit = self.body_limit(scope["path"])
        length = headers.get(b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                raise Refusal(400, "Content-Length is not a number")
            if int(length) > limit:
                raise Refusal(413, f"request body larger than {limit // MB} MB")
        if scope["method"] in ("GET", "HEAD") and length is None:
            return receive
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if ctype == b"application/json" or ctype.endswith(b"+json"):
            return await self.buffered_json(scope, receive, limit)
        return counting(receive, limit)

    async def buffered_json(self, scope: Scope, receive: Receive, limit: int) -> Receive:
        """Read the whole (capped) body, check its numbers, leave the parsed value in the
        scope (``PARSED_BODY``) and replay the body to the app."""
        chunks: list[bytes] = []
        size = 0
        tail: Message | None = None
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        tail = message
                        break
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise Refusal(413, f"request body larger than {limit // MB} MB")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError as exc:
            raise Refusal(408, "the request body did not arrive in time") from exc
        body = b"".join(chunks)
        del chunks
        if body:
            value = parse_json(body)
            if value is not NOT_PARSED:
                skip = DISPATCH_INPUT if scope["path"] == "/api/v1/dispatch" else frozenset()
                check_json_text(value, skip=skip)
                scope[PARSED_BODY] = value
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if tail is not None:
                    return tail
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    async def refuse(self, scope: Scope, send: Send, exc: Refusal) -> None:
        if exc.status == 401:
            client = (scope.get("client") or ("?", 0))[0]
            step = float(getattr(self.settings, "web_auth_failure_delay_sec", 0.25))
            wait = self.failures.delay(str(client), step)
            if wait:
                await asyncio.sleep(wait)
        body = json.dumps({"ok": False, "error": exc.error, "error_type": exc.error_type})
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            # The body was not read: the connection cannot be reused.
            (b"connection", b"close"),
        ]
        if exc.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})

    async def audit_refusal(self, scope: Scope, identity: Identity, method: str, path: str) -> None:
        """A valid token used beyond its scope is worth a line in the audit trail."""
        app = scope.get("app")
        svc = getattr(getattr(app, "state", None), "services", None)
        if svc is None:
            return

        try:
            async with svc.sessionmaker() as s:
                audit.record(
                    s,
                    action="refused",
                    target=f"{method} {path}"[:255],
                    actor=identity.actor[:128],
                    details={"kind": identity.kind},
                )
                await s.commit()
        except Exception as exc:  # the refusal stands whether or not it was recorded
            log.warning("audit of a refused request failed: %s", type(exc).__name__)


def counting(receive: Receive, limit: int) -> Callable[[], Awaitable[Message]]:
    """``receive`` that raises ``BodyTooLarge`` once more than ``limit`` bytes came in, and
    ``BodyTimeout`` when the body takes longer than ``BODY_TIMEOUT_S`` (slow-body clients)."""
    size = 0
    deadline = time.monotonic() + BODY_TIMEOUT_S
    complete = False

    async def _receive() -> Message:
        nonlocal size, complete
        if complete:  # after the body only a disconnect can come: no deadline
            return await receive()
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                message = await receive()
        except TimeoutError as exc:
            raise BodyTimeout() from exc
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise BodyTooLarge(limit)
            complete = not message.get("more_body", False)
        return message

    return _receive
