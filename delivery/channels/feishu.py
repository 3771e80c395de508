"""Feishu / Lark adapter: tenant access token, image and file uploads, im/v1/messages.

Limits (open platform docs "上传图片", "上传文件", "发送消息", "发送消息内容结构"): images up to
10 MB (JPG JPEG PNG WEBP GIF BMP ICO TIFF HEIC) and 12000 × 12000 px (GIFs 2000 × 2000; a
bigger picture goes as a file, as the page advises), files up to 30 MB and never empty, with
``file_type`` ``opus`` / ``mp4`` / ``pdf`` / ``doc`` / ``xls`` / ``ppt`` / ``stream``; a
``media`` (video) message is an mp4 plus a cover image, an ``audio`` message an opus file.
The tenant access token lives at most 2 hours; a refused token (99991663, 99991664,
99991668, 99991671) is refreshed once. ``oc_…`` (or ``chat:<id>``) is a group chat
(``receive_id_type=chat_id``); replies go through ``/messages/{message_id}/reply``.
Text with Markdown goes as an interactive card (JSON 2.0, a ``markdown`` element, at most
30 KB: ``delivery.richtext``); a card Feishu refuses goes again as plain text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from delivery.channels.base import (
    SEND_KEY,
    DeliveryPermanentError,
    DeliveryTransientError,
    TokenCache,
    TokenRejected,
    json_body,
    read_file_async,
    request,
    token_key,
)
from delivery.channels.limits import (
    DoesNotFit,
    LimitedChannel,
    LinkFor,
    Target,
    after_first,
    rule,
    split_text,
)
from delivery.channels.probe import MediaProbe
from delivery.richtext import FEISHU, Piece, feishu_card, has_markup, pieces, title_of

log = logging.getLogger(__name__)

_AT_TAG = re.compile(r"<(/?at\b)", re.I)


def no_mentions(text: str) -> str:
    """A text message reads ``<at user_id="all">`` as a mention: text a result carries must
    not be able to @ anyone (a zero-width space keeps the tag as it reads)."""
    return _AT_TAG.sub("<\u200b\\1", text) if "<" in text else text


IMAGE_LIMIT = 10 * 1024 * 1024
FILE_LIMIT = 30 * 1024 * 1024
# A text message's request body may be 150 KB: pieces are cut well under it, measured as
# the bytes of the text once escaped into ``content`` and again into the request body.
TEXT_BYTES = 100_000
#: a card's request may be 30 KB: its Markdown is cut well under that, measured escaped
CARD_BYTES = 25_000
#: the card was refused as such (invalid content, too large): it goes again as text
CARD_REFUSED_CODES = {230099, 230025, 11310}
INVALID_TOKEN_CODES = {99991661, 99991663, 99991664, 99991668, 99991671}
BUSY_CODES = {230020, 99991400}  # frequency limits
IMAGE_UPLOAD = "feishu image upload"
DOES_NOT_FIT_CODES = {234006, 234010, 234011}  # too large, empty, unreadable image
IMAGE_SIDE = 12000  # 上传图片: resolution at most 12000 x 12000, GIFs 2000 x 2000
GIF_SIDE = 2000
REASONS = {
    230002: "the bot is not in this group chat; add the app's bot to the group",
    230006: "the app's bot capability is off; enable Bot in the developer console and publish",
    230013: "the user is outside the app's availability range; add them and publish a version",
    230027: "the app lacks a permission (im:message / im:resource); add it and publish",
    99991672: "the app lacks a permission (im:message / im:resource); add it and publish",
    230018: "the group settings forbid this (only admins may post?)",
    230025: "the message is too long for Feishu",
}

_FILE_TYPES = {
    ".opus": "opus",
    ".mp4": "mp4",
    ".pdf": "pdf",
    ".doc": "doc",
    ".docx": "doc",
    ".xls": "xls",
    ".xlsx": "xls",
    ".ppt": "ppt",
    ".pptx": "ppt",
}


def receive_id_type(contact: str) -> str:
    """Which kind of id ``contact`` is, by its shape."""
    if "@" in contact:
        return "email"
    if contact.startswith("ou_"):
        return "open_id"
    if contact.startswith("on_"):
        return "union_id"
    if contact.startswith("oc_"):
        return "chat_id"
    return "user_id"


def file_type(path: str) -> str:
    return _FILE_TYPES.get(Path(path).suffix.lower(), "stream")


def _escaped(text: str) -> int:
    inner = json.dumps(text, ensure_ascii=False)[1:-1]
    return len(json.dumps(inner, ensure_ascii=False).encode()) - 2


class FeishuChannel(LimitedChannel):
    name = "feishu"
    monospace = True
    dedups = True  # ``uuid`` (the ledger key): a repeat within an hour is not sent again
    supports_caption = False
    thread_by_reply = True
    TEXT_LIMIT = TEXT_BYTES
    RULES = {
        "image": rule(10, "jpg jpeg png webp gif bmp ico tif tiff heic"),
        "video": rule(30, "mp4"),
        "audio": rule(30, "opus"),
        "file": rule(30),
    }

    def __init__(
        self,
        http: httpx.AsyncClient,
        app_id: str,
        app_secret: str,
        *,
        api_base: str = "https://open.feishu.cn",
        link_for: LinkFor | None = None,
        probe: MediaProbe | None = None,
        lang: str = "en",
    ) -> None:
        super().__init__(link_for=link_for, probe=probe, lang=lang)
        self._http = http
        self._app_id = app_id
        self._app_secret = app_secret
        self._base = api_base.rstrip("/")
        self.tokens = TokenCache(
            self._fetch_token, share=token_key("feishu", self._base, app_id, app_secret)
        )

    def text_size(self, text: str) -> int:
        return _escaped(text)

    async def _fetch_token(self) -> tuple[str, float]:
        what = "feishu tenant_access_token"
        resp = await request(
            self._http,
            "POST",
            f"{self._base}/open-apis/auth/v3/tenant_access_token/internal",
            what=what,
            json={"app_id": self._app_id, "app_secret": self._app_secret},
        )
        body = json_body(resp, what)
        if body.get("code") != 0 or not body.get("tenant_access_token"):
            raise DeliveryPermanentError(
                f"{what}: {body.get('msg') or body.get('code')} — check "
                "SKILLJOBS_FEISHU_APP_ID / SKILLJOBS_FEISHU_APP_SECRET"
            )
        return str(body["tenant_access_token"]), float(body.get("expire") or 7200)

    async def _call(self, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        """One POST; an expired or revoked token is refreshed once and the call repeated."""

        async def use(token: str) -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {token}"}
            resp = await request(
                self._http, "POST", f"{self._base}{path}", what=what, headers=headers, **kwargs
            )
            body = json_body(resp, what)
            code = body.get("code")
            msg = str(body.get("msg") or "error")
            if code in INVALID_TOKEN_CODES:
                raise TokenRejected(f"code {code}: {msg}")
            if code != 0:
                raise _error(what, code, msg)
            data = body.get("data")
            return data if isinstance(data, dict) else {}

        return await self.tokens.call(use, what)

    # --- sends -----------------------------------------------------------------------------

    async def _send(self, target: Target, msg_type: str, content: dict[str, Any]) -> str:
        body = {"msg_type": msg_type, "content": json.dumps(content, ensure_ascii=False)}
        if (key := SEND_KEY.get()) is not None:
            # the platform sends one message per uuid within an hour: one per request of the
            # send, the same again when the send is repeated (a new upload's key differs)
            body["uuid"] = hashlib.sha256(key.next().encode()).hexdigest()[:50]
        if target.reply_to:
            # in a thread: the reply goes into it (reply_in_thread, docs/channels.md)
            answer = {**body, "reply_in_thread": True} if target.thread else body
            try:
                data = await self._call(
                    f"/open-apis/im/v1/messages/{target.reply_to}/reply",
                    "feishu reply message",
                    json=answer,
                )
                return str(data.get("message_id", ""))
            except DeliveryPermanentError:
                pass  # the message is gone or not ours to answer: say it in the chat instead
            target = replace(target, reply_to=None)
        id_type = "chat_id" if target.chat else receive_id_type(target.id)
        data = await self._call(
            "/open-apis/im/v1/messages",
            "feishu send message",
            params={"receive_id_type": id_type},
            json={"receive_id": target.id, **body},
        )
        return str(data.get("message_id", ""))

    renders_markdown = True  # text_pieces converts it (delivery.render keeps it)

    def text_pieces(self, text: str) -> list[str]:
        if has_markup(text):
            return list(pieces(text, FEISHU, CARD_BYTES, _escaped))
        return super().text_pieces(text)

    async def _post_text(self, target: Target, text: str) -> str:
        if not isinstance(text, Piece):
            return await self._send(target, "text", {"text": no_mentions(text)})
        try:
            card = feishu_card(text, summary=title_of(text.plain))
            return await self._send(target, "interactive", card)
        except DeliveryPermanentError as exc:
            found = re.search(r"\(code (\d+)\)$", str(exc))
            if not found or int(found.group(1)) not in CARD_REFUSED_CODES:
                raise
            log.warning("feishu: the card was refused (%s); sent as plain text", exc)
        first = ""
        for i, plain in enumerate(split_text(text.plain, TEXT_BYTES, _escaped)):
            place = target if i == 0 else after_first(target)
            mid = await self._send(place, "text", {"text": no_mentions(plain)})
            first = first or mid
        return first

    async def _send_as(self, kind: str, target: Target, path: str, caption: str | None) -> str:
        if kind == "image":
            await self._check_resolution(path)
            return await self._send(target, "image", {"image_key": await self._upload_image(path)})
        if kind == "video":
            # An inline video is an mp4 plus its cover; without a cover it goes as a file.
            cover = await self.probe.cover(path)
            if cover is None:
                why = self.probe.missing or "no frame could be read for the cover"
                raise DoesNotFit(f"a video message needs a cover image: {why}")
            info = await self.probe.info(path)
            key = await self._upload_file(path, "mp4", info.duration_ms if info else None)
            image_key = await self._upload_image_bytes("cover.jpg", cover)
            return await self._send(target, "media", {"file_key": key, "image_key": image_key})
        if kind == "audio":
            info = await self.probe.info(path)
            key = await self._upload_file(path, "opus", info.duration_ms if info else None)
            return await self._send(target, "audio", {"file_key": key})
        key = await self._upload_file(path, file_type(path), None)
        return await self._send(target, "file", {"file_key": key})

    async def _check_resolution(self, path: str) -> None:
        """Pictures over the upload's resolution bounds go as files (seen with ffprobe when
        present; without it the upload's refusal says so)."""
        info = await self.probe.info(path)
        if info is None or not info.width or not info.height:
            return
        side = GIF_SIDE if Path(path).suffix.lower() == ".gif" else IMAGE_SIDE
        if max(info.width, info.height) > side:
            raise DoesNotFit(f"{info.width}×{info.height} px is over {side}×{side}")

    async def _upload_image(self, path: str) -> str:
        return await self._upload_image_bytes(Path(path).name, await read_file_async(path))

    async def _upload_image_bytes(self, name: str, content: bytes) -> str:
        data = await self._call(
            "/open-apis/im/v1/images",
            IMAGE_UPLOAD,
            data={"image_type": "message"},
            files={"image": (name, content)},
        )
        return str(data["image_key"])

    async def _upload_file(self, path: str, ftype: str, duration_ms: int | None) -> str:
        fields = {"file_type": ftype, "file_name": Path(path).name}
        if duration_ms:
            fields["duration"] = str(duration_ms)
        content = await read_file_async(path)
        data = await self._call(
            "/open-apis/im/v1/files",
            "feishu file upload",
            data=fields,
            files={"file": (Path(path).name, content)},
        )
        return str(data["file_key"])


def _error(what: str, code: object, msg: str) -> Exception:
    """The right exception for a Feishu error body. Any refusal of an image upload (its
    234xxx codes: size, format, resolution…) sends the picture as a file instead."""
    image_refused = what == IMAGE_UPLOAD and isinstance(code, int) and code // 1000 == 234
    if code in DOES_NOT_FIT_CODES or image_refused:
        return DoesNotFit(f"Feishu refused it: {msg} (code {code})")
    if code in BUSY_CODES:
        return DeliveryTransientError(f"{what}: {msg} (code {code})")
    human = REASONS.get(code) if isinstance(code, int) else None
    if human:
        return DeliveryPermanentError(f"{what}: {human} ({msg}, code {code})")
    return DeliveryPermanentError(f"{what}: {msg} (code {code})")


__all__ = [
    "FILE_LIMIT",
    "IMAGE_LIMIT",
    "INVALID_TOKEN_CODES",
    "FeishuChannel",
    "file_type",
    "receive_id_type",
]
