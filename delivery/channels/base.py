"""What every channel adapter is: the common interface, the two delivery errors, the HTTP seam
that translates transport failures once, and a token cache for the APIs that need one."""

from __future__ import annotations

import asyncio
import mimetypes
import time
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from jobs.settings import Settings

MEDIA_KINDS = ("image", "video", "audio", "file")

IMAGE_EXT = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"}
VIDEO_EXT = {".mp4", ".mov", ".m4v", ".webm", ".avi", ".mkv"}
AUDIO_EXT = {".mp3", ".m4a", ".ogg", ".opus", ".wav", ".aac", ".amr", ".flac"}


class DeliveryError(Exception):
    """A send did not happen."""


class DeliveryTransientError(DeliveryError):
    """Worth trying again later (timeouts, connection errors, 429, 5xx)."""

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class DeliveryPermanentError(DeliveryError):
    """The channel refused the message; sending it again will not help."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def media_kind(path: str | Path, declared: str | None = None) -> str:
    """``image``/``video``/``audio``/``file`` from a declared media type or the extension."""
    if declared in MEDIA_KINDS:
        return declared
    ext = Path(str(path)).suffix.lower()
    if ext in IMAGE_EXT:
        return "image"
    if ext in VIDEO_EXT:
        return "video"
    if ext in AUDIO_EXT:
        return "audio"
    return "file"


def guess_mime(path: str | Path) -> str:
    return mimetypes.guess_type(str(path))[0] or "application/octet-stream"


def read_file(path: str | Path) -> bytes:
    """The bytes of a local attachment, or a permanent error naming the problem."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError as exc:
        raise DeliveryPermanentError(f"file not found: {p.name}") from exc
    except IsADirectoryError as exc:
        raise DeliveryPermanentError(f"not a file: {p.name}") from exc
    except OSError as exc:
        raise DeliveryPermanentError(f"cannot read {p.name}: {exc.strerror}") from exc


async def read_file_async(path: str | Path) -> bytes:
    """File reads off the event loop (attachments can be tens of MB)."""
    return await asyncio.to_thread(read_file, path)


def file_size(path: str | Path) -> int:
    try:
        return Path(path).stat().st_size
    except FileNotFoundError as exc:
        raise DeliveryPermanentError(f"file not found: {Path(path).name}") from exc


def _retry_after(resp: httpx.Response, body: Any = None) -> float | None:
    if isinstance(body, dict):
        params = body.get("parameters")
        if isinstance(params, dict) and isinstance(params.get("retry_after"), int | float):
            return float(params["retry_after"])
    raw = resp.headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


async def request(
    http: httpx.AsyncClient, method: str, url: str, *, what: str, **kwargs: Any
) -> httpx.Response:
    """One HTTP call to a channel API with transport failures translated once.

    Timeouts, connection errors, 429 and 5xx become :class:`DeliveryTransientError`
    (with ``retry_after`` when the server said so). Other statuses are returned: each
    adapter reads its own error body shape.
    """
    try:
        resp = await http.request(method, url, **kwargs)
    except httpx.TimeoutException as exc:
        raise DeliveryTransientError(f"{what}: timed out") from exc
    except httpx.TransportError as exc:
        raise DeliveryTransientError(f"{what}: connection failed ({type(exc).__name__})") from exc
    if resp.status_code == 429 or resp.status_code >= 500:
        body = _json_or_none(resp)
        detail = _short_detail(body) or resp.reason_phrase
        raise DeliveryTransientError(
            f"{what}: HTTP {resp.status_code} {detail}".strip(),
            retry_after=_retry_after(resp, body),
        )
    return resp


