"""Telegram Bot API adapter: sendMessage / sendPhoto / sendVideo / sendAudio / sendDocument.

The only adapter that turns Markdown images (``![alt](url)``) in text into photos.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from delivery.channels.base import (
    MARKDOWN_IMAGE,
    Channel,
    DeliveryPermanentError,
    file_size,
    json_body,
    read_file_async,
    request,
)
from delivery.urlsafety import RefusedURL, check_url

PHOTO_LIMIT = 10 * 1024 * 1024
UPLOAD_LIMIT = 50 * 1024 * 1024
TEXT_LIMIT = 4096
CAPTION_LIMIT = 1024


_METHODS = {
    "photo": "sendPhoto",
    "video": "sendVideo",
    "audio": "sendAudio",
    "document": "sendDocument",
}


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


def _chunks(text: str, size: int) -> list[str]:
    out: list[str] = []
    while len(text) > size:
        cut = text.rfind("\n", 0, size)
        cut = cut if cut > size // 2 else size
        out.append(text[:cut])
        text = text[cut:].lstrip("\n")
    if text:
        out.append(text)
    return out


class TelegramChannel(Channel):
    name = "telegram"
    supports_caption = True
    converts_markdown_images = True

    def __init__(
        self,
        http: httpx.AsyncClient,
        token: str,
        *,
        api_base: str = "https://api.telegram.org",
        allow_hosts: tuple[str, ...] | list[str] = (),
    ) -> None:
        self._http = http
        self._token = token
        self._base = api_base.rstrip("/")
        self._allow_hosts = tuple(allow_hosts)

    def _url(self, method: str) -> str:
        return f"{self._base}/bot{self._token}/{method}"

    async def _call(self, method: str, **kwargs: Any) -> str:
        # The token is part of the URL path: never let it reach an error message.
        resp = await request(self._http, "POST", self._url(method), what=method, **kwargs)
        body = json_body(resp, method)
        if not body.get("ok"):
            desc = body.get("description") or f"error {body.get('error_code', resp.status_code)}"
            raise DeliveryPermanentError(f"telegram {method}: {desc}")
        result = body.get("result")
        if isinstance(result, dict) and "message_id" in result:
            return str(result["message_id"])
        return ""

    async def send_text(self, contact: str, text: str) -> str:
        rest, images = split_markdown_images(text, self._allow_hosts)
        first = ""
        for chunk in _chunks(rest, TEXT_LIMIT):
            mid = await self._call("sendMessage", json={"chat_id": contact, "text": chunk})
            first = first or mid
        for url in images:
            try:
                mid = await self._call("sendPhoto", json={"chat_id": contact, "photo": url})
            except DeliveryPermanentError:
                # Telegram could not fetch it: the link still reaches the reader
                mid = await self._call("sendMessage", json={"chat_id": contact, "text": url})
            first = first or mid
        if not first and not rest and not images:
            raise DeliveryPermanentError("telegram sendMessage: empty text")
        return first

    async def _upload(self, field: str, contact: str, path: str, caption: str | None) -> str:
        size = file_size(path)
        if field == "photo" and size > PHOTO_LIMIT:
            field = "document"
        if size > UPLOAD_LIMIT:
            raise DeliveryPermanentError(
                f"file too large for telegram: {Path(path).name} is {size} bytes "
                f"(limit {UPLOAD_LIMIT})"
            )
        extra_text = None
        if caption and (len(caption) > CAPTION_LIMIT or MARKDOWN_IMAGE.search(caption)):
            caption, extra_text = None, caption
        data = {"chat_id": contact}
        if caption:
            data["caption"] = caption
        content = await read_file_async(path)
        files = {field: (Path(path).name, content)}
        mid = await self._call(_METHODS[field], data=data, files=files)
        if extra_text:
            await self.send_text(contact, extra_text)
        return mid

    async def send_image(self, contact: str, path: str, caption: str | None = None) -> str:
        return await self._upload("photo", contact, path, caption)

    async def send_video(self, contact: str, path: str, caption: str | None = None) -> str:
        return await self._upload("video", contact, path, caption)

    async def send_audio(self, contact: str, path: str, caption: str | None = None) -> str:
        return await self._upload("audio", contact, path, caption)

    async def send_file(self, contact: str, path: str, caption: str | None = None) -> str:
        return await self._upload("document", contact, path, caption)
