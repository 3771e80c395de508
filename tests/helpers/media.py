"""Media files for channel tests: sparse files of any size, real PNGs of any shape, and short
video/audio clips made with ffmpeg (an optional system dependency of the product)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.helpers.settings import IN_CI

FFMPEG_MISSING = "ffmpeg/ffprobe not installed (optional system dependency: apt-get install ffmpeg)"


def sparse(path: Path, size: int) -> str:
    """A file of ``size`` zero bytes that takes no disk space."""
    with open(path, "wb") as fh:
        fh.truncate(size)
    return str(path)


def png(width: int, height: int) -> bytes:
    """A valid grey PNG of that size."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def need_ffmpeg() -> None:
    """Skip (locally) or fail (CI) when ffmpeg/ffprobe are missing."""
    if shutil.which("ffmpeg") and shutil.which("ffprobe"):
        return
    if IN_CI:
        pytest.fail(f"CI=true but {FFMPEG_MISSING}", pytrace=False)
    pytest.skip(FFMPEG_MISSING)


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-v", "error", "-y", *args], check=True, timeout=60)


def clip(path: Path, seconds: float = 2.0) -> str:
    """A small H.264 mp4 (160×120) of ``seconds``."""
    need_ffmpeg()
    _ffmpeg(
        "-f", "lavfi", "-i", f"testsrc=duration={seconds}:size=160x120:rate=10",
        "-pix_fmt", "yuv420p", "-c:v", "libx264", str(path),
    )  # fmt: skip
    return str(path)


def tone(path: Path, seconds: float = 2.0) -> str:
    """A sine tone in the format ``path``'s suffix names (``.mp3``, ``.opus``, ``.m4a``…)."""
    need_ffmpeg()
    _ffmpeg("-f", "lavfi", "-i", f"sine=frequency=440:duration={seconds}", str(path))
    return str(path)
