"""materialize() against a real loopback server; the connect seam keeps every test local."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from delivery.materialize import materialize, text_links
from delivery.net.fetch import SafeFetcher
from tests.helpers.net import PNG, LoopbackOnly, LoopbackServer, Reply, Resolver

PDF = b"%PDF-1.7\n" + b"0" * 2000
MP4 = b"\0\0\0\x18ftypisom\0\0\x02\0isomiso2" + b"\0" * 3000
HTML = Reply(body=b"<!doctype html><p>hi</p>", headers={"Content-Type": "text/html"})
JSON = Reply(body=b'{"a": 1}', headers={"Content-Type": "application/json"})


@pytest.fixture
async def server() -> AsyncIterator[LoopbackServer]:
    srv = await LoopbackServer().start()
    srv.routes.update(
        {
            "/a.png": Reply(body=PNG, headers={"Content-Type": "image/png"}),
            "/b.png": Reply(body=PNG + b"b", headers={"Content-Type": "image/png"}),
            "/doc": Reply(body=PDF, headers={"Content-Type": "application/pdf"}),
            "/clip": Reply(body=MP4, headers={"Content-Type": "video/mp4"}),
            "/page": HTML,
            "/api": JSON,
        }
    )
    yield srv
    await srv.close()


@pytest.fixture
def guard() -> LoopbackOnly:
    return LoopbackOnly()


@pytest.fixture
def resolver() -> Resolver:
    return Resolver({"cdn.example.com": [["127.0.0.1"]]})


@pytest.fixture
async def fetcher(
    server: LoopbackServer, guard: LoopbackOnly, resolver: Resolver
) -> AsyncIterator[SafeFetcher]:
    async with SafeFetcher(
        [f"127.0.0.1:{server.port}"], resolver=resolver, connect=guard, timeout=5.0
    ) as f:
        yield f


def by_url(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["url"]: r for r in records}


def requests_of(server: LoopbackServer) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in server.requests]


def read(path: str) -> bytes:
    return Path(path).read_bytes()


def is_file(path: str) -> bool:
    return Path(path).is_file()


def ws_files(ws: Path) -> list[str]:
    return sorted(p.name for p in ws.iterdir()) if ws.exists() else []


async def test_explicit_fields_are_downloaded_without_probing(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    result = {
        "success": True,
        "image_url": server.url("/a.png"),
        "video_urls": [server.url("/clip")],
        "download_url": server.url("/page"),  # explicit: downloaded even though it is HTML
    }
    out, records = await materialize(result, tmp_path, fetcher)

    assert all(method == "GET" for method, _ in requests_of(server))
    assert {r["status"] for r in records} == {"downloaded"}
    assert by_url(records)[server.url("/a.png")]["field"] == "image_url"
    # originals kept, files added with local_path + source_url
    assert out["image_url"] == result["image_url"] and out["video_urls"] == result["video_urls"]
    (image,) = out["images"]
    assert image["source_url"] == server.url("/a.png")
    assert read(image["local_path"]) == PNG
    assert image["sha256"] == hashlib.sha256(PNG).hexdigest()
    assert (image["media"], image["mime"]) == ("image", "image/png")
    (video,) = out["videos"]
    assert (video["media"], video["filename"]) == ("video", "clip.mp4")
    (page,) = out["files"]
    assert page["filename"] == "page.html"
    assert "images" not in result  # the input is not modified
    assert by_url(records)[server.url("/a.png")]["artifact"] == image["local_path"]


async def test_media_protocol_fields_are_explicit(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    """``mediaUrl`` / ``mediaUrls`` of the outbound media protocol are downloaded without a
    probe, and the file's kind comes from its bytes."""
    result = {"ok": True, "mediaUrl": server.url("/a.png"), "mediaUrls": [server.url("/clip")]}
    out, records = await materialize(result, tmp_path, fetcher)
    assert all(method == "GET" for method, _ in requests_of(server))
    assert {r["status"] for r in records} == {"downloaded"}
    assert by_url(records)[server.url("/a.png")]["field"] == "mediaUrl"
    (image,) = out["images"]
    assert read(image["local_path"]) == PNG and image["media"] == "image"
    (video,) = out["videos"]
    assert video["media"] == "video"


