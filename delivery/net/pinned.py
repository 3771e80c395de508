"""The vetted-IP network layer under the fetcher: a resolver, a connector and an httpx
transport whose connections go to the address the policy checked, never to a second DNS
answer (no rebinding window), with TLS SNI and certificate checks for the host name.

Seams for tests: ``resolver(host, port) -> [ip, ...]`` and ``connect(ip, port, timeout) ->
stream``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpcore
import httpx

from delivery.net.urlsafety import RefusedURL

Resolver = Callable[[str, int], Awaitable[list[str]]]
Connector = Callable[[str, int, float | None], Awaitable[httpcore.AsyncNetworkStream]]


async def system_resolver(host: str, port: int) -> list[str]:
    """All addresses the system resolver gives for ``host`` (TCP), in its order."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def direct_connect(
    ip: str,
    port: int,
    timeout: float | None,  # noqa: ASYNC109 - httpcore's connect interface
) -> httpcore.AsyncNetworkStream:
    """Open a TCP connection to an already vetted address (numeric only: never a lookup)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            transport, protocol = await loop.create_connection(
                _StreamProtocol, ip, port, flags=socket.AI_NUMERICHOST
            )
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout(f"connecting to {ip}:{port} timed out") from exc
    except OSError as exc:
        raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
    return _AsyncioStream(transport, protocol)


class _StreamProtocol(asyncio.Protocol):
    """Receive buffer with flow control for ``_AsyncioStream``."""

    HIGH_WATER = 4 * 1024 * 1024
    LOW_WATER = 1024 * 1024

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.offset = 0  # already consumed from chunks[0]
        self.buffered = 0
        self.eof = False
        self.error: BaseException | None = None
        self.paused_reading = False
        self.waiter: asyncio.Future[None] | None = None
        self.drain_waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > self.HIGH_WATER and self.transport and not self.paused_reading:
            self.paused_reading = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> None:
        self.eof = True
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self.drain_waiter = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)
        self.drain_waiter = None

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def take(self, max_bytes: int) -> bytes:
        chunk = self.chunks[0]
        if self.offset == 0 and len(chunk) <= max_bytes:
            self.chunks.popleft()
            piece = chunk
        else:
            piece = chunk[self.offset : self.offset + max_bytes]
            self.offset += len(piece)
            if self.offset >= len(chunk):
                self.chunks.popleft()
                self.offset = 0
        self.buffered -= len(piece)
        if self.paused_reading and self.buffered < self.LOW_WATER and self.transport:
            self.paused_reading = False
            self.transport.resume_reading()
        return piece


class _AsyncioStream(httpcore.AsyncNetworkStream):
    """A lean asyncio stream for httpcore (the fetcher's hot path: one copy per read)."""

    def __init__(self, transport: asyncio.Transport, protocol: _StreamProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(
        self,
        max_bytes: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's stream interface
    ) -> bytes:
        p = self._protocol
        if not p.chunks and not p.eof:
            p.waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await p.waiter
            except TimeoutError as exc:
                raise httpcore.ReadTimeout("read timed out") from exc
            finally:
                p.waiter = None
        if p.chunks:
            return p.take(max_bytes)
        if p.error is not None:
            raise httpcore.ReadError(str(p.error) or type(p.error).__name__)
        return b""

    async def write(
        self,
        buffer: bytes,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's stream interface
    ) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError("connection closed")
        self._transport.write(buffer)
        waiter = self._protocol.drain_waiter
        if waiter is not None:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(waiter)
            except TimeoutError as exc:
                raise httpcore.WriteTimeout("write timed out") from exc

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's stream interface
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            transport = await loop.start_tls(
                self._transport,
                self._protocol,
                ssl_context,
                server_hostname=server_hostname,
                ssl_handshake_timeout=timeout,
            )
        except (TimeoutError, ssl.SSLError, OSError) as exc:
            self._transport.close()
            kind = (
                httpcore.ConnectTimeout if isinstance(exc, TimeoutError) else httpcore.ConnectError
            )
            raise kind(str(exc) or type(exc).__name__) from exc
        if transport is None:  # pragma: no cover - only when the connection closed meanwhile
            raise httpcore.ConnectError("connection closed during the TLS handshake")
        return _AsyncioStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle pooled connection that got data or EOF is stale
            return self._protocol.eof or bool(self._protocol.chunks)
        key = {"client_addr": "sockname", "server_addr": "peername"}.get(info, info)
        return self._transport.get_extra_info(key)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to addresses the fetcher vetted for that exact (host, port)."""

    def __init__(self, connect: Connector) -> None:
        self._connect = connect
        self._pins: dict[tuple[str, int], tuple[str, ...]] = {}

    def pin(self, host: str, port: int, ips: tuple[str, ...]) -> None:
        self._pins[(host.lower(), port)] = ips

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's backend interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        ips = self._pins.get((host.lower(), port))
        if not ips:  # never resolve here: only addresses checked by the policy are dialled
            raise RefusedURL(f"connection to unvetted host {host}:{port}")
        errors = []
        for ip in ips:
            try:
                return await self._connect(ip, port, timeout)
            except (OSError, httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                errors.append(f"{ip}: {exc or type(exc).__name__}")
        raise httpcore.ConnectError("; ".join(errors))

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's backend interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise RefusedURL("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@functools.cache
def _default_tls() -> ssl.SSLContext:
    """The system-trust TLS context, built once (loading the CA bundle takes ~0.1 s)."""
    return httpx.create_ssl_context(verify=True, trust_env=False)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx transport whose connection pool dials through the pinned backend."""

    def __init__(self, backend: PinnedBackend, verify: ssl.SSLContext | str | bool) -> None:
        # Not calling super().__init__: it would build a pool (and a TLS context) of its own;
        # everything else of AsyncHTTPTransport works on ``self._pool``.
        if verify is True:
            ssl_context = _default_tls()
        else:
            ssl_context = httpx.create_ssl_context(verify=verify, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=20,
            max_keepalive_connections=10,
            keepalive_expiry=5.0,
            network_backend=backend,
        )


__all__ = [
    "Connector",
    "PinnedBackend",
    "PinnedTransport",
    "Resolver",
    "direct_connect",
    "system_resolver",
]
