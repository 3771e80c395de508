"""Feishu / Lark adapter: tenant access token, image and file uploads, im/v1/messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from delivery.channels.base import (
    Channel,
    DeliveryPermanentError,
    TokenCache,
    file_size,
    json_body,
    read_file_async,
    request,
)

IMAGE_LIMIT = 10 * 1024 * 1024
FILE_LIMIT = 30 * 1024 * 1024
INVALID_TOKEN_CODES = {99991663, 99991661, 99991668}

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


class _InvalidToken(Exception):
    pass


class FeishuChannel(Channel):
    name = "feishu"
    supports_caption = False

    def __init__(
        self,
        http: httpx.AsyncClient,
        app_id: str,
        app_secret: str,
        *,
        api_base: str = "https://open.feishu.cn",
    ) -> None:
        self._http = http
        self._app_id = app_id
        self._app_secret = app_secret
        self._base = api_base.rstrip("/")
        self.tokens = TokenCache(self._fetch_token)

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
            raise DeliveryPermanentError(f"{what}: {body.get('msg') or body.get('code')}")
        return str(body["tenant_access_token"]), float(body.get("expire") or 7200)

    async def _call_once(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        token = await self.tokens.get()
        headers = {"Authorization": f"Bearer {token}"}
        resp = await request(
            self._http, method, f"{self._base}{path}", what=what, headers=headers, **kwargs
        )
        body = json_body(resp, what)
        code = body.get("code")
        if code in INVALID_TOKEN_CODES:
            self.tokens.invalidate(token)
            raise _InvalidToken(str(body.get("msg") or code))
        if code != 0:
            raise DeliveryPermanentError(f"{what}: {body.get('msg') or 'error'} (code {code})")
        data = body.get("data")
        return data if isinstance(data, dict) else {}

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        """One API call; an expired or revoked token is refreshed once and the call repeated."""
        try:
            return await self._call_once(method, path, what, **kwargs)
        except _InvalidToken:
            try:
                return await self._call_once(method, path, what, **kwargs)
            except _InvalidToken as exc:
                raise DeliveryPermanentError(f"{what}: access token refused ({exc})") from exc

    async def _send(self, contact: str, msg_type: str, content: dict[str, Any]) -> str:
        data = await self._call(
            "POST",
            "/open-apis/im/v1/messages",
            "feishu send message",
            params={"receive_id_type": receive_id_type(contact)},
            json={
                "receive_id": contact,
                "msg_type": msg_type,
                "content": json.dumps(content, ensure_ascii=False),
            },
        )
        return str(data.get("message_id", ""))

    async def _upload_image(self, path: str) -> str:
        content = await read_file_async(path)
        data = await self._call(
            "POST",
            "/open-apis/im/v1/images",
            "feishu image upload",
            data={"image_type": "message"},
            files={"image": (Path(path).name, content)},
        )
        return str(data["image_key"])

    async def _upload_file(self, path: str) -> tuple[str, str]:
        if file_size(path) > FILE_LIMIT:
            raise DeliveryPermanentError(
                f"file too large for feishu: {Path(path).name} (limit {FILE_LIMIT} bytes)"
            )
        ftype = file_type(path)
        content = await read_file_async(path)
        data = await self._call(
            "POST",
            "/open-apis/im/v1/files",
            "feishu file upload",
            data={"file_type": ftype, "file_name": Path(path).name},
            files={"file": (Path(path).name, content)},
        )
        return str(data["file_key"]), ftype

    async def send_text(self, contact: str, text: str) -> str:
        if not text.strip():
            raise DeliveryPermanentError("feishu send message: empty text")
        return await self._send(contact, "text", {"text": text})

    async def send_image(self, contact: str, path: str, caption: str | None = None) -> str:
        if file_size(path) > IMAGE_LIMIT:
            return await self.send_file(contact, path)
        return await self._send(contact, "image", {"image_key": await self._upload_image(path)})

    async def send_video(self, contact: str, path: str, caption: str | None = None) -> str:
        key, ftype = await self._upload_file(path)
        # Only mp4 plays inline ("media"); anything else arrives as a file.
        return await self._send(contact, "media" if ftype == "mp4" else "file", {"file_key": key})

    async def send_audio(self, contact: str, path: str, caption: str | None = None) -> str:
        key, ftype = await self._upload_file(path)
        return await self._send(contact, "audio" if ftype == "opus" else "file", {"file_key": key})

    async def send_file(self, contact: str, path: str, caption: str | None = None) -> str:
        key, _ = await self._upload_file(path)
        return await self._send(contact, "file", {"file_key": key})