async def test_ambiguous_fields_are_probed_and_pages_skipped(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    result = {
        "url": server.url("/page"),
        "link": server.url("/api"),
        "src": server.url("/a.png"),
        "file": server.url("/doc"),
        "image": "local.png",  # not a URL: not considered
    }
    out, records = await materialize(result, tmp_path, fetcher)
    got = by_url(records)
    assert len(records) == 4
    assert got[server.url("/page")]["status"] == "skipped"
    assert got[server.url("/page")]["reason"] == "not a file (text/html)"
    assert got[server.url("/api")]["reason"] == "not a file (application/json)"
    assert got[server.url("/a.png")]["status"] == "downloaded"
    assert got[server.url("/doc")]["status"] == "downloaded"
    assert [f["filename"] for f in out["files"]] == ["doc.pdf"]
    assert [i["filename"] for i in out["images"]] == ["a.png"]
    assert ("GET", "/page") not in requests_of(server)
    assert ("GET", "/api") not in requests_of(server)
    assert ws_files(tmp_path) == ["a.png", "doc.pdf"]


async def test_links_in_text_and_markdown_images(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    message = (
        f"Report: {server.url('/doc')}. Chart: ![chart]({server.url('/a.png')}) "
        f"(details at {server.url('/page')})"
    )
    out, records = await materialize({"message": message}, tmp_path, fetcher)
    assert out["message"] == message
    statuses = {r["url"]: r["status"] for r in records}
    assert statuses == {
        server.url("/doc"): "downloaded",
        server.url("/a.png"): "downloaded",
        server.url("/page"): "skipped",
    }
    assert {r["field"] for r in records} == {"message"}


def test_text_link_extraction() -> None:
    text = (
        'see https://a.example.com/x.png, and ![i](https://b.example.com/y.jpg "t") '
        "<https://c.example.com/z>; https://en.example.org/wiki/A_(b) and http://d.example.com/q?x=1."
    )
    assert text_links(text) == [
        "https://a.example.com/x.png",
        "https://b.example.com/y.jpg",
        "https://c.example.com/z",
        "https://en.example.org/wiki/A_(b)",
        "http://d.example.com/q?x=1",
    ]


async def test_at_most_eight_ambiguous_links_are_probed(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    for i in range(11):
        server.routes[f"/img{i}"] = Reply(body=PNG, headers={"Content-Type": "image/png"})
    text = " ".join(server.url(f"/img{i}") for i in range(10))
    result = {"text": text, "url": server.url("/img10"), "image_url": server.url("/a.png")}
    out, records = await materialize(result, tmp_path, fetcher)
    heads = [path for method, path in requests_of(server) if method == "HEAD"]
    assert len(heads) == 8
    assert "/a.png" not in heads  # explicit fields never use up a probe
    skipped = [r for r in records if r["status"] == "skipped"]
    assert len(skipped) == 3
    assert {r["reason"] for r in skipped} == {"probe limit (8) reached"}
    assert sum(r["status"] == "downloaded" for r in records) == 9
    assert len(out["images"]) == 9


async def test_media_lists_are_downloaded_in_place(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    result = {
        "images": [server.url("/a.png"), {"url": server.url("/b.png"), "caption": "B"}],
        "media": [{"type": "video", "url": server.url("/clip")}],
        "files": server.url("/doc"),
    }
    out, records = await materialize(result, tmp_path, fetcher)
    assert [r["status"] for r in records] == ["downloaded"] * 4
    first, second = out["images"]
    assert first["url"] == server.url("/a.png") and is_file(first["local_path"])
    assert second["caption"] == "B" and second["url"] == server.url("/b.png")
    assert read(second["local_path"]) == PNG + b"b"
    (clip,) = out["media"]
    assert clip["type"] == "video" and clip["local_path"].endswith("clip.mp4")
    (doc,) = out["files"]
    assert doc["url"] == server.url("/doc") and doc["filename"] == "doc.pdf"


async def test_running_twice_downloads_nothing_new(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    result = {
        "image_url": server.url("/a.png"),
        "images": [server.url("/b.png")],
        "media": [{"url": server.url("/clip"), "type": "video"}],
    }
    once, _ = await materialize(result, tmp_path, fetcher)
    files_after_once = ws_files(tmp_path)
    seen = len(server.requests)
    twice, records = await materialize(once, tmp_path, fetcher)
    assert len(server.requests) == seen
    assert ws_files(tmp_path) == files_after_once
    assert twice == once
    assert {(r["status"], r["reason"]) for r in records} == {("skipped", "already downloaded")}
    assert all(is_file(r["artifact"]) for r in records)


async def test_entry_with_existing_local_path_is_skipped(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    (tmp_path / "have.png").write_bytes(PNG)
    result = {
        "images": [{"url": server.url("/a.png"), "local_path": "have.png"}],
        "videos": [{"url": server.url("/clip"), "local_path": str(tmp_path / "gone.mp4")}],
    }
    out, records = await materialize(result, tmp_path, fetcher)
    assert requests_of(server) == [("GET", "/clip")]
    got = by_url(records)
    assert got[server.url("/a.png")]["status"] == "skipped"
    assert got[server.url("/clip")]["status"] == "downloaded"
    assert out["videos"][0]["local_path"] == str(tmp_path / "clip.mp4")


async def test_failures_are_recorded_and_never_fail_the_job(
    server: LoopbackServer, fetcher: SafeFetcher, guard: LoopbackOnly, tmp_path: Path
) -> None:
    result = {
        "image_urls": [
            "https://10.0.0.1/x.png",
            "http://example.com/a.png",
            "https://cdn.example.com/a.png",  # resolves to loopback
            server.url("/missing.png"),
            server.url("/a.png"),
        ],
        "file_url": "ftp://files.example.com/a.zip",
    }
    out, records = await materialize(result, tmp_path, fetcher)
    got = by_url(records)
    assert got["https://10.0.0.1/x.png"] == {
        "url": "https://10.0.0.1/x.png",
        "field": "image_urls",
        "status": "refused",
        "reason": "private address 10.0.0.1",
        "artifact": None,
    }
    assert got["http://example.com/a.png"]["reason"] == "scheme http is not allowed"
    assert got["https://cdn.example.com/a.png"]["status"] == "refused"
    assert got["https://cdn.example.com/a.png"]["reason"] == (
        "loopback address 127.0.0.1 (resolved from cdn.example.com)"
    )
    assert got["ftp://files.example.com/a.zip"]["reason"] == "scheme ftp is not allowed"
    assert got[server.url("/missing.png")]["status"] == "failed"
    assert got[server.url("/missing.png")]["reason"] == "HTTP 404 from 127.0.0.1"
    assert got[server.url("/a.png")]["status"] == "downloaded"
    assert len(out["images"]) == 1
    assert {ip for ip, _ in guard.attempts} == {"127.0.0.1"}
    assert ws_files(tmp_path) == ["a.png"]


async def test_oversize_file_fails_alone(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    server.routes["/huge"] = Reply(body=b"x" * 50_000, length="omit")
    result = {"file_url": server.url("/huge"), "image_url": server.url("/a.png")}
    _out, records = await materialize(result, tmp_path, fetcher, max_bytes=20_000)
    got = by_url(records)
    assert got[server.url("/huge")]["status"] == "failed"
    assert "file too large" in got[server.url("/huge")]["reason"]
    assert ws_files(tmp_path) == ["a.png"]


async def test_same_url_twice_is_fetched_once(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    url = server.url("/a.png")
    result = {"image_url": url, "message": f"here: {url}", "images": [url]}
    out, records = await materialize(result, tmp_path, fetcher)
    assert requests_of(server) == [("GET", "/a.png")]
    assert records == [
        {
            "url": url,
            "field": "image_url",
            "status": "downloaded",
            "reason": "",
            "artifact": str(tmp_path / "a.png"),
        }
    ]
    assert len(out["images"]) == 1 and out["images"][0]["url"] == url
    assert ws_files(tmp_path) == ["a.png"]


async def test_result_without_urls_is_unchanged(fetcher: SafeFetcher, tmp_path: Path) -> None:
    result = {"success": True, "message": "no links", "filename": "out.png", "rows": [1, 2]}
    out, records = await materialize(result, tmp_path, fetcher)
    assert out == result and records == []
    assert await materialize(None, tmp_path, fetcher) == (None, [])  # type: ignore[arg-type]


async def test_downloads_per_result_are_capped(
    server: LoopbackServer, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    for i in range(55):
        server.routes[f"/f{i}.txt"] = Reply(body=b"%d" % i)
    urls = [server.url(f"/f{i}.txt") for i in range(55)]
    out, records = await materialize({"file_urls": urls}, tmp_path, fetcher)
    assert [r["status"] for r in records] == ["downloaded"] * 50 + ["skipped"] * 5
    assert records[-1]["reason"] == "download limit (50) reached"
    assert len(out["files"]) == 50 and len(ws_files(tmp_path)) == 50
