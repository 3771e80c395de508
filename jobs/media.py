"""What a file is and what it is called: the one extension/MIME/media-kind table, media
sniffing, safe file names.

Media kinds are what every channel can show as such: an ``image`` is a PNG, JPEG, GIF,
WebP or BMP. SVG, HEIC/HEIF, TIFF and AVIF are images to a browser but not to the chat
platforms' photo APIs (Telegram's ``sendPhoto``, WeCom and DingTalk image messages refuse
or mangle them), so they travel as files; likewise FLV, which no platform plays inline.

``sniff`` decides ``image``/``video``/``audio``/``file`` from the magic bytes first, then a
header hint (e.g. the Content-Type it was downloaded with), then the extension.
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
import re
import unicodedata
from email.message import Message
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote

MEDIA_KINDS = ("image", "video", "audio", "file")
HEAD_BYTES = 4096

_BY_EXTENSION = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
    ".tif": "image/tiff",
    ".tiff": "image/tiff",
    ".heic": "image/heic",
    ".avif": "image/avif",
    ".svg": "image/svg+xml",
    ".mp4": "video/mp4",
    ".m4v": "video/mp4",
    ".mov": "video/quicktime",
    ".webm": "video/webm",
    ".mkv": "video/x-matroska",
    ".avi": "video/x-msvideo",
    ".3gp": "video/3gpp",
    ".mp3": "audio/mpeg",
    ".m4a": "audio/mp4",
    ".aac": "audio/aac",
    ".ogg": "audio/ogg",
    ".oga": "audio/ogg",
    ".opus": "audio/opus",
    ".wav": "audio/wav",
    ".flac": "audio/flac",
    ".amr": "audio/amr",
    ".pdf": "application/pdf",
    ".zip": "application/zip",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".csv": "text/csv",
    ".txt": "text/plain",
    ".md": "text/markdown",
    ".json": "application/json",
    ".html": "text/html",
    ".gz": "application/gzip",
    ".heif": "image/heif",
    ".flv": "video/x-flv",
}
_EXTENSION_FOR = {
    "image/jpeg": ".jpg",
    "audio/mpeg": ".mp3",
    "audio/mp4": ".m4a",
    "video/mp4": ".mp4",
    "video/quicktime": ".mov",
    "text/plain": ".txt",
    "application/octet-stream": ".bin",
    "audio/wav": ".wav",
    "audio/x-wav": ".wav",
}
_OOXML = {".docx", ".xlsx", ".pptx"}


# Images, videos and audio the platforms do not show as such: sent as files.
_AS_FILE = frozenset(
    {"image/svg+xml", "image/tiff", "image/heic", "image/heif", "image/avif", "video/x-flv"}
)


def mime_from_header(value: str | None) -> str | None:
    """``text/html; charset=utf-8`` → ``text/html``; None when absent or malformed."""
    if not value:
        return None
    mime = value.split(";", 1)[0].strip().lower()
    return mime if "/" in mime else None


def mime_from_name(name: str | os.PathLike[str]) -> str | None:
    ext = Path(name).suffix.lower()
    return _BY_EXTENSION.get(ext) or mimetypes.guess_type(f"x{ext}")[0]


def extension_for(mime: str) -> str:
    """``.ext`` for a MIME type (``.bin`` when unknown)."""
    mime = mime.lower()
    return _EXTENSION_FOR.get(mime) or mimetypes.guess_extension(mime) or ".bin"


def media_of(mime: str | None) -> str:
    """Media kind for a MIME type: its major type, except for the types channels do not
    show (SVG, TIFF, HEIC, AVIF, FLV) and unknowns, which are files."""
    if not mime or mime in _AS_FILE:
        return "file"
    major = mime.split("/", 1)[0]
    return major if major in ("image", "video", "audio") else "file"


def media_kind(path: str | os.PathLike[str], declared: str | None = None) -> str:
    """``image``/``video``/``audio``/``file`` from a declared media type, else the name's
    extension (a URL's query string ignored)."""
    if declared in MEDIA_KINDS:
        return declared
    name = str(path).split("?", 1)[0]
    return media_of(_BY_EXTENSION.get(Path(name).suffix.lower()))


def guess_mime(path: str | os.PathLike[str]) -> str:
    """MIME type from the name, ``application/octet-stream`` when unknown."""
    return mime_from_name(path) or "application/octet-stream"


# Magic numbers at offset 0 whose type needs no further look.
_PREFIXES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"II*\0", "image/tiff"),
    (b"MM\0*", "image/tiff"),
    (b"ID3", "audio/mpeg"),
    (b"fLaC", "audio/flac"),
    (b"#!AMR", "audio/amr"),
    (b"%PDF-", "application/pdf"),
    (b"\x1f\x8b", "application/gzip"),
)
_RIFF = {b"WEBP": "image/webp", b"WAVE": "audio/wav", b"AVI ": "video/x-msvideo"}


def sniff_bytes(head: bytes, name: str = "") -> str | None:
    """MIME type from magic bytes, or None when the bytes say nothing we know."""
    for prefix, mime in _PREFIXES:
        if head.startswith(prefix):
            return mime
    if head[:4] == b"RIFF" and len(head) >= 12:
        return _RIFF.get(head[8:12])
    if head.startswith(b"BM") and len(head) >= 14 and head[6:10] == b"\0\0\0\0":
        return "image/bmp"
    if head[4:8] == b"ftyp":
        return _ftyp(head[8:12])
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "video/webm" if b"webm" in head[:64] else "video/x-matroska"
    if head.startswith(b"OggS"):
        return _ogg(head)
    if head.startswith(b"PK\x03\x04"):
        ext = Path(name).suffix.lower()
        if ext in _OOXML and b"[Content_Types].xml" in head:
            return _BY_EXTENSION[ext]
        return "application/zip"
    return _mpeg_audio(head) or _svg(head)


