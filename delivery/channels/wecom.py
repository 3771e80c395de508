"""WeCom (企业微信) adapter: gettoken, media/upload, message/send to a member of the corp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from delivery.channels.base import (
    Channel,
    DeliveryPermanentError,
    DeliveryTransientError,
    TokenCache,
    file_size,
    json_body,
    read_file_async,
    request,
)

INVALID_TOKEN_CODES = {40014, 42001}
BUSY_CODES = {-1, 45009, 45033}  # system busy, API rate limits
IMAGE_LIMIT = 10 * 1024 * 1024
VOICE_LIMIT = 2 * 1024 * 1024
VIDEO_LIMIT = 10 * 1024 * 1024
FILE_LIMIT = 20 * 1024 * 1024


TEXT_BYTES = 2000


def byte_chunks(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` UTF-8 bytes, never splitting a character."""
    out: list[str] = []
    cur: list[str] = []
    size = 0
    for ch in text:
        n = len(ch.encode())
        if size + n > limit and cur:
            out.append("".join(cur))
            cur, size = [], 0
        cur.append(ch)
        size += n
    if cur:
        out.append("".join(cur))
    return out


class _InvalidToken(Exception):
    pass


class WeComChannel(Channel):
    name = "wecom"
    supports_caption = False

    def __init__(
        self,
        http: httpx.AsyncClient,
        corp_id: str,
        corp_secret: str,
        agent_id: str,
        *,
        api_base: str = "https://qyapi.weixin.qq.com",
    ) -> None:
        self._http = http
        self._corp_id = corp_id
        self._corp_secret = corp_secret
        self._agent_id = agent_id
        self._base = api_base.rstrip("/")
        self.tokens = TokenCache(self._fetch_token)

    async def _fetch_token(self) -> tuple[str, float]:
        what = "wecom gettoken"
        resp = await request(
            self._http,
            "GET",
            f"{self._base}/cgi-bin/gettoken",
            what=what,
            params={"corpid": self._corp_id, "corpsecret": self._corp_secret},
        )
        body = json_body(resp, what)
        self._check(body, what)
        return str(body["access_token"]), float(body.get("expires_in") or 7200)

    @staticmethod
    def _check(body: dict[str, Any], what: str) -> None:
        code = body.get("errcode", 0)
        if code == 0:
            return
        reason = f"{what}: {body.get('errmsg') or 'error'} (errcode {code})"
        if code in BUSY_CODES:
            raise DeliveryTransientError(reason)
        raise DeliveryPermanentError(reason)

    async def _call_once(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        token = await self.tokens.get()
        params = {"access_token": token, **kwargs.pop("params", {})}
        resp = await request(
            self._http, method, f"{self._base}{path}", what=what, params=params, **kwargs
        )
        body = json_body(resp, what)
        if body.get("errcode") in INVALID_TOKEN_CODES:
            self.tokens.invalidate(token)
            raise _InvalidToken(str(body.get("errmsg") or body.get("errcode")))
        self._check(body, what)
        return body

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return await self._call_once(method, path, what, **dict(kwargs))
        except _InvalidToken:
            try:
                return await self._call_once(method, path, what, **dict(kwargs))
            except _InvalidToken as exc:
                raise DeliveryPermanentError(f"{what}: access token refused ({exc})") from exc

    async def _upload(self, mtype: str, path: str) -> str:
        content = await read_file_async(path)
        body = await self._call(
            "POST",
            "/cgi-bin/media/upload",
            f"wecom media upload ({mtype})",
            params={"type": mtype},
            files={"media": (Path(path).name, content)},
        )
        return str(body["media_id"])

    async def _send(self, contact: str, msgtype: str, payload: dict[str, Any]) -> str:
        body = await self._call(
            "POST",
            "/cgi-bin/message/send",
            "wecom message send",
            json={
                "touser": contact,
                "agentid": int(self._agent_id) if str(self._agent_id).isdigit() else self._agent_id,
                "msgtype": msgtype,
                msgtype: payload,
            },
        )
        if body.get("invaliduser"):
            raise DeliveryPermanentError(f"wecom message send: invalid user {body['invaliduser']}")
        return str(body.get("msgid", ""))

    async def send_text(self, contact: str, text: str) -> str:
        if not text.strip():
            raise DeliveryPermanentError("wecom message send: empty text")
        first = ""
        for chunk in byte_chunks(text, TEXT_BYTES):  # WeCom caps text at 2048 bytes
            mid = await self._send(contact, "text", {"content": chunk})
            first = first or mid
        return first

    async def send_image(self, contact: str, path: str, caption: str | None = None) -> str:
        if file_size(path) > IMAGE_LIMIT:
            return await self.send_file(contact, path)
        return await self._send(contact, "image", {"media_id": await self._upload("image", path)})

    async def send_video(self, contact: str, path: str, caption: str | None = None) -> str:
        if file_size(path) > VIDEO_LIMIT:
            return await self.send_file(contact, path)
        return await self._send(contact, "video", {"media_id": await self._upload("video", path)})

    async def send_audio(self, contact: str, path: str, caption: str | None = None) -> str:
        # Voice messages must be AMR and short; anything else goes as a file.
        if Path(path).suffix.lower() != ".amr" or file_size(path) > VOICE_LIMIT:
            return await self.send_file(contact, path)
        return await self._send(contact, "voice", {"media_id": await self._upload("voice", path)})

    async def send_file(self, contact: str, path: str, caption: str | None = None) -> str:
        if file_size(path) > FILE_LIMIT:
            raise DeliveryPermanentError(
                f"file too large for wecom: {Path(path).name} (limit {FILE_LIMIT} bytes)"
            )
        return await self._send(contact, "file", {"media_id": await self._upload("file", path)})
