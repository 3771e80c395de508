"""SafeFetcher against real loopback HTTP/HTTPS servers.

No test here can send a packet off this machine: every fetcher is built with a connect seam
that records each address and refuses anything that is not loopback, and with a resolver
seam, so no DNS query leaves either. A "public" address in a
resolver answer is a stand-in that the seam routes to a loopback server (loopback in disguise),
so the policy runs with no exemption while the bytes stay local.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from delivery.net.fetch import FetchError, SafeFetcher
from delivery.net.urlsafety import RefusedURL
from tests.helpers.net import (
    PNG,
    PUBLIC_STANDIN,
    LocalPKI,
    LoopbackOnly,
    LoopbackServer,
    Reply,
    Request,
    Resolver,
    make_pki,
)


@pytest.fixture
async def server() -> AsyncIterator[LoopbackServer]:
    srv = await LoopbackServer().start()
    yield srv
    await srv.close()


@pytest.fixture
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPKI:
    return make_pki(tmp_path_factory.mktemp("pki"), ["media.example.com"])


@pytest.fixture
async def tls_server(pki: LocalPKI) -> AsyncIterator[LoopbackServer]:
    srv = await LoopbackServer(pki.server_context()).start()
    yield srv
    await srv.close()


@pytest.fixture
def guard() -> LoopbackOnly:
    return LoopbackOnly({PUBLIC_STANDIN: "127.0.0.1"})


@pytest.fixture
async def fetcher(server: LoopbackServer, guard: LoopbackOnly) -> AsyncIterator[SafeFetcher]:
    async with SafeFetcher(
        [f"127.0.0.1:{server.port}"], connect=guard, resolver=Resolver({}), timeout=5.0
    ) as f:
        yield f


FetchFactory = Callable[..., Awaitable[SafeFetcher]]


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# --- downloads -----------------------------------------------------------------------------


async def test_download_streams_to_a_named_file_with_digest(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    server.routes["/img/cat.png"] = Reply(body=PNG, headers={"Content-Type": "image/png"})
    got = await fetcher.download(server.url("/img/cat.png?sig=1"), tmp_path / "ws")
    assert got.path == tmp_path / "ws" / "cat.png"
    assert got.path.read_bytes() == PNG
    assert (got.filename, got.mime, got.size) == ("cat.png", "image/png", len(PNG))
    assert got.sha256 == hashlib.sha256(PNG).hexdigest()
    assert got.source_url == server.url("/img/cat.png?sig=1")
    assert files_in(tmp_path / "ws") == ["cat.png"]
    assert server.requests[0].headers["accept-encoding"] == "identity"


@pytest.mark.parametrize(
    ("path", "headers", "hint", "expected"),
    [
        (
            "/d",
            {"Content-Disposition": "attachment; filename*=UTF-8''%E6%8A%A5%E5%91%8A.pdf"},
            None,
            "报告.pdf",
        ),
        (
            "/d",
            {"Content-Disposition": "attachment; filename=\"a.txt\"; filename*=UTF-8''b%20c.txt"},
            None,
            "b c.txt",
        ),
        ("/d", {"Content-Disposition": 'attachment; filename="../../etc/passwd"'}, None, "passwd"),
        (
            "/d",
            {"Content-Disposition": 'attachment; filename="..\\\\..\\\\win.ini"'},
            None,
            "win.ini",
        ),
        ("/d", {"Content-Disposition": 'attachment; filename=".bashrc"'}, None, "bashrc"),
        ("/x/..%2F..%2Fescape.png", {}, None, "escape.png"),
        ("/x/%2e%2e", {"Content-Type": "image/png"}, None, "file.png"),
        ("/", {"Content-Type": "image/jpeg"}, None, "file.jpg"),
        ("/", {"Content-Type": "video/mp4"}, "clip", "clip.mp4"),
        ("/report", {"Content-Type": "application/pdf"}, None, "report.pdf"),
        ("/a%20b.png", {"Content-Type": "image/png"}, "../hint.gif", "hint.gif"),
    ],
)
async def test_filename_rules(
    server: LoopbackServer,
    fetcher: SafeFetcher,
    tmp_path: Path,
    path: str,
    headers: dict[str, str],
    hint: str | None,
    expected: str,
) -> None:
    server.routes[path] = Reply(body=b"data", headers=headers)
    got = await fetcher.download(server.url(path), tmp_path, filename_hint=hint)
    assert got.filename == expected
    assert got.path.parent == tmp_path
    assert files_in(tmp_path) == [expected]


async def test_same_name_is_deduplicated_never_overwritten(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    (tmp_path / "cat.png").write_bytes(b"mine")
    server.routes["/cat.png"] = Reply(body=PNG)
    first = await fetcher.download(server.url("/cat.png"), tmp_path)
    second = await fetcher.download(server.url("/cat.png"), tmp_path)
    assert (first.filename, second.filename) == ("cat-1.png", "cat-2.png")
    assert (tmp_path / "cat.png").read_bytes() == b"mine"


async def test_oversize_by_content_length_is_refused_before_reading(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    server.routes["/big.bin"] = Reply(body=b"x" * 5000)
    with pytest.raises(FetchError, match=r"file too large: 5000 bytes \(limit 1000\)"):
        await fetcher.download(server.url("/big.bin"), tmp_path, max_bytes=1000)
    assert files_in(tmp_path) == []


@pytest.mark.parametrize("length", ["omit", "chunked"])
async def test_oversize_while_streaming_leaves_no_partial_file(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path, length: str
) -> None:
    server.routes["/big.bin"] = Reply(body=b"x" * 3_000_000, length=length)
    with pytest.raises(FetchError, match="file too large: more than 1000000 bytes"):
        await fetcher.download(server.url("/big.bin"), tmp_path, max_bytes=1_000_000)
    assert files_in(tmp_path) == []


async def test_compressed_body_is_capped_after_decoding(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    bomb = gzip.compress(b"\0" * 5_000_000)
    assert len(bomb) < 10_000
    server.routes["/bomb"] = Reply(body=bomb, headers={"Content-Encoding": "gzip"})
    with pytest.raises(FetchError, match="file too large: more than 1000000 bytes"):
        await fetcher.download(server.url("/bomb"), tmp_path, max_bytes=1_000_000)
    assert files_in(tmp_path) == []


async def test_body_shorter_than_declared_fails_without_a_file(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    server.routes["/short"] = Reply(body=b"x" * 100, length="lie:5000")
    with pytest.raises(FetchError):
        await fetcher.download(server.url("/short"), tmp_path)
    assert files_in(tmp_path) == []


async def test_http_error_status_is_a_fetch_error(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    with pytest.raises(FetchError, match=re.escape("HTTP 404 from 127.0.0.1")):
        await fetcher.download(server.url("/missing.png"), tmp_path)
    assert files_in(tmp_path) == []


async def test_stalled_server_times_out(
    server: LoopbackServer, guard: LoopbackOnly, tmp_path: Path
) -> None:
    server.routes["/slow"] = Reply(body=b"late", stall=3.0)
    async with SafeFetcher(
        [f"127.0.0.1:{server.port}"], connect=guard, resolver=Resolver({}), timeout=0.3
    ) as f:
        with pytest.raises(FetchError, match="timed out"):
            await f.download(server.url("/slow"), tmp_path)
    assert files_in(tmp_path) == []


# --- probing ---------------------------------------------------------------------------------


async def test_probe_uses_head(server: LoopbackServer, fetcher: SafeFetcher) -> None:
    server.routes["/page"] = Reply(
        body=b"<html></html>", headers={"Content-Type": "text/html; charset=utf-8"}
    )
    got = await fetcher.probe(server.url("/page"))
    assert (got.content_type, got.content_length) == ("text/html", 13)
    assert [r.method for r in server.requests] == ["HEAD"]


async def test_probe_falls_back_to_a_ranged_get(
    server: LoopbackServer, fetcher: SafeFetcher
) -> None:
    def signed(request: Request) -> Reply:
        if request.method == "HEAD":  # presigned URLs are often signed for GET only
            return Reply(403, b"")
        assert request.headers["range"] == "bytes=0-0"
        return Reply(206, b"x", {"Content-Type": "video/mp4", "Content-Range": "bytes 0-0/9999"})

    server.routes["/v"] = signed
    got = await fetcher.probe(server.url("/v"))
    assert (got.content_type, got.content_length) == ("video/mp4", 9999)
    assert [r.method for r in server.requests] == ["HEAD", "GET"]


# --- the policy on the wire -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://169.254.169.254/latest/meta-data/", "cloud metadata address 169.254.169.254"),
        ("https://[::ffff:127.0.0.1]/", "loopback address 127.0.0.1"),
        ("https://10.0.0.1/", "private address 10.0.0.1"),
        ("http://cdn.example.com/a.png", "scheme http is not allowed"),
        ("https://u:p@cdn.example.com/a.png", "userinfo in URL"),
        ("https://metadata.google.internal/", "internal name metadata.google.internal"),
    ],
)
async def test_refused_urls_never_reach_the_network(
    guard: LoopbackOnly, tmp_path: Path, url: str, reason: str
) -> None:
    resolver = Resolver({})
    async with SafeFetcher([], resolver=resolver, connect=guard) as f:
        for call in (f.download(url, tmp_path), f.probe(url)):
            with pytest.raises(RefusedURL, match=re.escape(reason)):
                await call
    assert guard.attempts == [] and resolver.calls == []


async def test_loopback_port_not_on_the_allow_list_is_refused(
    server: LoopbackServer, guard: LoopbackOnly, tmp_path: Path
) -> None:
    async with SafeFetcher(
        [f"127.0.0.1:{server.port + 1}"], connect=guard, resolver=Resolver({})
    ) as f:
        with pytest.raises(RefusedURL, match="scheme http is not allowed"):
            await f.download(server.url("/a"), tmp_path)
    assert guard.attempts == []


async def test_every_dns_answer_is_checked(guard: LoopbackOnly, tmp_path: Path) -> None:
    resolver = Resolver({"cdn.example.com": [[PUBLIC_STANDIN, "10.0.0.5"]]})
    async with SafeFetcher([], resolver=resolver, connect=guard) as f:
        with pytest.raises(
            RefusedURL, match=re.escape("private address 10.0.0.5 (resolved from cdn.example.com)")
        ):
            await f.download("https://cdn.example.com/a.png", tmp_path)
    assert guard.attempts == []


async def test_dns_rebinding_connects_to_the_vetted_address(
    tls_server: LoopbackServer, pki: LocalPKI, guard: LoopbackOnly, tmp_path: Path
) -> None:
    """First answer public, any later answer loopback: only the vetted address is dialled."""
    tls_server.routes["/a.png"] = Reply(body=PNG, headers={"Content-Type": "image/png"})
    resolver = Resolver({"media.example.com": [[PUBLIC_STANDIN], ["127.0.0.1"], ["127.0.0.1"]]})
    url = f"https://media.example.com:{tls_server.port}/a.png"
    async with SafeFetcher([], resolver=resolver, connect=guard, verify=pki.client_context()) as f:
        got = await f.download(url, tmp_path)
    assert got.path.read_bytes() == PNG
    assert resolver.calls == ["media.example.com"]  # resolved once, never again
    assert guard.attempts == [(PUBLIC_STANDIN, tls_server.port)]
    request = tls_server.requests[0]
    assert request.headers["host"] == f"media.example.com:{tls_server.port}"
    assert request.sni == "media.example.com"


async def test_rebinding_to_a_private_answer_is_refused(
    guard: LoopbackOnly, tmp_path: Path
) -> None:
    resolver = Resolver({"media.example.com": [["127.0.0.1"], [PUBLIC_STANDIN]]})
    async with SafeFetcher([], resolver=resolver, connect=guard) as f:
        with pytest.raises(RefusedURL, match=re.escape("loopback address 127.0.0.1")):
            await f.download("https://media.example.com/a.png", tmp_path)
    assert guard.attempts == []


async def test_certificate_is_verified_for_the_host_name(
    tls_server: LoopbackServer, pki: LocalPKI, guard: LoopbackOnly, tmp_path: Path
) -> None:
    tls_server.routes["/a.png"] = Reply(body=PNG)
    resolver = Resolver({"other.example.net": [[PUBLIC_STANDIN]]})
    url = f"https://other.example.net:{tls_server.port}/a.png"
    async with SafeFetcher([], resolver=resolver, connect=guard, verify=pki.client_context()) as f:
        with pytest.raises(FetchError, match="certificate"):
            await f.download(url, tmp_path)
    async with SafeFetcher([], resolver=resolver, connect=guard) as f:  # system trust only
        with pytest.raises(FetchError, match="certificate"):
            await f.download(url, tmp_path)
    assert files_in(tmp_path) == []


async def test_connect_seam_refusal_is_a_fetch_error(guard: LoopbackOnly, tmp_path: Path) -> None:
    resolver = Resolver({"cdn.example.com": [["8.8.8.8"]]})
    async with SafeFetcher([], resolver=resolver, connect=guard) as f:
        with pytest.raises(FetchError, match=re.escape("could not connect to cdn.example.com")):
            await f.download("https://cdn.example.com/a.png", tmp_path)
    assert guard.refused == ["8.8.8.8"]


async def test_redirect_to_a_private_address_is_refused(
    server: LoopbackServer, fetcher: SafeFetcher, guard: LoopbackOnly, tmp_path: Path
) -> None:
    server.routes["/r"] = Reply(302, headers={"Location": "https://10.0.0.1/secret"})
    with pytest.raises(RefusedURL, match=re.escape("private address 10.0.0.1")):
        await fetcher.download(server.url("/r"), tmp_path)
    server.routes["/r2"] = Reply(301, headers={"Location": "http://169.254.169.254/latest"})
    with pytest.raises(RefusedURL, match="scheme http is not allowed"):
        await fetcher.probe(server.url("/r2"))
    assert {ip for ip, _ in guard.attempts} == {"127.0.0.1"}
    assert files_in(tmp_path) == []


async def test_redirect_to_a_name_resolving_privately_is_refused(
    server: LoopbackServer, guard: LoopbackOnly, tmp_path: Path
) -> None:
    server.routes["/r"] = Reply(307, headers={"Location": "https://rebind.example.org/x"})
    resolver = Resolver({"rebind.example.org": [["192.168.0.10"]]})
    async with SafeFetcher([f"127.0.0.1:{server.port}"], resolver=resolver, connect=guard) as f:
        with pytest.raises(RefusedURL, match=re.escape("private address 192.168.0.10")):
            await f.download(server.url("/r"), tmp_path)
    assert resolver.calls == ["rebind.example.org"]


async def test_redirects_are_limited(server: LoopbackServer, fetcher: SafeFetcher) -> None:
    server.routes["/loop"] = Reply(302, headers={"Location": "/loop"})
    with pytest.raises(FetchError, match=re.escape("too many redirects (more than 3)")):
        await fetcher.probe(server.url("/loop"))
    assert len(server.requests) == 4


async def test_cross_origin_redirect_drops_credentials(
    server: LoopbackServer, guard: LoopbackOnly, tmp_path: Path
) -> None:
    other = await LoopbackServer().start()
    try:
        server.routes["/same"] = Reply(302, headers={"Location": "/a.png"})
        server.routes["/a.png"] = Reply(302, headers={"Location": other.url("/b.png")})
        other.routes["/b.png"] = Reply(body=PNG)
        allow = [f"127.0.0.1:{server.port}", f"127.0.0.1:{other.port}"]
        creds = {"Authorization": "Bearer s3cret", "Cookie": "session=1"}
        async with SafeFetcher(allow, connect=guard, resolver=Resolver({})) as f:
            got = await f.download(server.url("/same"), tmp_path, headers=creds)
        assert got.path.read_bytes() == PNG
        first, same_origin = server.requests
        assert first.headers["authorization"] == same_origin.headers["authorization"]
        assert same_origin.headers["cookie"] == "session=1"
        (cross,) = other.requests
        assert "authorization" not in cross.headers and "cookie" not in cross.headers
    finally:
        await other.close()


async def test_environment_proxies_are_ignored(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await LoopbackServer().start()
    try:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
            monkeypatch.setenv(name, proxy.origin)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        server.routes["/a.png"] = Reply(body=PNG)
        got = await fetcher.download(server.url("/a.png"), tmp_path)
        assert got.size == len(PNG)
        assert proxy.requests == [] and len(server.requests) == 1
    finally:
        await proxy.close()


async def test_cookies_set_by_one_fetch_are_not_sent_by_the_next(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    server.routes["/a"] = Reply(body=b"1", headers={"Set-Cookie": "track=1; Path=/"})
    await fetcher.download(server.url("/a"), tmp_path)
    await fetcher.download(server.url("/a"), tmp_path)
    assert all("cookie" not in r.headers for r in server.requests)


async def test_whole_download_has_a_deadline(
    server: LoopbackServer, guard: LoopbackOnly, tmp_path: Path
) -> None:
    server.routes["/slow"] = Reply(body=b"late", stall=3.0)
    allow = [f"127.0.0.1:{server.port}"]
    async with SafeFetcher(
        allow, connect=guard, resolver=Resolver({}), timeout=10.0, total_timeout=0.3
    ) as f:
        with pytest.raises(FetchError, match=r"gave up after 0\.3 s"):
            await f.download(server.url("/slow"), tmp_path)
    assert files_in(tmp_path) == []


async def test_keep_alive_connections_are_reused_for_the_same_vetted_host(
    guard: LoopbackOnly, tmp_path: Path
) -> None:
    server = await LoopbackServer(keep_alive=True).start()
    try:
        server.routes["/a.png"] = Reply(body=PNG, headers={"Content-Type": "image/png"})
        server.routes["/c.txt"] = Reply(body=b"x" * 100_000, length="chunked")
        async with SafeFetcher(
            [f"127.0.0.1:{server.port}"], connect=guard, resolver=Resolver({})
        ) as f:
            for path in ("/a.png", "/c.txt", "/a.png"):
                got = await f.download(server.url(path), tmp_path)
                assert got.size in (len(PNG), 100_000)
            await f.probe(server.url("/a.png"))
        assert len(server.requests) == 4
        assert server.connections == 1 and len(guard.attempts) == 1
    finally:
        await server.close()


async def test_the_transport_never_dials_an_unvetted_host(guard: LoopbackOnly) -> None:
    async with SafeFetcher([], connect=guard, resolver=Resolver({})) as f:
        with pytest.raises(
            RefusedURL, match=re.escape("connection to unvetted host evil.example.com:443")
        ):
            await f._backend.connect_tcp("evil.example.com", 443)
    assert guard.attempts == []


async def test_allow_listed_name_uses_the_system_resolver_and_tries_each_address(
    server: LoopbackServer, guard: LoopbackOnly, tmp_path: Path
) -> None:
    # "localhost" comes from the hosts file (no query leaves the machine); it may list ::1
    # first, where nothing listens: the next vetted address is tried.
    server.routes["/a.png"] = Reply(body=PNG)
    async with SafeFetcher(["localhost"], connect=guard) as f:
        got = await f.download(f"http://localhost:{server.port}/a.png", tmp_path)
    assert got.size == len(PNG)
    assert ("127.0.0.1", server.port) in guard.attempts
    assert server.requests[0].headers["host"] == f"localhost:{server.port}"
