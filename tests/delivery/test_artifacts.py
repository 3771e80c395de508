"""Artifact registration on real files: local_path fill, sniffing, workspace confinement, backfill."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest

from delivery.artifacts import ArtifactInfo, acollect, backfill, collect, fill_local_path
from jobs.media import sniff

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
JPEG = b"\xff\xd8\xff\xe0\0\x10JFIF\0" + b"\0" * 64


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# --- local_path fill ---------------------------------------------------------------------


def test_fill_local_path_from_filename_only(ws: Path) -> None:
    result = {"success": True, "filename": "report.pdf"}
    out = fill_local_path(result, ws)
    assert out["local_path"] == str(ws / "report.pdf")
    assert "local_path" not in result
    kept = {"filename": "a.png", "local_path": "/elsewhere/b.png"}
    assert fill_local_path(kept, ws) == kept
    assert fill_local_path({"message": "x"}, ws) == {"message": "x"}
    assert fill_local_path({"filename": "  "}, ws) == {"filename": "  "}


# --- sniffing -------------------------------------------------------------------------------


def _docx_bytes(tmp: Path) -> bytes:
    path = tmp / "d.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", "<w:document/>")
    return path.read_bytes()


MAGIC = [
    ("a.bin", PNG, "image", "image/png"),
    ("a.bin", JPEG, "image", "image/jpeg"),
    ("a.bin", b"GIF89a" + b"\0" * 20, "image", "image/gif"),
    ("a.bin", b"RIFF\0\0\0\0WEBPVP8 " + b"\0" * 20, "image", "image/webp"),
    (
        "a.bin",
        b"BM" + b"\x36\0\0\0" + b"\0\0\0\0" + b"\x36\0\0\0" + b"\0" * 20,
        "image",
        "image/bmp",
    ),
    ("a.txt", b"\0\0\0\x20ftypisom\0\0\x02\0isomiso2avc1mp41", "video", "video/mp4"),
    ("a.bin", b"\0\0\0\x14ftypqt  \0\0\0\0qt  ", "video", "video/quicktime"),
    ("a.bin", b"\0\0\0\x1cftypM4A \0\0\0\0M4A isom", "audio", "audio/mp4"),
    ("a.bin", b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\x82\x84webm", "video", "video/webm"),
    (
        "a.bin",
        b"\x1a\x45\xdf\xa3\xa3\x42\x86\x81\x01\x42\x82\x88matroska",
        "video",
        "video/x-matroska",
    ),
    ("a.bin", b"ID3\x04\0\0\0\0\0\0" + b"\0" * 20, "audio", "audio/mpeg"),
    ("a.bin", b"\xff\xfb\x90\x64" + b"\0" * 20, "audio", "audio/mpeg"),
    ("a.bin", b"OggS\0\x02" + b"\0" * 22 + b"\x01vorbis", "audio", "audio/ogg"),
    ("a.bin", b"OggS\0\x02" + b"\0" * 22 + b"OpusHead", "audio", "audio/opus"),
    ("a.bin", b"RIFF\0\0\0\0WAVEfmt " + b"\0" * 20, "audio", "audio/wav"),
    ("a.bin", b"fLaC\0\0\0\x22" + b"\0" * 20, "audio", "audio/flac"),
    ("a.png", b"%PDF-1.4\n%...", "file", "application/pdf"),
    ("a.bin", b"PK\x03\x04" + b"\0" * 40, "file", "application/zip"),
    ("a.bin", b"\x1f\x8b\x08\0" + b"\0" * 20, "file", "application/gzip"),
    (
        "a.png",
        b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>',
        "file",
        "image/svg+xml",
    ),
]


@pytest.mark.parametrize(("name", "data", "media", "mime"), MAGIC)
def test_sniff_trusts_magic_bytes_over_the_name(
    tmp_path: Path, name: str, data: bytes, media: str, mime: str
) -> None:
    assert sniff(write(tmp_path / name, data)) == (media, mime)


def test_sniff_recognises_office_documents(tmp_path: Path) -> None:
    path = write(tmp_path / "report.docx", _docx_bytes(tmp_path))
    assert sniff(path) == (
        "file",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    )
    assert sniff(write(tmp_path / "plain.zip", path.read_bytes())) == ("file", "application/zip")


def test_sniff_falls_back_to_header_hint_then_extension(tmp_path: Path) -> None:
    unknown = write(tmp_path / "clip.mov", b"no magic here")
    assert sniff(unknown, "video/x-custom; codecs=x") == ("video", "video/x-custom")
    assert sniff(unknown, "application/octet-stream") == ("video", "video/quicktime")
    assert sniff(unknown) == ("video", "video/quicktime")
    assert sniff(write(tmp_path / "notes", b"hello")) == ("file", "application/octet-stream")
    assert sniff(write(tmp_path / "data.csv", b"a,b\n1,2\n")) == ("file", "text/csv")


# --- collect ------------------------------------------------------------------------------


def test_collect_declared_files(ws: Path) -> None:
    write(ws / "out.png", PNG)
    write(ws / "sub" / "clip.mp4", b"\0\0\0\x20ftypisom\0\0\x02\0")
    write(ws / "song.mp3", b"ID3\x04" + b"\0" * 30)
    write(ws / "report.pdf", b"%PDF-1.7")
    result = fill_local_path(
        {
            "filename": "out.png",
            "media": "image",
            "videos": ["sub/clip.mp4"],
            "audios": [{"local_path": str(ws / "song.mp3"), "caption": "x"}],
            "files": [{"filename": "report.pdf"}, "https://example.com/remote-only.pdf"],
            "images": ["out.png"],  # the same file declared twice
        },
        ws,
    )
    problems: list[dict[str, Any]] = []
    arts = collect(result, ws, problems)
    assert problems == []
    assert [(a.filename, a.media) for a in arts] == [
        ("out.png", "image"),
        ("clip.mp4", "video"),
        ("song.mp3", "audio"),
        ("report.pdf", "file"),
    ]
    png = arts[0]
    assert png.local_path == str((ws / "out.png").resolve())
    assert (png.size, png.sha256, png.mime) == (
        len(PNG),
        hashlib.sha256(PNG).hexdigest(),
        "image/png",
    )
    assert png.to_dict() == {
        "filename": "out.png",
        "local_path": png.local_path,
        "media": "image",
        "mime": "image/png",
        "size": len(PNG),
        "sha256": hashlib.sha256(PNG).hexdigest(),
        "source_url": None,
    }


def test_collect_media_list_and_declared_kind(ws: Path) -> None:
    write(ws / "voice.opus.part", b"no magic at all")
    write(ws / "pic.jpg", JPEG)
    result = {
        "media": [
            {"type": "audio", "path": "voice.opus.part"},  # bytes say nothing: declared kind wins
            {"type": "video", "local_path": "pic.jpg"},  # bytes say JPEG: magic wins
        ]
    }
    arts = collect(result, ws)
    assert [(a.filename, a.media) for a in arts] == [
        ("voice.opus.part", "audio"),
        ("pic.jpg", "image"),
    ]


def test_collect_refuses_escapes_and_reports_missing(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = write(tmp_path / "secret.txt", b"top secret")
    write(ws / "ok.png", PNG)
    (ws / "link.png").symlink_to(secret)
    (ws / "inside-link.png").symlink_to(ws / "ok.png")
    monkeypatch.setenv("HOME", str(tmp_path))
    result = {
        "files": [
            "../secret.txt",
            "sub/../../secret.txt",
            str(secret),
            "link.png",
            "~/secret.txt",
            "~/ws/ok.png",  # ~/ that lands inside the workspace is fine
            "inside-link.png",
            "missing.pdf",
            "",
        ],
        "images": [{"local_path": "/etc/passwd"}],
    }
    problems: list[dict[str, Any]] = []
    arts = collect(result, ws, problems)
    assert [a.filename for a in arts] == ["ok.png"]  # ~/ws/ok.png and its link: one file
    reasons = {p["path"]: p["reason"] for p in problems}
    assert reasons == {
        "../secret.txt": "../secret.txt resolves outside the workspace",
        "sub/../../secret.txt": "sub/../../secret.txt resolves outside the workspace",
        str(secret): f"{secret} resolves outside the workspace",
        "link.png": "symlink link.png resolves outside the workspace",
        "~/secret.txt": "~/secret.txt resolves outside the workspace",
        "missing.pdf": "missing file missing.pdf",
        "/etc/passwd": "/etc/passwd resolves outside the workspace",
    }
    assert {p["field"] for p in problems} == {"files", "images"}


def test_collect_never_crashes_on_odd_results(ws: Path) -> None:
    write(ws / "dir" / "x.png", PNG)
    odd = {
        "files": [None, 3, {"local_path": 5}, {"url": "https://x.example.com/a"}, "dir"],
        "media": "image",
    }
    problems: list[dict[str, Any]] = []
    assert collect(odd, ws, problems) == []
    assert problems == [{"path": "dir", "field": "files", "reason": "not a regular file dir"}]
    assert collect({}, ws / "does-not-exist") == []


def test_collect_reuses_the_download_digest_only_when_the_size_matches(ws: Path) -> None:
    write(ws / "a.png", PNG)
    entry = {"local_path": "a.png", "source_url": "https://cdn.example.com/a.png"}
    good = {**entry, "sha256": hashlib.sha256(PNG).hexdigest(), "size": len(PNG)}
    stale = {**entry, "sha256": "0" * 64, "size": len(PNG) + 1}
    for declared in (good, stale):
        (art,) = collect({"images": [declared]}, ws)
        assert art.sha256 == hashlib.sha256(PNG).hexdigest()
        assert art.source_url == "https://cdn.example.com/a.png"


async def test_acollect_runs_off_the_loop(ws: Path) -> None:
    write(ws / "a.png", PNG)
    arts = await acollect({"filename": "a.png"}, ws)
    assert arts == [
        ArtifactInfo(
            "a.png",
            str((ws / "a.png").resolve()),
            "image",
            "image/png",
            len(PNG),
            hashlib.sha256(PNG).hexdigest(),
        )
    ]


# --- backfill -----------------------------------------------------------------------------


def _populate(ws: Path) -> None:
    for name in (
        "out.png",
        "table.csv",
        "run.py",
        "app.js",
        "go.sh",
        "debug.log",
        "scratch.tmp",
        "subs.srt",
        "mod.pyc",
        ".hidden.png",
        "toolout_x.json",
        "Shout.PY",
    ):
        write(ws / name, PNG if name.endswith(".png") else b"data")
    write(ws / "nested" / "deep.png", PNG)
    write(ws / ".toolout" / "toolout_s_1234abcd.json", b"{}")


def test_backfill_collects_undeclared_top_level_files(ws: Path, tmp_path: Path) -> None:
    _populate(ws)
    outside = write(tmp_path / "outside.png", PNG)
    os.symlink(outside, ws / "escape.png")
    assert [p.name for p in backfill({"success": True}, ws)] == ["out.png", "table.csv"]
    arts = collect({"success": True, "message": "done"}, ws)
    assert [(a.filename, a.media) for a in arts] == [("out.png", "image"), ("table.csv", "file")]


@pytest.mark.parametrize(
    "result",
    [
        {"filename": "table.csv"},
        {"local_path": "out.png"},
        {"images": ["out.png"]},
        {"files": [{"local_path": "table.csv"}]},
    ],
)
def test_no_backfill_when_the_skill_declares_its_files(ws: Path, result: dict[str, Any]) -> None:
    _populate(ws)
    assert backfill(result, ws) == []
    assert len(collect(result, ws)) == 1


def test_materialized_downloads_do_not_stop_backfill(ws: Path) -> None:
    _populate(ws)
    write(ws / "cdn.png", PNG)
    result = {
        "image_url": "https://cdn.example.com/cdn.png",
        "images": [
            {"local_path": str(ws / "cdn.png"), "source_url": "https://cdn.example.com/cdn.png"}
        ],
    }
    assert [p.name for p in backfill(result, ws)] == ["out.png", "table.csv"]
    assert [a.filename for a in collect(result, ws)] == ["cdn.png", "out.png", "table.csv"]
