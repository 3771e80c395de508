"""Audio in the format a channel takes: converted with ``ffmpeg`` when it is installed.

Telegram plays a voice note only from OGG/Opus (``sendVoice``) and audio from MP3/M4A;
Feishu's audio message takes Opus; DingTalk AMR/MP3/WAV; WeCom AMR. A skill's
``speech.mp3`` sent with ``[[audio_as_voice]]`` is therefore converted to OGG/Opus for
Telegram, to Opus for Feishu, and so on. Without ffmpeg (an optional system dependency,
``apt-get install ffmpeg``), or when it cannot convert the file, the file goes as the next
kind that fits and the delivery's note says why.

Converted copies live beside the original in the workspace, in ``.skilljobs-converted/``
(hidden: never backfilled as a result of their own), named after the original's content
hash, so a resend or a second recipient reuses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CONVERT_TIMEOUT = 120.0
FOLDER = ".skilljobs-converted"


@dataclass(frozen=True)
class Target:
    """One output format: the suffix it is saved under and the ffmpeg arguments."""

    suffix: str
    label: str
    args: tuple[str, ...]


# Mono speech settings: what the platforms' own voice notes use.
_OPUS = ("-vn", "-ac", "1", "-ar", "48000", "-c:a", "libopus", "-b:a", "32k", "-f", "ogg")
TARGETS: dict[str, Target] = {
    "ogg": Target("ogg", "OGG/Opus", _OPUS),
    "oga": Target("oga", "OGG/Opus", _OPUS),
    "opus": Target("opus", "Opus", _OPUS),
    "mp3": Target("mp3", "MP3", ("-vn", "-c:a", "libmp3lame", "-q:a", "4", "-f", "mp3")),
    "m4a": Target("m4a", "M4A/AAC", ("-vn", "-c:a", "aac", "-b:a", "96k", "-f", "ipod")),
    "wav": Target("wav", "WAV", ("-vn", "-ac", "1", "-c:a", "pcm_s16le", "-f", "wav")),
    "amr": Target(
        "amr", "AMR", ("-vn", "-ac", "1", "-ar", "8000", "-c:a", "libopencore_amrnb", "-f", "amr")
    ),
}
#: the order formats are tried in when a channel takes several
PREFERENCE = ("ogg", "opus", "oga", "mp3", "m4a", "amr", "wav")


@dataclass(frozen=True)
class Converted:
    """The outcome of a conversion: ``path`` when it worked, else why not (``reason``)."""

    path: str | None
    reason: str
    label: str = ""


def targets_for(formats: Iterable[str]) -> list[Target]:
    """The output formats ffmpeg can make among those a channel takes, best first."""
    taken = set(formats)
    return [TARGETS[f] for f in PREFERENCE if f in taken]


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _folder(source: Path) -> Path:
    folder = source.parent / FOLDER
    folder.mkdir(exist_ok=True)
    return folder


async def convert(ffmpeg: str | None, path: str, formats: Iterable[str]) -> Converted:
    """``path`` as one of ``formats`` (suffixes), made by ``ffmpeg``; the first target
    that works wins."""
    if not ffmpeg:
        return Converted(None, "ffmpeg not installed (optional system dependency)")
    targets = targets_for(formats)
    if not targets:
        return Converted(None, "no audio format this channel takes can be made with ffmpeg")
    source = Path(path)
    try:
        digest = await asyncio.to_thread(_digest, path)
        folder = await asyncio.to_thread(_folder, source)
    except OSError as exc:
        return Converted(None, f"cannot convert {source.name}: {exc.strerror or exc}")
    errors: list[str] = []
    for target in targets:
        out = folder / f"{source.stem}.{digest}.{target.suffix}"
        if out.is_file() and out.stat().st_size > 0:
            return Converted(str(out), "", target.label)
        problem = await _run(ffmpeg, path, out, target)
        if problem is None:
            return Converted(str(out), "", target.label)
        errors.append(f"{target.label}: {problem}")
    return Converted(None, "ffmpeg could not convert it (" + "; ".join(errors) + ")")


async def _run(ffmpeg: str, src: str, out: Path, target: Target) -> str | None:
    """Convert ``src`` into ``out`` (written whole or not at all); None, or what went wrong."""
    partial = out.with_name(f".{out.name}.{os.getpid()}.part")
    argv = [ffmpeg, "-v", "error", "-nostdin", "-y", "-i", src, *target.args, str(partial)]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return f"cannot run ffmpeg: {exc.strerror or exc}"
    try:
        _, err = await asyncio.wait_for(proc.communicate(), CONVERT_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        partial.unlink(missing_ok=True)
        return f"took longer than {CONVERT_TIMEOUT:g} s"
    if proc.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        last = (err or b"").decode(errors="replace").strip().splitlines()
        return last[-1][:200] if last else f"exit status {proc.returncode}"
    os.replace(partial, out)
    return None


__all__ = ["FOLDER", "TARGETS", "Converted", "Target", "convert", "targets_for"]