def _json_or_none(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _short_detail(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    for k in ("description", "msg", "errmsg", "message", "error"):
        if isinstance(body.get(k), str) and body[k]:
            return body[k][:300]
    return ""


def json_body(resp: httpx.Response, what: str) -> dict[str, Any]:
    """A JSON object body, or a permanent error (4xx without one is permanent too)."""
    body = _json_or_none(resp)
    if not isinstance(body, dict):
        if resp.status_code >= 400:
            raise DeliveryPermanentError(f"{what}: HTTP {resp.status_code}")
        raise DeliveryPermanentError(f"{what}: the server did not answer with JSON")
    return body


class TokenCache:
    """One access token, fetched on demand, kept until shortly before it expires, refreshed
    by a single caller at a time."""

    def __init__(self, fetch: Callable[[], Awaitable[tuple[str, float]]], *, margin: float = 60.0):
        self._fetch = fetch
        self._margin = margin
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()
        self.fetches = 0

    async def get(self) -> str:
        if self._token and time.monotonic() < self._expires_at:
            return self._token
        async with self._lock:
            if self._token and time.monotonic() < self._expires_at:
                return self._token
            token, ttl = await self._fetch()
            self.fetches += 1
            self._token = token
            self._expires_at = time.monotonic() + max(0.0, ttl - self._margin)
            return token

    def invalidate(self, token: str | None = None) -> None:
        """Forget the token (only if it is still ``token``, when given)."""
        if token is None or token == self._token:
            self._token = None
            self._expires_at = 0.0


class Channel:
    """A third-party chat channel. Every send returns the channel's message id or raises
    :class:`DeliveryTransientError` / :class:`DeliveryPermanentError`."""

    name = ""
    #: the text can ride along with a media item
    supports_caption = False
    #: ``![alt](url)`` in text is turned into media by this adapter
    converts_markdown_images = False

    async def send_text(self, contact: str, text: str) -> str:
        raise NotImplementedError

    async def send_image(self, contact: str, path: str, caption: str | None = None) -> str:
        raise NotImplementedError

    async def send_video(self, contact: str, path: str, caption: str | None = None) -> str:
        raise NotImplementedError

    async def send_audio(self, contact: str, path: str, caption: str | None = None) -> str:
        raise NotImplementedError

    async def send_file(self, contact: str, path: str, caption: str | None = None) -> str:
        raise NotImplementedError

    async def send_media(
        self, kind: str, contact: str, path: str, caption: str | None = None
    ) -> str:
        """Route to ``send_image``/``send_video``/``send_audio``/``send_file`` by kind."""
        send = {
            "image": self.send_image,
            "video": self.send_video,
            "audio": self.send_audio,
        }.get(kind, self.send_file)
        return await send(contact, path, caption)


def build_channels(
    settings: Settings,
    http: httpx.AsyncClient,
    *,
    sessionmaker: Any = None,
    redis: Any = None,
) -> dict[str, Channel]:
    """The configured adapters by channel name. ``web`` (and its alias ``web_admin``) is
    always present; it needs ``sessionmaker`` (and ``redis`` for live pushes) to send."""
    from delivery.channels.dingtalk import DingTalkChannel
    from delivery.channels.feishu import FeishuChannel
    from delivery.channels.telegram import TelegramChannel
    from delivery.channels.web import WebChannel
    from delivery.channels.wecom import WeComChannel

    def secret(v: Any) -> str:
        return v.get_secret_value() if v is not None else ""

    out: dict[str, Channel] = {}
    if settings.telegram_bot_token:
        out["telegram"] = TelegramChannel(
            http,
            secret(settings.telegram_bot_token),
            api_base=settings.telegram_api_base,
            allow_hosts=settings.allow_hosts,
        )
    if settings.feishu_app_id and settings.feishu_app_secret:
        out["feishu"] = FeishuChannel(
            http,
            settings.feishu_app_id,
            secret(settings.feishu_app_secret),
            api_base=settings.feishu_api_base,
        )
    if settings.wecom_corp_id and settings.wecom_corp_secret and settings.wecom_agent_id:
        out["wecom"] = WeComChannel(
            http,
            settings.wecom_corp_id,
            secret(settings.wecom_corp_secret),
            settings.wecom_agent_id,
            api_base=settings.wecom_api_base,
        )
    if settings.dingtalk_app_key and settings.dingtalk_app_secret and settings.dingtalk_robot_code:
        out["dingtalk"] = DingTalkChannel(
            http,
            settings.dingtalk_app_key,
            secret(settings.dingtalk_app_secret),
            settings.dingtalk_robot_code,
            api_base=settings.dingtalk_api_base,
            oapi_base=settings.dingtalk_oapi_base,
        )
    web = WebChannel(sessionmaker, redis, settings)
    out["web"] = web
    out["web_admin"] = web
    return out
