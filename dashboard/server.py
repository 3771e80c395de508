"""Running the dashboard app under uvicorn (``skilljobs web`` and ``skilljobs up``), with
the connection hygiene a hostile network needs (on uvicorn's httptools parser): a deadline
and a 16 KiB cap for request heads, short keep-alive, a connection cap answered with a
fast 503, the descriptor limit raised to what the system allows, accept errors logged
at most once in a while, and a response's head and body sent in one write."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import uvicorn
from pydantic import SecretStr
from starlette.types import ASGIApp

from dashboard.app import create_app
from dashboard.guard import is_loopback
from jobs.settings import Settings

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Protocol
else:
    _Protocol = object

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 32
KEEP_ALIVE_S = 5
MAX_HEAD_BYTES = 16 * 1024
FD_RESERVE = 64  # descriptors kept for the database, Redis, files and logs
ACCEPT_LOG_EVERY_S = 10.0


class UnsafeBind(ValueError):
    """Binding beyond loopback without a strong API token would expose the ops API."""


def _secret(value: SecretStr | None) -> str:
    return value.get_secret_value() if value is not None else ""


def check_bind(settings: Settings, host: str) -> None:
    """Raise ``UnsafeBind`` (one-line reason) for a non-loopback host without a token, or
    with a token (operator or read-only) too short to resist guessing."""
    if is_loopback(host):
        return
    token = _secret(settings.api_token)
    if not token:
        raise UnsafeBind(
            f"refusing to listen on {host}: set SKILLJOBS_API_TOKEN first "
            "(without a token only 127.0.0.1 / ::1 / localhost are allowed)"
        )
    for name, value in (("API_TOKEN", token), ("API_READ_TOKEN", _secret(settings.api_read_token))):
        if value and len(value) < MIN_TOKEN_CHARS:
            raise UnsafeBind(
                f"refusing to listen on {host}: SKILLJOBS_{name} has {len(value)} characters, "
                f"at least {MIN_TOKEN_CHARS} are needed beyond loopback"
            )


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to the hard one; the soft limit after."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("descriptor limit stays at %s: %s", soft, exc)
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


class AcceptErrorFilter(logging.Filter):
    """At most one accept-error record per interval (descriptor exhaustion otherwise
    writes thousands a second), with how many were left out."""

    def __init__(self, every_s: float = ACCEPT_LOG_EVERY_S) -> None:
        super().__init__()
        self.every_s = every_s
        self.last = 0.0
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        # asyncio's retry after EMFILE also fails noisily once the socket is gone.
        if not any(m in text for m in ("accept", "Too many open files", "_start_serving")):
            return True
        now = time.monotonic()
        if now - self.last < self.every_s:
            self.dropped += 1
            return False
        if self.dropped:
            record.msg = f"{text} ({self.dropped} similar errors not logged)"
        self.last, self.dropped = now, 0
        return True


_ACCEPT_FILTER = AcceptErrorFilter()


def install_accept_filter() -> None:
    for name in ("asyncio", "uvicorn.error"):
        logger = logging.getLogger(name)
        if _ACCEPT_FILTER not in logger.filters:
            logger.addFilter(_ACCEPT_FILTER)


BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n"
    b"content-length: 5\r\nconnection: close\r\n\r\nbusy\n"
)
HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
    b"content-length: 25\r\nconnection: close\r\n\r\nrequest head over 16 KiB\n"
)


class OneSegment:
    """A transport through which a response's head and body leave in one write.

    uvicorn writes the status line and headers on ``http.response.start`` and the body
    on ``http.response.body``: two writes, two TCP segments (the socket is ``TCP_NODELAY``)
    and two wake-ups of the client for one small answer. Here a write is held until the
    next write joins it (both leave at once) or, when none comes, until the end of the
    event loop's turn: a head whose body is late (an event stream) waits one turn at most.
    Everything else is the transport's own."""

    JOIN_MAX = 64 * 1024  # held + next up to this size leave as one buffer, larger ones as two

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._call_soon = loop.call_soon
        self._held: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None
        # what uvicorn calls on its transport, bound once (no __getattr__ on the hot path)
        self.is_closing = transport.is_closing
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if type(data) is not bytes:
            data = bytes(data)  # the caller may reuse its buffer
        held = self._held
        if held is None:
            self._held = data
            self._flush_handle = self._call_soon(self._flush)
            return
        self._held = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._transport.is_closing():
            return
        if len(held) + len(data) <= self.JOIN_MAX:
            self._transport.write(held + data)
        else:
            self._transport.writelines((held, data))

    def writelines(self, lines: Iterable[bytes]) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        self._flush_handle = None
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def _drop_flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def write_eof(self) -> None:
        self._drop_flush()
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._drop_flush()
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._drop_flush()
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HeadGuard(_Protocol):
    """The guards of :func:`protocol_class`, mixed into uvicorn's httptools protocol."""

    head_timeout_s = 10.0
    max_connections = 1 << 20
    max_head_bytes = MAX_HEAD_BYTES
    _head_timer: asyncio.TimerHandle | None = None
    # Bytes of the head being received, None while a body is: a head is counted from
    # the end of the previous request, so one that follows a body in the same read
    # may exceed the cap by at most that read (the memory stays bounded).
    _head_bytes: int | None = 0
    _heads = 0  # heads parsed on this connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(OneSegment(transport, self.loop))  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            transport.write(BUSY)
            transport.close()
            return
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        if self._head_bytes is None:  # a body: not counted
            super().data_received(data)
        elif self._head_bytes + len(data) <= self.max_head_bytes:
            self._head_bytes += len(data)
            super().data_received(data)
        else:
            # Parse only up to the cap: the head must be complete within it.
            room, heads = self.max_head_bytes - self._head_bytes, self._heads
            self._head_bytes = self.max_head_bytes
            super().data_received(data[:room])
            if self._heads == heads:
                self._refuse_head()
            elif not self.transport.is_closing():
                self.data_received(data[room:])  # the next heads, counted alike
            return
        self._watch_head()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._heads += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _refuse_head(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(HEAD_TOO_LARGE)
            self.transport.close()

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _watch_head(self) -> None:
        if not self._waiting_for_head():
            self._stop_head_timer()
        elif self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            self.transport.close()


def protocol_class(
    head_timeout_s: float, max_connections: int, max_head_bytes: int = MAX_HEAD_BYTES
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a deadline for each request head (a connection
    that does not deliver a complete head in time is closed: slow-header attacks), a cap
    on the head's size (past ``max_head_bytes`` the answer is 431 and the connection is
    closed, so a head never grows in memory), and connections past ``max_connections``
    answered 503 and closed at once, so descriptors never run out (asyncio's accept
    retries after EMFILE storm the log)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    attrs = {
        "head_timeout_s": head_timeout_s,
        "max_connections": max_connections,
        "max_head_bytes": max_head_bytes,
    }
    return type("GuardedHttpTools", (HeadGuard, HttpToolsProtocol), attrs)


def build_config(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    app: ASGIApp | None = None,
    log_level: str | None = None,
) -> uvicorn.Config:
    """The uvicorn config of the web app (``app`` defaults to a fresh dashboard app)."""
    check_bind(settings, host)
    if not is_loopback(host) and host not in ("0.0.0.0", "::", ""):
        # The address it was told to listen on is a name it answers to.
        names = [h for h in settings.allowed_hosts.split(",") if h.strip()]
        settings.allowed_hosts = ",".join([*names, host.strip("[]")])
    fds = raise_fd_limit()
    install_accept_filter()
    limit = max(16, min(settings.web_max_connections, fds - FD_RESERVE))
    return uvicorn.Config(
        app if app is not None else create_app(settings, sync_pool=True),
        host=host,
        port=port,
        log_level=(log_level or settings.log_level).lower(),
        lifespan="on",
        # Past `limit` requests get uvicorn's 503; past what the descriptors allow,
        # connections are answered 503 and closed as they arrive.
        http=protocol_class(settings.web_header_timeout_sec, max(limit, fds - FD_RESERVE)),
        proxy_headers=False,
        # Event-stream URLs may carry ?token=: request lines are never logged.
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=limit,
        # Open event streams would otherwise hold shutdown forever.
        timeout_graceful_shutdown=5,
    )


def server_for(
    settings: Settings, host: str, port: int, *, app: ASGIApp | None = None
) -> uvicorn.Server:
    """A ``uvicorn.Server`` for the app, configured as above."""
    return uvicorn.Server(build_config(settings, host, port, app=app, log_level="warning"))


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the dashboard (blocking). Raises ``UnsafeBind`` before binding anything."""
    uvicorn.Server(build_config(settings, host, port)).run()


async def serve_async(settings: Settings, host: str = "127.0.0.1", port: int = 8000) -> None:
    """The same, inside a running event loop (``skilljobs up`` runs it next to a worker)."""
    await uvicorn.Server(build_config(settings, host, port)).serve()