def _ogg(head: bytes) -> str:
    if b"theora" in head[:128]:
        return "video/ogg"
    return "audio/opus" if b"OpusHead" in head[:128] else "audio/ogg"


def _mpeg_audio(head: bytes) -> str | None:
    if len(head) < 2 or head[0] != 0xFF:
        return None
    if head[1] & 0xF6 == 0xF0:
        return "audio/aac"  # ADTS
    if head[1] & 0xE0 == 0xE0 and head[1] & 0x06:
        return "audio/mpeg"  # MPEG audio frame sync, layer set
    return None


def _svg(head: bytes) -> str | None:
    stripped = head.lstrip()[:256].lower()
    if stripped.startswith(b"<svg") or (stripped.startswith(b"<?xml") and b"<svg" in head):
        return "image/svg+xml"
    return None


def _ftyp(brand: bytes) -> str:
    brand = brand.lower()
    if brand in (b"heic", b"heix", b"mif1", b"msf1"):
        return "image/heic"
    if brand in (b"avif", b"avis"):
        return "image/avif"
    if brand == b"qt  ":
        return "video/quicktime"
    if brand in (b"m4a ", b"m4b ", b"m4p "):
        return "audio/mp4"
    if brand.startswith(b"3g"):
        return "video/3gpp"
    return "video/mp4"


def sniff(path: str | os.PathLike[str], mime_hint: str | None = None) -> tuple[str, str]:
    """``(media, mime)`` of a file: magic bytes, then ``mime_hint``, then the extension."""
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES)
    return sniff_head(head, path, mime_hint)


def sniff_head(
    head: bytes, path: str | os.PathLike[str], mime_hint: str | None = None
) -> tuple[str, str]:
    """:func:`sniff` of a file whose first bytes were read already."""
    mime = sniff_bytes(head, str(path))
    if mime is None:
        hint = mime_from_header(mime_hint)
        if hint and hint != "application/octet-stream":
            mime = hint
    if mime is None:
        mime = mime_from_name(path) or "application/octet-stream"
    return media_of(mime), mime


def file_digest(path: str | os.PathLike[str], chunk: int = 1024 * 1024) -> tuple[int, str]:
    """``(size, sha256 hex)`` read in chunks, never the whole file at once."""
    with open(path, "rb") as fh:
        return stream_digest(fh, chunk)


def stream_digest(fh: BinaryIO, chunk: int = 1024 * 1024) -> tuple[int, str]:
    """``(size, sha256 hex)`` of an open binary file, from where it stands."""
    digest = hashlib.sha256()
    size = 0
    while block := fh.read(chunk):
        size += len(block)
        digest.update(block)
    return size, digest.hexdigest()


# --- file names -------------------------------------------------------------------------

_FILENAME_STAR = re.compile(r"filename\*\s*=\s*([\w!#$%&+^`{}~-]*)'[^']*'([^;\s]+)", re.IGNORECASE)
_UNSAFE = re.compile(r'[\x00-\x1f\x7f<>:"|?*]')
MAX_NAME_BYTES = 180


def sanitize_filename(name: str | None) -> str:
    """A safe single path component: no separators, no ``..``, no leading dot, bounded."""
    if not name:
        return ""
    name = unicodedata.normalize("NFC", str(name)).replace("\\", "/").rsplit("/", 1)[-1]
    name = _UNSAFE.sub("_", name)
    name = re.sub(r"\.{2,}", ".", name).strip().lstrip(".").strip()
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        stem, dot, ext = name.rpartition(".")
        ext = ext[:16] if dot and stem else ""
        keep = stem if ext else name
        while len(keep.encode("utf-8")) > MAX_NAME_BYTES - len(ext) - 1:
            keep = keep[:-1]
        name = f"{keep}.{ext}" if ext else keep
    return name


def content_disposition_filename(value: str | None) -> str | None:
    """``filename*=charset''…`` (RFC 5987) wins over ``filename=``."""
    if not value:
        return None
    star = _FILENAME_STAR.search(value)
    if star:
        try:
            return unquote(star.group(2), encoding=star.group(1) or "utf-8", errors="strict")
        except (LookupError, UnicodeDecodeError):
            pass
    message = Message()
    message["content-disposition"] = value
    plain = message.get_filename()
    return str(plain) if plain else None


def choose_filename(
    disposition: str | None, hint: str | None, url_path: str, mime: str | None
) -> str:
    """Content-Disposition, then the caller's hint, then the URL path, then ``file.<ext>``."""
    url_name = unquote(url_path.rsplit("/", 1)[-1]) if url_path else ""
    name = ""
    for candidate in (content_disposition_filename(disposition), hint, url_name):
        name = sanitize_filename(candidate)
        if name:
            break
    if not name:
        name = "file"
    if "." not in name and mime:
        name += extension_for(mime)
    return name


def place_file(tmp: Path, folder: Path, name: str) -> Path:
    """Give ``tmp`` its final name in ``folder``, never overwriting (``a.png``, ``a-1.png``…).

    A hard link makes the complete file appear under its name in one step; where links are
    not supported the name is reserved exclusively and the file renamed over it.
    """
    stem, dot, ext = name.rpartition(".")
    suffix = f".{ext}" if dot and stem else ""
    stem = stem if suffix else name
    for n in range(10_000):
        candidate = folder / (name if n == 0 else f"{stem}-{n}{suffix}")
        try:
            os.link(tmp, candidate)
        except FileExistsError:
            continue
        except OSError:
            try:
                os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except FileExistsError:
                continue
            os.replace(tmp, candidate)
            return candidate
        tmp.unlink()
        return candidate
    raise FileExistsError(f"no free file name for {name} in {folder.name}")
