"""DingTalk adapter: robot one-to-one messages (``oToMessages/batchSend``) with media uploaded
through the legacy ``media/upload`` API."""

from __future__ import annotations

import json
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

MEDIA_LIMIT = 20 * 1024 * 1024
VOICE_LIMIT = 2 * 1024 * 1024
VOICE_EXT = {".amr", ".mp3", ".wav"}
INVALID_TOKEN_CODES = {
    "InvalidAuthentication",
    "Forbidden.AccessDenied.AccessTokenPermissionDenied",
}
LEGACY_INVALID_TOKEN = {40014, 42001}


class _InvalidToken(Exception):
    pass


class DingTalkChannel(Channel):
    name = "dingtalk"
    supports_caption = False

    def __init__(
        self,
        http: httpx.AsyncClient,
        app_key: str,
        app_secret: str,
        robot_code: str,
        *,
        api_base: str = "https://api.dingtalk.com",
        oapi_base: str = "https://oapi.dingtalk.com",
    ) -> None:
        self._http = http
        self._app_key = app_key
        self._app_secret = app_secret
        self._robot_code = robot_code
        self._api = api_base.rstrip("/")
        self._oapi = oapi_base.rstrip("/")
        self.tokens = TokenCache(self._fetch_token)
        self.legacy_tokens = TokenCache(self._fetch_legacy_token)

    async def _fetch_token(self) -> tuple[str, float]:
        what = "dingtalk accessToken"
        resp = await request(
            self._http,
            "POST",
            f"{self._api}/v1.0/oauth2/accessToken",
            what=what,
            json={"appKey": self._app_key, "appSecret": self._app_secret},
        )
        body = json_body(resp, what)
        if resp.status_code >= 400 or not body.get("accessToken"):
            raise DeliveryPermanentError(f"{what}: {body.get('message') or body.get('code')}")
        return str(body["accessToken"]), float(body.get("expireIn") or 7200)

    async def _fetch_legacy_token(self) -> tuple[str, float]:
        what = "dingtalk gettoken"
        resp = await request(
            self._http,
            "GET",
            f"{self._oapi}/gettoken",
            what=what,
            params={"appkey": self._app_key, "appsecret": self._app_secret},
        )
        body = json_body(resp, what)
        if body.get("errcode", 0) != 0 or not body.get("access_token"):
            raise DeliveryPermanentError(
                f"{what}: {body.get('errmsg')} (errcode {body.get('errcode')})"
            )
        return str(body["access_token"]), float(body.get("expires_in") or 7200)

    async def _upload_once(self, mtype: str, path: str, content: bytes) -> str:
        what = f"dingtalk media upload ({mtype})"
        token = await self.legacy_tokens.get()
        resp = await request(
            self._http,
            "POST",
            f"{self._oapi}/media/upload",
            what=what,
            params={"access_token": token, "type": mtype},
            files={"media": (Path(path).name, content)},
        )
        body = json_body(resp, what)
        code = body.get("errcode", 0)
        if code in LEGACY_INVALID_TOKEN:
            self.legacy_tokens.invalidate(token)
            raise _InvalidToken(str(body.get("errmsg")))
        if code != 0 or not body.get("media_id"):
            raise DeliveryPermanentError(
                f"{what}: {body.get('errmsg') or 'error'} (errcode {code})"
            )
        return str(body["media_id"])

    async def _upload(self, mtype: str, path: str) -> str:
        if file_size(path) > MEDIA_LIMIT:
            raise DeliveryPermanentError(
                f"file too large for dingtalk: {Path(path).name} (limit {MEDIA_LIMIT} bytes)"
            )
        content = await read_file_async(path)
        try:
            return await self._upload_once(mtype, path, content)
        except _InvalidToken:
            try:
                return await self._upload_once(mtype, path, content)
            except _InvalidToken as exc:
                raise DeliveryPermanentError(
                    f"dingtalk media upload: token refused ({exc})"
                ) from exc

    async def _send_once(self, contact: str, msg_key: str, param: dict[str, Any]) -> str:
        what = f"dingtalk batchSend ({msg_key})"
        token = await self.tokens.get()
        resp = await request(
            self._http,
            "POST",
            f"{self._api}/v1.0/robot/oToMessages/batchSend",
            what=what,
            headers={"x-acs-dingtalk-access-token": token},
            json={
                "robotCode": self._robot_code,
                "userIds": [contact],
                "msgKey": msg_key,
                "msgParam": json.dumps(param, ensure_ascii=False),
            },
        )
        body = json_body(resp, what)
        code = body.get("code")
        if code in INVALID_TOKEN_CODES:
            self.tokens.invalidate(token)
            raise _InvalidToken(str(body.get("message") or code))
        if resp.status_code >= 400 or code or body.get("errcode"):
            reason = body.get("message") or body.get("errmsg") or f"HTTP {resp.status_code}"
            raise DeliveryPermanentError(f"{what}: {reason} ({code or body.get('errcode')})")
        if contact in (body.get("invalidStaffIdList") or []):
            raise DeliveryPermanentError(f"{what}: unknown user {contact}")
        if contact in (body.get("flowControlledStaffIdList") or []):
            raise DeliveryTransientError(f"{what}: rate limited for {contact}")
        return str(body.get("processQueryKey", ""))

    async def _send(self, contact: str, msg_key: str, param: dict[str, Any]) -> str:
        try:
            return await self._send_once(contact, msg_key, param)
        except _InvalidToken:
            try:
                return await self._send_once(contact, msg_key, param)
            except _InvalidToken as exc:
                raise DeliveryPermanentError(f"dingtalk batchSend: token refused ({exc})") from exc

    async def send_text(self, contact: str, text: str) -> str:
        if not text.strip():
            raise DeliveryPermanentError("dingtalk batchSend: empty text")
        return await self._send(contact, "sampleText", {"content": text})

    async def send_image(self, contact: str, path: str, caption: str | None = None) -> str:
        media_id = await self._upload("image", path)
        return await self._send(contact, "sampleImageMsg", {"photoURL": media_id})

    async def send_video(self, contact: str, path: str, caption: str | None = None) -> str:
        if Path(path).suffix.lower() != ".mp4":
            return await self.send_file(contact, path)
        media_id = await self._upload("video", path)
        return await self._send(
            contact, "sampleVideo", {"duration": "1", "videoMediaId": media_id, "videoType": "mp4"}
        )

    async def send_audio(self, contact: str, path: str, caption: str | None = None) -> str:
        if Path(path).suffix.lower() not in VOICE_EXT or file_size(path) > VOICE_LIMIT:
            return await self.send_file(contact, path)
        media_id = await self._upload("voice", path)
        return await self._send(contact, "sampleAudio", {"mediaId": media_id, "duration": "1"})

    async def send_file(self, contact: str, path: str, caption: str | None = None) -> str:
        media_id = await self._upload("file", path)
        p = Path(path)
        return await self._send(
            contact,
            "sampleFile",
            {"mediaId": media_id, "fileName": p.name, "fileType": p.suffix.lstrip(".") or "bin"},
        )
