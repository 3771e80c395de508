"""The outbound fetcher: remote files into the job workspace without opening a way inside.

Every hop (the first request and each redirect) is vetted by ``urlsafety.check_url``, its name
resolved once, EVERY answer checked with ``check_ip``, and the connection then made to one of
the checked addresses by our own network backend — there is no second resolution inside the
HTTP stack, so a DNS answer that changes between check and connect (rebinding) is never used.
The URL keeps its host name, so the Host header, TLS SNI and certificate verification are for
the name. Environment proxies are ignored: a proxy must never become a way around the policy.

Seams for tests: ``resolver(host, port) -> [ip, ...]`` and ``connect(ip, port, timeout) ->
stream``; a test can make leaving this machine impossible by refusing non-loopback addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.cookiejar
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from delivery.net.pinned import (
    Connector,
    PinnedBackend,
    PinnedTransport,
    Resolver,
    direct_connect,
    system_resolver,
)
from delivery.net.urlsafety import RefusedURL, Target, check_ip, check_url
from jobs.media import choose_filename, guess_mime, mime_from_header, place_file

MAX_BYTES = 200 * 1024 * 1024
REDIRECT_CODES = {301, 302, 303, 307, 308}
CREDENTIAL_HEADERS = ("authorization", "cookie", "proxy-authorization")
USER_AGENT = "skilljobs-fetch/1"


__all__ = [
    "MAX_BYTES",
    "Download",
    "FetchError",
    "ProbeResult",
    "RefusedURL",
    "SafeFetcher",
    "direct_connect",
    "system_resolver",
]


class FetchError(Exception):
    """The fetch was allowed but did not work (HTTP status, size, timeout, network)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ProbeResult:
    content_type: str | None  # media type without parameters, lower case
    content_length: int | None
    final_url: str


@dataclass(frozen=True, slots=True)
class Download:
    path: Path
    filename: str
    mime: str
    size: int
    sha256: str
    source_url: str
    final_url: str = ""


