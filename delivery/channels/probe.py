"""Media details the chat platforms want with a video or a voice message: duration, size and
a cover frame, read with ``ffprobe`` / made with ``ffmpeg``.

Both are an optional system dependency (``apt-get install ffmpeg``). Without them every
answer is ``None`` and the adapters send videos as files on the channels that require these
fields (DingTalk ``sampleVideo``, Feishu ``media``), saying why in the delivery's note.
The tools run as subprocesses with a time limit, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from dataclasses import dataclass

PROBE_TIMEOUT = 30.0


@dataclass(frozen=True)
class MediaInfo:
    """What ``ffprobe`` says of a file; any field may be unknown."""

    duration: float | None = None  # seconds
    width: int | None = None
    height: int | None = None

    @property
    def duration_ms(self) -> int | None:
        return None if self.duration is None else max(1, round(self.duration * 1000))

    @property
    def duration_s(self) -> int | None:
        """Whole seconds, at least 1 (the platforms' video fields are whole seconds)."""
        return None if self.duration is None else max(1, round(self.duration))


class MediaProbe:
    """``ffprobe``/``ffmpeg`` found on ``PATH`` when built (pass ``None`` for "absent")."""

    def __init__(
        self,
        ffprobe: str | None = "",
        ffmpeg: str | None = "",
        *,
        timeout: float = PROBE_TIMEOUT,
    ) -> None:
        self.ffprobe = shutil.which("ffprobe") if ffprobe == "" else ffprobe
        self.ffmpeg = shutil.which("ffmpeg") if ffmpeg == "" else ffmpeg
        self.timeout = timeout

    @property
    def missing(self) -> str | None:
        """Why video details cannot be had here (None when both tools are present)."""
        absent = [n for n, p in (("ffprobe", self.ffprobe), ("ffmpeg", self.ffmpeg)) if not p]
        if not absent:
            return None
        return f"{' and '.join(absent)} not installed (optional system dependency)"

    async def info(self, path: str) -> MediaInfo | None:
        """Duration and picture size, or None when ffprobe is absent or cannot read it."""
        if not self.ffprobe:
            return None
        out = await self._run(
            self.ffprobe,
            "-v", "error",
            "-print_format", "json",
            "-show_entries", "format=duration:stream=codec_type,width,height",
            path,
        )  # fmt: skip
        if out is None:
            return None
        try:
            data = json.loads(out)
        except ValueError:
            return None
        duration = _number(data.get("format", {}).get("duration"))
        video: dict[str, object] = next(
            (s for s in data.get("streams", []) if s.get("codec_type") == "video"), {}
        )
        width, height = video.get("width"), video.get("height")
        return MediaInfo(
            duration=duration if duration and duration > 0 else None,
            width=width if isinstance(width, int) else None,
            height=height if isinstance(height, int) else None,
        )

    async def cover(self, path: str, *, max_side: int = 640, at: float = 1.0) -> bytes | None:
        """A JPEG frame of the video (at ``at`` seconds, or the first one for shorter
        videos), at most ``max_side`` pixels on its longer side; None when ffmpeg is absent
        or fails."""
        if not self.ffmpeg:
            return None
        scale = (
            f"scale=w='min({max_side},iw)':h='min({max_side},ih)'"
            ":force_original_aspect_ratio=decrease"
        )
        for start in (at, 0.0) if at > 0 else (0.0,):
            frame = await self._run(
                self.ffmpeg,
                "-v", "error", "-ss", f"{start:g}", "-i", path,
                "-frames:v", "1", "-vf", scale, "-f", "image2", "-c:v", "mjpeg", "pipe:1",
            )  # fmt: skip
            if frame:
                return frame
        return None

    async def _run(self, *argv: str) -> bytes | None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except OSError:
            return None
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return None
        return out if proc.returncode == 0 else None


def _number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


__all__ = ["MediaInfo", "MediaProbe"]
