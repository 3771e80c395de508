"""A tiny ASGI app base for fake third-party APIs, served by uvicorn on 127.0.0.1 in a thread.

Every request is recorded (method, path, query, headers, JSON body, form fields, uploaded
files with their bytes) so tests can check exactly what went over the wire. ``fail_next``
scripts the next responses for a path (rate limits, server errors, body-level errors).
:class:`Tokens` is the access-token book of the fakes that have tokens: revoked at once, or
expired after a number of uses.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email import message_from_bytes
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qsl

import uvicorn


@dataclass
class Upload:
    filename: str
    content: bytes
    content_type: str = ""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    form: dict[str, str] = field(default_factory=dict)
    files: dict[str, Upload] = field(default_factory=dict)

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Response:
    status: int = 200
    body: Any = None  # dict/list → JSON, bytes/str → as is
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


class Tokens:
    """Access tokens a fake issues. A token is valid until :meth:`revoke` or, with
    ``expire_after`` set, until it has been used that many times (then it is ``expired``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.valid: set[str] = set()
        self.expired: set[str] = set()
        self.expire_after: int | None = None
        self.issued = 0
        self._uses: dict[str, int] = {}

    def issue(self) -> str:
        self.issued += 1
        token = f"{self.prefix}{self.issued}"
        self.valid.add(token)
        return token

    def check(self, token: str | None) -> str:
        """``ok`` (and one use counted), ``expired`` or ``unknown``."""
        if token in self.expired:
            return "expired"
        if not token or token not in self.valid:
            return "unknown"
        used = self._uses.get(token, 0)
        if self.expire_after is not None and used >= self.expire_after:
            self.valid.discard(token)
            self.expired.add(token)
            return "expired"
        self._uses[token] = used + 1
        return "ok"

    def revoke(self) -> None:
        self.expired |= self.valid
        self.valid.clear()


def png_size(content: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG's IHDR chunk (None when it does not read as one: the
    fake does not decode pictures, so test bytes that are not a real PNG pass)."""
    if content[:8] != b"\x89PNG\r\n\x1a\n" or content[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", content[16:24])
    if not (0 < width <= 1_000_000 and 0 < height <= 1_000_000):
        return None
    return int(width), int(height)


def picture_size(content: bytes) -> tuple[int, int] | None:
    """Width and height of a PNG (IHDR) or a GIF (logical screen), else None."""
    if content[:6] in (b"GIF87a", b"GIF89a") and len(content) >= 10:
        width, height = struct.unpack("<HH", content[6:10])
        return (int(width), int(height)) if width and height else None
    return png_size(content)


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def suffix(name: str) -> str:
    return name.rpartition(".")[2].lower() if "." in name else ""


def parse_multipart(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, Upload]]:
    """multipart/form-data → (fields, files), with the stdlib MIME parser."""
    msg = message_from_bytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body, policy=HTTP)
    fields: dict[str, str] = {}
    files: dict[str, Upload] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        filename = part.get_filename()
        if filename is not None:
            files[str(name)] = Upload(filename, payload, part.get_content_type())
        else:
            fields[str(name)] = payload.decode()
    return fields, files


class FakeServer:
    """Base class: subclasses register handlers with ``self.route(method, path, handler)``."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._routes: dict[tuple[str, str], Handler] = {}
        self._scripted: dict[str, list[Response]] = {}
        # path suffix → how many answers to lose: the request is processed, then the answer
        # is held back for ``lose_delay`` s (the client times out reading it)
        self.lose_answers: dict[str, int] = {}
        self.lose_delay = 3.0
        # an outage: until this time.monotonic(), every request is answered ``outage_status``
        # without being processed (counted in ``refused``)
        self.outage_until = 0.0
        self.outage_status = 500
        self.refused = 0
        # a hang: until this time.monotonic(), requests are held unanswered (then processed)
        self.hang_until = 0.0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- set-up ---------------------------------------------------------------------

    def route(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method.upper(), path)] = handler

    def fail_next(self, path: str, *responses: Response) -> None:
        """The next requests to ``path`` get these responses, in order, instead of the
        normal handler."""
        self._scripted.setdefault(path, []).extend(responses)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def calls(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]

    # --- ASGI -----------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        req = Request(
            method=scope["method"],
            path=scope["path"],
            query=dict(parse_qsl(scope.get("query_string", b"").decode())),
            headers=headers,
            body=body,
        )
        ctype = headers.get("content-type", "")
        if ctype.startswith("multipart/form-data"):
            req.form, req.files = parse_multipart(ctype, body)
        elif ctype.startswith("application/x-www-form-urlencoded"):
            req.form = dict(parse_qsl(body.decode()))
        while time.monotonic() < self.hang_until:
            await asyncio.sleep(0.05)
        self.requests.append(req)
        resp = await self._respond(req)
        for tail, left in self.lose_answers.items():
            if left > 0 and req.path.endswith(tail):
                self.lose_answers[tail] = left - 1
                await asyncio.sleep(self.lose_delay)
                break
        payload = resp.body
        out_headers = dict(resp.headers)
        if isinstance(payload, dict | list):
            payload = json.dumps(payload).encode()
            out_headers.setdefault("content-type", "application/json")
        elif isinstance(payload, str):
            payload = payload.encode()
        elif payload is None:
            payload = b""
        await send(
            {
                "type": "http.response.start",
                "status": resp.status,
                "headers": [(k.encode(), v.encode()) for k, v in out_headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    def hang(self, seconds: float) -> None:
        """Hold every request for the next ``seconds``, then process it (a platform that
        stops answering for a while; a client that gives up first does not know whether its
        message arrived)."""
        self.hang_until = time.monotonic() + seconds

    def outage(self, seconds: float, status: int = 500) -> None:
        """Answer every request ``status`` for the next ``seconds`` (a platform outage)."""
        self.outage_status = status
        self.outage_until = time.monotonic() + seconds

    async def _respond(self, req: Request) -> Response:
        if time.monotonic() < self.outage_until:
            self.refused += 1
            body = {"ok": False, "error_code": self.outage_status, "description": "Bad Gateway"}
            return Response(self.outage_status, body)
        queue = self._scripted.get(req.path)
        if queue:
            return queue.pop(0)
        handler = self._routes.get((req.method, req.path))
        if handler is None:
            handler = self._match_prefix(req)
        if handler is None:
            return Response(404, {"error": f"no route {req.method} {req.path}"})
        return await handler(req)

    def _match_prefix(self, req: Request) -> Handler | None:
        # routes ending in "*" match any path with that prefix (e.g. /bot<token>/sendMessage)
        for (method, path), h in self._routes.items():
            if method == req.method and path.endswith("*") and req.path.startswith(path[:-1]):
                return h
        return None

    # --- life cycle -----------------------------------------------------------------

    def start(self) -> FakeServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)

        def run() -> None:
            asyncio.run(self._server.serve(sockets=[sock]))  # type: ignore[union-attr]

        self._thread = threading.Thread(target=run, daemon=True, name=type(self).__name__)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            # a request still held (a lost answer, a hang) is abandoned, not waited for:
            # the platform going away mid-request is what a test stopping it means
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