class SafeFetcher:
    """Probe and download remote URLs under the outbound policy.

    ``allow_hosts``: operator allow-list (``host`` = any port, ``host:port`` = that port).
    ``verify``: TLS verification (True, or an ``ssl.SSLContext`` with extra trust anchors).
    Use as ``async with SafeFetcher(...) as f`` or call ``aclose()`` when done.
    """

    def __init__(
        self,
        allow_hosts: Iterable[str] = (),
        *,
        resolver: Resolver | None = None,
        connect: Connector | None = None,
        max_redirects: int = 3,
        timeout: float = 30.0,
        total_timeout: float = 900.0,
        verify: ssl.SSLContext | str | bool = True,
    ) -> None:
        self.allow_hosts = [h.strip().lower() for h in allow_hosts if h and h.strip()]
        self.max_redirects = max_redirects
        self.timeout = timeout
        self.total_timeout = total_timeout
        self._resolver = resolver or system_resolver
        self._backend = PinnedBackend(connect or direct_connect)
        self._verify = verify
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> SafeFetcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            no_cookies = http.cookiejar.CookieJar(
                policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
            )
            self._client = httpx.AsyncClient(
                transport=PinnedTransport(self._backend, self._verify),
                trust_env=False,
                follow_redirects=False,
                timeout=httpx.Timeout(self.timeout),
                cookies=no_cookies,  # no cookie carried from one job's fetch to another's
                headers={"User-Agent": USER_AGENT},
            )
        return self._client

    async def probe(self, url: str, *, headers: Mapping[str, str] | None = None) -> ProbeResult:
        """Content type and length of ``url`` (HEAD, falling back to a one-byte ranged GET)."""
        async with self._deadline(url):
            response = await self._open("HEAD", url, headers)
            await _close(response)
            if response.status_code in (403, 405, 501) or (
                response.is_success and "content-type" not in response.headers
            ):
                ranged = {**(headers or {}), "Range": "bytes=0-0"}
                response = await self._open("GET", url, ranged)
                await _close(response)
            if not response.is_success:
                raise FetchError(f"HTTP {response.status_code} from {response.url.host}")
            return ProbeResult(
                content_type=mime_from_header(response.headers.get("content-type")),
                content_length=_total_length(response),
                final_url=str(response.url),
            )

    async def download(
        self,
        url: str,
        dest_dir: Path,
        *,
        max_bytes: int = MAX_BYTES,
        filename_hint: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Download:
        """Stream ``url`` into ``dest_dir`` (atomically, size-capped); the file's record."""
        dest_dir = Path(dest_dir)
        await asyncio.to_thread(dest_dir.mkdir, parents=True, exist_ok=True)
        request_headers = {**(headers or {}), "Accept-Encoding": "identity"}
        async with self._deadline(url):
            response = await self._open("GET", url, request_headers)
            try:
                if not response.is_success:
                    raise FetchError(f"HTTP {response.status_code} from {response.url.host}")
                declared = _content_length(response)
                if declared is not None and declared > max_bytes:
                    raise FetchError(f"file too large: {declared} bytes (limit {max_bytes})")
                tmp, size, digest = await self._stream(response, dest_dir, max_bytes)
            finally:
                await _close(response)
        mime = mime_from_header(response.headers.get("content-type"))
        name = choose_filename(
            response.headers.get("content-disposition"), filename_hint, response.url.path, mime
        )
        try:
            path = await asyncio.to_thread(place_file, tmp, dest_dir, name)
        except BaseException as exc:
            await asyncio.to_thread(_unlink, tmp)
            if isinstance(exc, OSError):
                raise FetchError(f"cannot store {name}: {exc}") from exc
            raise
        return Download(
            path=path,
            filename=path.name,
            mime=mime or guess_mime(path.name),
            size=size,
            sha256=digest,
            source_url=str(url),
            final_url=str(response.url),
        )

    async def send(
        self,
        method: str,
        url: str | httpx.URL,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - httpx's per-request timeout
        **kwargs: Any,
    ) -> httpx.Response:
        """One request under the outbound policy (no redirect followed), streamed: the
        caller reads and closes the response. ``kwargs`` go to ``build_request`` (params,
        json, content). Raises ``RefusedURL`` or ``FetchError``."""
        client = self._http()
        target = check_url(url, self.allow_hosts)
        await self._vet(target)
        with _translated(target.host):
            request = client.build_request(
                method,
                target.url,
                headers=headers,
                timeout=httpx.Timeout(timeout) if timeout else httpx.USE_CLIENT_DEFAULT,
                **kwargs,
            )
            return await client.send(request, stream=True)

    async def _stream(
        self, response: httpx.Response, dest_dir: Path, max_bytes: int
    ) -> tuple[Path, int, str]:
        fd, name = tempfile.mkstemp(prefix=".part-", dir=dest_dir)
        tmp = Path(name)
        os.fchmod(fd, 0o644)
        sink = _FileSink(os.fdopen(fd, "wb"))
        size = 0
        try:
            with _translated(response.url.host):
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise FetchError(f"file too large: more than {max_bytes} bytes")
                    await sink.write(chunk)
            await sink.close()
        except BaseException:
            await sink.abort()
            await asyncio.to_thread(_unlink, tmp)
            raise
        return tmp, size, sink.hexdigest()

    async def _open(
        self, method: str, url: str | httpx.URL, headers: Mapping[str, str] | None
    ) -> httpx.Response:
        """Send ``method`` following redirects by hand; every hop is vetted and pinned."""
        client = self._http()
        current: str | httpx.URL = url
        hop_headers = dict(headers or {})
        for hop in range(self.max_redirects + 1):
            target = check_url(current, self.allow_hosts)
            await self._vet(target)
            with _translated(target.host):
                request = client.build_request(method, target.url, headers=hop_headers)
                response = await client.send(request, stream=True)
            location = response.headers.get("location")
            if response.status_code not in REDIRECT_CODES or not location:
                return response
            await _close(response)
            if hop == self.max_redirects:
                raise FetchError(f"too many redirects (more than {self.max_redirects})")
            try:
                following = target.url.join(location)
            except (httpx.InvalidURL, ValueError) as exc:
                raise RefusedURL(f"invalid redirect location: {exc}") from exc
            if _origin(following) != _origin(target.url):
                hop_headers = {
                    k: v for k, v in hop_headers.items() if k.lower() not in CREDENTIAL_HEADERS
                }
            current = following
        raise AssertionError("unreachable")  # pragma: no cover

    async def _vet(self, target: Target) -> None:
        """Resolve once, check every answer, pin the checked addresses for the connection."""
        if target.ip is not None:
            ips: list[str] = [str(target.ip)]
        else:
            try:
                async with asyncio.timeout(self.timeout):
                    answers = await self._resolver(target.host, target.port)
            except TimeoutError as exc:
                raise FetchError(f"resolving {target.host} timed out") from exc
            except OSError as exc:
                raise FetchError(f"cannot resolve {target.host}: {exc}") from exc
            ips = list(dict.fromkeys(str(a) for a in answers))
            if not ips:
                raise FetchError(f"no address for {target.host}")
        for ip in ips:
            try:
                if target.allow_listed:
                    ipaddress.ip_address(ip)
                else:
                    check_ip(ip)
            except ValueError as exc:
                raise RefusedURL(f"resolver answer {ip!r} is not an address") from exc
            except RefusedURL as exc:
                if target.ip is not None:
                    raise
                raise RefusedURL(f"{exc.reason} (resolved from {target.host})") from exc
        self._backend.pin(target.host, target.port, tuple(ips))

    @contextlib.asynccontextmanager
    async def _deadline(self, url: str | httpx.URL) -> Any:
        try:
            async with asyncio.timeout(self.total_timeout):
                yield
        except TimeoutError as exc:
            raise FetchError(f"gave up after {self.total_timeout:g} s: {url}") from exc


class _FileSink:
    """Writes and hashes each network chunk as it arrives.

    Chunks are at most one socket read (64 KiB with httpcore), so a write into the page cache
    plus a SHA-256 update costs tens of microseconds and never stalls the event loop
    noticeably; handing each chunk to a thread costs more than it saves (see bench/RESULTS.md,
    which also records the largest loop stall measured during a 200 MB download).
    """

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._hash = hashlib.sha256()

    async def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._hash.update(chunk)

    async def close(self) -> None:
        await asyncio.to_thread(self._file.close)  # close may flush; keep it off the loop

    async def abort(self) -> None:
        await asyncio.to_thread(self._file.close)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


@contextlib.contextmanager
def _translated(host: str) -> Iterator[None]:
    """httpx/httpcore errors become ``FetchError`` here, once."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise FetchError(f"timed out talking to {host}") from exc
    except httpx.ConnectError as exc:
        raise FetchError(f"could not connect to {host}: {exc}") from exc
    except httpx.InvalidURL as exc:
        raise RefusedURL(f"invalid URL: {exc}") from exc
    except httpx.HTTPError as exc:
        raise FetchError(f"{type(exc).__name__} from {host}: {exc}") from exc


async def _close(response: httpx.Response) -> None:
    # Closing only releases the connection; the outcome was decided before (a close error
    # must not replace the real error or turn a complete download into a failure).
    with contextlib.suppress(httpx.HTTPError):
        await response.aclose()


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))


def _content_length(response: httpx.Response) -> int | None:
    raw = response.headers.get("content-length", "").strip()
    return int(raw) if raw.isdigit() else None


def _total_length(response: httpx.Response) -> int | None:
    content_range = response.headers.get("content-range", "")
    if response.status_code == 206 and "/" in content_range:
        total = content_range.rsplit("/", 1)[1].strip()
        return int(total) if total.isdigit() else None
    return _content_length(response)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
