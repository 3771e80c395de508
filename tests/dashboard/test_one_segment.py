"""A response's head and body leave the server in one write (``dashboard.server.OneSegment``),
through uvicorn's real httptools protocol with the guards, on real loopback sockets, under
both event loops the servers run on. The transport below the wrapper counts the writes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn
import uvloop

from dashboard.server import OneSegment, protocol_class
from jobs.cli.embedded import free_port


class Counting:
    """The real transport, with every write it is handed recorded."""

    def __init__(self, transport: asyncio.Transport, log: list[bytes]) -> None:
        self._transport = transport
        self.log = log

    def write(self, data: bytes) -> None:
        self.log.append(bytes(data))
        self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        data = b"".join(lines)
        self.log.append(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class App:
    """``/small``: a JSON answer; ``/late``: the head, then the body once ``release`` is
    set; ``/close``: an answer with ``connection: close``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.head_sent = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (msg := await receive())["type"] != "lifespan.shutdown":
                await send({"type": msg["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b'{"ok":true}'
        headers = [(b"content-type", b"application/json")]
        if scope["path"] == "/late":
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            self.head_sent.set()
            await self.release.wait()
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        headers.append((b"content-length", str(len(body)).encode()))
        if scope["path"] == "/close":
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


@asynccontextmanager
async def serving(app: App, writes: list[bytes]) -> AsyncIterator[int]:
    guarded = protocol_class(10.0, 100)

    class Recorded(guarded):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(Counting(transport, writes))  # type: ignore[arg-type]

    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=Recorded, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await task


async def _read_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    return await asyncio.wait_for(reader.readuntil(marker), 5)


def _run(kind: str, coro: Any) -> None:
    if kind == "uvloop":
        uvloop.run(coro)
    else:
        asyncio.run(coro)


def test_head_and_body_leave_in_one_write(loop_kind: str) -> None:
    async def go() -> None:
        writes: list[bytes] = []
        async with serving(App(), writes) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(3):  # keep-alive: one write per response, each time
                writer.write(b"GET /small HTTP/1.1\r\nhost: localhost\r\n\r\n")
                head = await _read_until(reader, b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 OK\r\n")
                assert await asyncio.wait_for(reader.readexactly(11), 5) == b'{"ok":true}'
            writer.close()
        assert len(writes) == 3
        assert all(
            w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b'{"ok":true}') for w in writes
        )

    _run(loop_kind, go())


def test_a_head_whose_body_is_late_is_not_held_back(loop_kind: str) -> None:
    async def go() -> None:
        writes: list[bytes] = []
        app = App()
        async with serving(app, writes) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /late HTTP/1.1\r\nhost: localhost\r\n\r\n")
            await asyncio.wait_for(app.head_sent.wait(), 5)
            # the body has not been sent: the head reaches the client on its own
            head = await _read_until(reader, b"\r\n\r\n")
            assert b"transfer-encoding: chunked" in head
            app.release.set()
            rest = await _read_until(reader, b"0\r\n\r\n")
            assert b'{"ok":true}' in rest
            writer.close()
        assert writes[0] == head  # the head alone, then the chunks
        assert b"".join(writes[1:]) == rest

    _run(loop_kind, go())


def test_connection_close_sends_the_whole_answer_then_closes(loop_kind: str) -> None:
    async def go() -> None:
        writes: list[bytes] = []
        async with serving(App(), writes) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /close HTTP/1.1\r\nhost: localhost\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(-1), 5)  # until the server closes
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert answer.endswith(b'{"ok":true}')
            writer.close()
        assert writes == [answer]

    _run(loop_kind, go())


def test_writes_after_the_peer_left_are_dropped_quietly(loop_kind: str) -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        received: list[bytes] = []
        ready: asyncio.Future[asyncio.Transport] = loop.create_future()

        class Peer(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                ready.set_result(transport)

            def data_received(self, data: bytes) -> None:
                received.append(data)

        a, b = socket.socketpair()
        transport, _ = await loop.create_connection(asyncio.Protocol, sock=a)
        await loop.create_connection(Peer, sock=b)
        peer = await ready
        wrapped = OneSegment(transport, loop)  # type: ignore[arg-type]
        wrapped.write(b"head ")
        assert wrapped.get_write_buffer_size() == 5  # held, counted
        wrapped.write(b"body")
        await asyncio.sleep(0.05)
        assert b"".join(received) == b"head body"
        wrapped.write(b"held")
        wrapped.abort()  # dropped with the connection, never written
        await asyncio.sleep(0.05)
        assert b"".join(received) == b"head body"
        assert wrapped.is_closing()
        peer.close()

    _run(loop_kind, go())
