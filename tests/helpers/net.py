"""Loopback HTTP/HTTPS servers, a throw-away PKI and the network seams of the outbound-fetch
tests: nothing built with them can send a packet off this machine."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpcore
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from delivery.net.fetch import direct_connect

PUBLIC_STANDIN = "93.184.215.14"  # public, so the policy accepts it; never dialled for real


# --- a small real HTTP/1.1 server --------------------------------------------------------


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    sni: str | None = None

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    length: str = "exact"  # exact | omit (close-delimited) | chunked | lie:<n>
    stall: float = 0.0  # seconds to wait after the headers


Route = Reply | Callable[[Request], Reply]


class LoopbackServer:
    """An asyncio HTTP/1.1 server on 127.0.0.1 (optionally TLS) with canned routes."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None, keep_alive: bool = False) -> None:
        self.ssl_context = ssl_context
        self.keep_alive = keep_alive
        self.connections = 0
        self._handlers: set[asyncio.Task[None]] = set()
        self.routes: dict[str, Route] = {}
        self.requests: list[Request] = []
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._last_sni: str | None = None
        if ssl_context is not None:
            ssl_context.sni_callback = self._remember_sni

    def _remember_sni(self, sock: object, name: str | None, ctx: object) -> None:
        self._last_sni = name

    @property
    def origin(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.origin + path

    async def start(self) -> LoopbackServer:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", 0, ssl=self.ssl_context
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *lines = head.decode("latin-1").split("\r\n")
                method, target, _ = line.split(" ", 2)
                headers = {}
                for raw in lines:
                    if ":" in raw:
                        k, v = raw.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                request = Request(method, target, headers, self._last_sni)
                self.requests.append(request)
                route = self.routes.get(target) or self.routes.get(request.path)
                reply = route(request) if callable(route) else route or Reply(404, b"not found")
                await self._send(writer, method, reply)
                if not (self.keep_alive and reply.length in ("exact", "chunked")):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, ssl.SSLError):
                pass

    async def _send(self, writer: asyncio.StreamWriter, method: str, reply: Reply) -> None:
        head = [f"HTTP/1.1 {reply.status} X"]
        if not self.keep_alive:
            head.append("Connection: close")
        head += [f"{k}: {v}" for k, v in reply.headers.items()]
        if reply.length == "exact":
            head.append(f"Content-Length: {len(reply.body)}")
        elif reply.length == "chunked":
            head.append("Transfer-Encoding: chunked")
        elif reply.length.startswith("lie:"):
            head.append(f"Content-Length: {reply.length[4:]}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        if reply.stall:
            await asyncio.sleep(reply.stall)
        if method == "HEAD":
            return
        step = 64 * 1024
        for i in range(0, len(reply.body), step):
            piece = reply.body[i : i + step]
            if reply.length == "chunked":
                piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
            writer.write(piece)
            await writer.drain()
        if reply.length == "chunked":
            writer.write(b"0\r\n\r\n")
            await writer.drain()


# --- seams: resolver answers and a connect that cannot leave the machine ----------------


class LoopbackOnly:
    """Connect seam: records every address; dials loopback only (stand-ins mapped to it)."""

    def __init__(self, standins: dict[str, str] | None = None) -> None:
        self.standins = standins or {}
        self.attempts: list[tuple[str, int]] = []
        self.refused: list[str] = []

    async def __call__(
        self,
        ip: str,
        port: int,
        timeout: float | None,  # noqa: ASYNC109 - the fetcher's connect seam
    ) -> httpcore.AsyncNetworkStream:
        self.attempts.append((ip, port))
        real = self.standins.get(ip, ip)
        if not ipaddress.ip_address(real).is_loopback:
            self.refused.append(ip)
            raise ConnectionRefusedError(f"test seam: {ip} is not loopback")
        return await direct_connect(real, port, timeout)


class Resolver:
    """Resolver seam: a queue of answers per name; records every lookup."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        queue = self.answers.get(host)
        if not queue:
            raise OSError(f"test resolver: no answer for {host}")
        return queue.pop(0) if len(queue) > 1 else queue[0]


# --- a throw-away CA and a certificate for a public-looking name -----------------------


@dataclass
class LocalPKI:
    ca_pem: bytes
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())


def make_pki(folder: Path, names: list[str]) -> LocalPKI:
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "skilljobs test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = folder / "leaf.pem", folder / "leaf.key"
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return LocalPKI(ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file)


# --- fixtures -----------------------------------------------------------------------------


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40
