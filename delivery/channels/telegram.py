"""Telegram Bot API adapter: sendMessage / sendPhoto / sendVideo / sendAudio / sendDocument.

Limits (Bot API reference, "sendMessage", "sendPhoto", "Sending files"): text 1–4096
characters, captions 0–1024 (counted here in UTF-16 code units, which is never fewer);
uploads of photos up to 10 MB (width + height ≤ 10000, ratio ≤ 20), other files up to 50 MB.
A group is a chat id like any other (negative, ``-100…`` for supergroups and channels);
replies use ``reply_parameters``. The only adapter that turns Markdown images
(``![alt](url)``) in text into photos. Text with Markdown goes as HTML (``parse_mode=HTML``,
``delivery.richtext``), each message within 4096 characters as Telegram counts them after
parsing the entities; if Telegram cannot parse them, that message goes again as plain text.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from delivery.channels.base import (
    MARKDOWN_IMAGE,
    DeliveryPermanentError,
    json_body,
    read_file_async,
    request,
)
from delivery.channels.limits import (
    DoesNotFit,
    LimitedChannel,
    LinkFor,
    Target,
    rule,
    split_text,
    utf16_len,
)
from delivery.channels.probe import MediaProbe
from delivery.net.urlsafety import RefusedURL, check_url
from delivery.richtext import TELEGRAM, Piece, PlainText, has_markup, pieces

log = logging.getLogger(__name__)

TEXT_LIMIT = 4096
CAPTION_LIMIT = 1024
PHOTO_LIMIT = 10 * 1024 * 1024
UPLOAD_LIMIT = 50 * 1024 * 1024
THUMB_SIDE = 320  # the Bot API's thumbnail bound (JPEG, ≤ 320 px, < 200 kB)
THUMB_BYTES = 200 * 1024

_METHODS = {
    "image": ("sendPhoto", "photo"),
    "video": ("sendVideo", "video"),
    "audio": ("sendAudio", "audio"),
    "voice": ("sendVoice", "voice"),  # [[audio_as_voice]]: OGG/Opus as a voice note
    "file": ("sendDocument", "document"),
}

# Description fragments (lower case) → what the operator or the user has to do.
_REASONS = (
    ("bot was blocked by the user", "the user blocked the bot; they must unblock it"),
    (
        "bot can't initiate conversation",
        "the user never started a chat with the bot; they must open it and press Start",
    ),
    ("user is deactivated", "the user's Telegram account was deleted"),
    ("bot was kicked", "the bot was removed from this chat; add it to the group again"),
    ("bot is not a member", "the bot is not a member of this chat; add it to the group"),
    (
        "chat not found",
        "no such chat for this bot: check the chat id and that the bot was added there",
    ),
    ("not enough rights", "the bot may not post this here; a group admin must allow it"),
    ("have no rights to send", "the bot may not post this here; a group admin must allow it"),
    ("chat_write_forbidden", "the bot may not post in this chat; a group admin must allow it"),
    ("need administrator rights", "the bot must be an administrator to post in this channel"),
    ("unauthorized", "the bot token was refused: check SKILLJOBS_TELEGRAM_BOT_TOKEN"),
)
# Answers that mean "not as this kind": the file goes as the next kind instead.
_DOES_NOT_FIT = (
    "too big",
    "too large",
    "photo_invalid_dimensions",
    "image_process_failed",
    "photo_save_file_invalid",
    "video_file_invalid",
)


def _sendable(url: str, allow_hosts: tuple[str, ...]) -> bool:
    """Only public ``https:`` images become photos (the outbound media rule); anything else
    stays in the text as written."""
    try:
        check_url(url, allow_hosts)
    except RefusedURL:
        return False
    return True


def split_markdown_images(text: str, allow_hosts: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """The text without its sendable Markdown images, and their URLs (each once, in order)."""
    urls: list[str] = []

    def take(m: re.Match[str]) -> str:
        url = m.group(2)
        if not _sendable(url, allow_hosts):
            return m.group(0)
        if url not in urls:
            urls.append(url)
        return ""

    rest = MARKDOWN_IMAGE.sub(take, text)
    rest = re.sub(r"[ \t]+\n", "\n", rest)
    rest = re.sub(r"\n{3,}", "\n\n", rest).strip()
    return rest, urls


def reason_for(description: str) -> str:
    """A human reason for a Bot API error description (the description itself follows)."""
    low = description.lower()
    for fragment, human in _REASONS:
        if fragment in low:
            return f"{human} ({description})"
    return description


class TelegramChannel(LimitedChannel):
    name = "telegram"
    supports_caption = True
    converts_markdown_images = True
    monospace = True
    voice_notes = True
    TEXT_LIMIT = TEXT_LIMIT
    RULES = {
        # GIFs go as documents: Telegram keeps them animated there, a photo would be a still.
        "image": rule(10, "jpg jpeg png webp bmp"),
        "video": rule(50, "mp4"),
        "audio": rule(50, "mp3 m4a"),
        # sendVoice: "audio must be in an .OGG file encoded with OPUS" (else it goes as audio)
        "voice": rule(50, "ogg oga opus"),
        "file": rule(50),
    }

    def __init__(
        self,
        http: httpx.AsyncClient,
        token: str,
        *,
        api_base: str = "https://api.telegram.org",
        allow_hosts: tuple[str, ...] | list[str] = (),
        link_for: LinkFor | None = None,
        probe: MediaProbe | None = None,
        lang: str = "en",
    ) -> None:
        super().__init__(link_for=link_for, probe=probe, lang=lang)
        self._http = http
        self._token = token
        self._base = api_base.rstrip("/")
        self._allow_hosts = tuple(allow_hosts)

    def text_size(self, text: str) -> int:
        return utf16_len(text)

    def _url(self, method: str) -> str:
        return f"{self._base}/bot{self._token}/{method}"

    async def _call(
        self, method: str, fields: dict[str, Any], files: dict[str, tuple[str, bytes]] | None = None
    ) -> str:
        """One Bot API call (JSON, or multipart when ``files``); a group that became a
        supergroup is followed once to its new id."""
        for _ in range(2):
            body = await self._call_once(method, fields, files)
            if body.get("ok"):
                result = body.get("result")
                if isinstance(result, dict) and "message_id" in result:
                    return str(result["message_id"])
                return ""
            params = body.get("parameters")
            moved = params.get("migrate_to_chat_id") if isinstance(params, dict) else None
            if moved is None or str(moved) == str(fields.get("chat_id")):
                break
            fields = {**fields, "chat_id": str(moved)}
        desc = str(body.get("description") or f"error {body.get('error_code')}")
        if any(f in desc.lower() for f in _DOES_NOT_FIT):
            raise DoesNotFit(f"Telegram refused it: {desc}")
        raise DeliveryPermanentError(f"telegram {method}: {reason_for(desc)}")

    async def _call_once(
        self, method: str, fields: dict[str, Any], files: dict[str, tuple[str, bytes]] | None
    ) -> dict[str, Any]:
        # The token is part of the URL path: never let it reach an error message.
        if files:
            kwargs: dict[str, Any] = {"data": fields, "files": files}
        else:
            kwargs = {"json": fields}
        resp = await request(self._http, "POST", self._url(method), what=method, **kwargs)
        if resp.status_code == 413:
            raise DoesNotFit("Telegram refused the upload as too large (HTTP 413)")
        return json_body(resp, method)

    def _fields(self, target: Target, *, multipart: bool) -> dict[str, Any]:
        fields: dict[str, Any] = {"chat_id": target.id}
        if target.thread and target.thread.isdigit():  # a forum topic: post in it
            fields["message_thread_id"] = target.thread if multipart else int(target.thread)
        if target.reply_to and target.reply_to.lstrip("-").isdigit():
            reply = {"message_id": int(target.reply_to), "allow_sending_without_reply": True}
            fields["reply_parameters"] = json.dumps(reply) if multipart else reply
        return fields

    # --- text ----------------------------------------------------------------------------

    renders_markdown = True  # text_pieces converts it (delivery.render keeps it)

    def text_pieces(self, text: str) -> list[str]:
        if has_markup(text):
            return list(pieces(text, TELEGRAM, TEXT_LIMIT))
        return super().text_pieces(text)

    async def _post_text(self, target: Target, text: str) -> str:
        fields = {**self._fields(target, multipart=False), "text": text}
        if not isinstance(text, Piece):
            return await self._call("sendMessage", fields)
        try:
            return await self._call("sendMessage", {**fields, "parse_mode": "HTML"})
        except DeliveryPermanentError as exc:
            if "can't parse entities" not in str(exc).lower():
                raise
            log.warning("telegram: the HTML was refused (%s); sent as plain text", exc)
        first = ""
        for i, plain in enumerate(split_text(text.plain, TEXT_LIMIT, utf16_len)):
            place = target if i == 0 else replace(target, reply_to=None)
            mid = await self._call(
                "sendMessage", {**self._fields(place, multipart=False), "text": plain}
            )
            first = first or mid
        return first

    async def _text(self, target: Target, text: str) -> list[str]:
        if isinstance(text, PlainText):  # no Markdown images in plain text
            return await super()._text(target, text)
        rest, images = split_markdown_images(text, self._allow_hosts)
        ids = await super()._text(target, rest) if rest else []
        for url in images:
            fields = self._fields(
                target if not ids else replace(target, reply_to=None), multipart=False
            )
            try:
                mid = await self._call("sendPhoto", {**fields, "photo": url})
            except (DeliveryPermanentError, DoesNotFit):
                # Telegram could not fetch it: the link still reaches the reader
                mid = await self._call("sendMessage", {**fields, "text": url})
            if mid:
                ids.append(mid)
        if not ids:
            raise DeliveryPermanentError("telegram sendMessage: empty text, nothing to send")
        return ids

    # --- media ---------------------------------------------------------------------------

    async def _send_as(self, kind: str, target: Target, path: str, caption: str | None) -> str:
        method, field = _METHODS[kind]
        extra_text = None
        if caption and (utf16_len(caption) > CAPTION_LIMIT or MARKDOWN_IMAGE.search(caption)):
            caption, extra_text = None, caption  # too long for a caption: it follows as text
        fields = self._fields(target, multipart=True)
        plain = None
        if caption:
            fields["caption"] = caption
            converted = pieces(caption, TELEGRAM, CAPTION_LIMIT) if has_markup(caption) else []
            if len(converted) == 1:  # Markdown as HTML when it fits one caption
                fields["caption"], fields["parse_mode"] = str(converted[0]), "HTML"
                plain = converted[0].plain
        name = Path(path).name
        files: dict[str, tuple[str, bytes]] = {}
        if kind == "image":
            await self._check_photo(path)
        elif kind == "video":
            await self._video_details(path, fields, files)
        files[field] = (name, await read_file_async(path))
        try:
            mid = await self._call(method, fields, files)
        except DeliveryPermanentError as exc:
            if plain is None or "can't parse entities" not in str(exc).lower():
                raise
            fields.pop("parse_mode")
            fields["caption"] = plain if utf16_len(plain) <= CAPTION_LIMIT else caption
            mid = await self._call(method, fields, files)
        if extra_text:
            await self._text(replace(target, reply_to=None), extra_text)
        return mid

    async def _check_photo(self, path: str) -> None:
        info = await self.probe.info(path)
        if info is None or not info.width or not info.height:
            return  # unknown: Telegram says so if it minds (PHOTO_INVALID_DIMENSIONS)
        w, h = info.width, info.height
        if w + h > 10000 or max(w, h) / min(w, h) > 20:
            raise DoesNotFit(f"{w}×{h} px is outside the photo bounds (w+h ≤ 10000, ratio ≤ 20)")

    async def _video_details(
        self, path: str, fields: dict[str, Any], files: dict[str, tuple[str, bytes]]
    ) -> None:
        """Duration, size and a thumbnail when ffprobe/ffmpeg are there (optional here)."""
        fields["supports_streaming"] = "true"
        info = await self.probe.info(path)
        if info is not None:
            if info.duration_s:
                fields["duration"] = str(info.duration_s)
            if info.width and info.height:
                fields["width"], fields["height"] = str(info.width), str(info.height)
        thumb = await self.probe.cover(path, max_side=THUMB_SIDE)
        if thumb and len(thumb) < THUMB_BYTES:
            files["thumb_jpg"] = ("thumb.jpg", thumb)
            fields["thumbnail"] = "attach://thumb_jpg"


__all__ = [
    "CAPTION_LIMIT",
    "PHOTO_LIMIT",
    "TEXT_LIMIT",
    "UPLOAD_LIMIT",
    "TelegramChannel",
    "reason_for",
    "split_markdown_images",
]
