"""DingTalk adapter: robot messages to a member (``oToMessages/batchSend``) or to a group
(``groupMessages/send``), with media uploaded through the legacy ``media/upload`` API.

Rules (open platform docs "上传媒体文件", "企业机器人发送消息的消息类型", "机器人发送群聊消息"):
uploads of images (jpg gif png bmp, 20 MB), voice (amr mp3 wav, 2 MB), video (mp4, 20 MB)
and files (doc docx xls xlsx ppt pptx zip pdf rar, 20 MB); ``msgParam`` at most 15,000
bytes. Robot messages in a one-to-one chat carry images, voice and files; videos only go to
groups (a video to a person goes as a file). ``sampleAudio`` needs the ``duration`` in
milliseconds, ``sampleVideo`` the ``duration`` in seconds and a cover ``picMediaId`` — with
ffprobe/ffmpeg absent those go as files. A file of another format is zipped (zip is a
format DingTalk takes). ``chat:<id>`` or a ``cid…`` id is
a group (``openConversationId``); the robot APIs have no replies, a ``reply_to`` is ignored.
Both tokens live 2 hours; ``InvalidAuthentication`` (new API) and errcode 40014/42001
(legacy) refresh them once. Text with Markdown goes as ``sampleMarkdown`` (a title and the
text, ``delivery.richtext``).
"""

from __future__ import annotations

import asyncio
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import httpx

from delivery.channels.base import (
    DeliveryPermanentError,
    DeliveryTransientError,
    TokenCache,
    TokenRejected,
    json_body,
    read_file,
    read_file_async,
    request,
    token_key,
)
from delivery.channels.limits import (
    DoesNotFit,
    LimitedChannel,
    LinkFor,
    Target,
    human_size,
    rule,
)
from delivery.channels.probe import MediaProbe
from delivery.richtext import DINGTALK, Piece, has_markup, pieces, title_of

MEDIA_LIMIT = 20 * 1024 * 1024
VOICE_LIMIT = 2 * 1024 * 1024
MSG_PARAM_BYTES = 15_000
TITLE_CHARS = 64  # the title shows in the notification and the chat list
FILE_FORMATS = frozenset("doc docx xls xlsx ppt pptx zip pdf rar".split())
INVALID_TOKEN_CODES = {"InvalidAuthentication"}
LEGACY_INVALID_TOKEN = {40014, 42001}
LEGACY_DOES_NOT_FIT = {40004, 40005, 40006, 40009, 40011, 41005}
REASONS = {
    "Forbidden.AccessDenied.AccessTokenPermissionDenied": (
        "the app lacks the permission to send robot messages (qyapi_robot_sendmsg); grant it "
        "in the developer console"
    ),
    "invalidParameter.robotCode.notExsit": "the robot is not in this group; add it to the group",
    "invalidParameter.invalid": "the robot is not in this group; add it to the group",
    "invalid.openConversationId": "no such group conversation (openConversationId)",
    "bot.stopped": "the group robot was disabled",
    "invalidParameter.robotCode.auth": (
        "the robot code does not belong to this app; check SKILLJOBS_DINGTALK_ROBOT_CODE"
    ),
    "invalidParameter.robotCode.invalid": "invalid robot code; check SKILLJOBS_DINGTALK_ROBOT_CODE",
    "invalidParameter.userIds.invalid": "unknown user id",
}


class DingTalkChannel(LimitedChannel):
    name = "dingtalk"
    supports_caption = False
    TEXT_LIMIT = MSG_PARAM_BYTES - len('{"content":""}')
    RULES = {
        "image": rule(20, "jpg jpeg gif png bmp"),
        "audio": rule(2, "amr mp3 wav"),
        "video": rule(20, "mp4"),
        "file": rule(20),  # other formats are zipped on the way
    }

    def __init__(
        self,
        http: httpx.AsyncClient,
        app_key: str,
        app_secret: str,
        robot_code: str,
        *,
        api_base: str = "https://api.dingtalk.com",
        oapi_base: str = "https://oapi.dingtalk.com",
        link_for: LinkFor | None = None,
        probe: MediaProbe | None = None,
        lang: str = "en",
    ) -> None:
        super().__init__(link_for=link_for, probe=probe, lang=lang)
        self._http = http
        self._app_key = app_key
        self._app_secret = app_secret
        self._robot_code = robot_code
        self._api = api_base.rstrip("/")
        self._oapi = oapi_base.rstrip("/")
        self.tokens = TokenCache(
            self._fetch_token, share=token_key("dingtalk", self._api, app_key, app_secret)
        )
        self.legacy_tokens = TokenCache(
            self._fetch_legacy_token,
            share=token_key("dingtalk-oapi", self._oapi, app_key, app_secret),
        )

    def text_size(self, text: str) -> int:
        # the bytes of the text as it sits, escaped, inside msgParam
        return len(json.dumps(text, ensure_ascii=False).encode()) - 2

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
            raise DeliveryPermanentError(
                f"{what}: {body.get('message') or body.get('code')} — check "
                "SKILLJOBS_DINGTALK_APP_KEY / SKILLJOBS_DINGTALK_APP_SECRET"
            )
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

    # --- media upload (legacy API) ------------------------------------------------------

    async def _upload(self, mtype: str, name: str, content: bytes) -> str:
        what = f"dingtalk media upload ({mtype})"

        async def use(token: str) -> str:
            resp = await request(
                self._http,
                "POST",
                f"{self._oapi}/media/upload",
                what=what,
                params={"access_token": token, "type": mtype},
                files={"media": (name, content)},
            )
            body = json_body(resp, what)
            code = body.get("errcode", 0)
            msg = body.get("errmsg") or "error"
            if code in LEGACY_INVALID_TOKEN:
                raise TokenRejected(f"errcode {code}: {msg}")
            if code in LEGACY_DOES_NOT_FIT:
                raise DoesNotFit(f"DingTalk refused it: {msg} (errcode {code})")
            if code != 0 or not body.get("media_id"):
                raise DeliveryPermanentError(f"{what}: {msg} (errcode {code})")
            return str(body["media_id"])

        return await self.legacy_tokens.call(use, what)

    async def _upload_path(self, mtype: str, path: str) -> str:
        return await self._upload(mtype, Path(path).name, await read_file_async(path))

    # --- robot messages (new API) -------------------------------------------------------

    async def _send(self, target: Target, msg_key: str, param: dict[str, Any]) -> str:
        group = _is_group(target)
        what = f"dingtalk {'groupMessages/send' if group else 'batchSend'} ({msg_key})"
        body: dict[str, Any] = {
            "robotCode": self._robot_code,
            "msgKey": msg_key,
            "msgParam": json.dumps(param, ensure_ascii=False),
        }
        if group:
            path, body["openConversationId"] = "/v1.0/robot/groupMessages/send", target.id
        else:
            path, body["userIds"] = "/v1.0/robot/oToMessages/batchSend", [target.id]

        async def use(token: str) -> dict[str, Any]:
            resp = await request(
                self._http,
                "POST",
                f"{self._api}{path}",
                what=what,
                headers={"x-acs-dingtalk-access-token": token},
                json=body,
            )
            answer = json_body(resp, what)
            code = answer.get("code")
            if code in INVALID_TOKEN_CODES or (resp.status_code == 401 and not code):
                raise TokenRejected(str(answer.get("message") or code or "HTTP 401"))
            if resp.status_code >= 400 or code or answer.get("errcode"):
                raise _error(what, resp.status_code, answer)
            return answer

        answer = await self.tokens.call(use, what)
        if target.id in (answer.get("invalidStaffIdList") or []):
            raise DeliveryPermanentError(
                f"{what}: unknown user {target.id}: not a member of the organization, or "
                "outside the app's visible range"
            )
        if target.id in (answer.get("flowControlledStaffIdList") or []):
            raise DeliveryTransientError(f"{what}: rate limited for {target.id}")
        return str(answer.get("processQueryKey", ""))

    renders_markdown = True  # text_pieces converts it (delivery.render keeps it)

    def text_pieces(self, text: str) -> list[str]:
        if has_markup(text):
            # room for the title (at most TITLE_CHARS characters, 4 bytes each) in msgParam
            room = MSG_PARAM_BYTES - len('{"title":"","text":""}') - 4 * TITLE_CHARS
            return list(pieces(text, DINGTALK, room, self.text_size))
        return super().text_pieces(text)

    async def _post_text(self, target: Target, text: str) -> str:
        if isinstance(text, Piece):
            param = {"title": title_of(text.plain, TITLE_CHARS) or "…", "text": str(text)}
            return await self._send(target, "sampleMarkdown", param)
        return await self._send(target, "sampleText", {"content": text})

    async def _send_as(self, kind: str, target: Target, path: str, caption: str | None) -> str:
        if kind == "image":
            media_id = await self._upload_path("image", path)
            return await self._send(target, "sampleImageMsg", {"photoURL": media_id})
        if kind == "audio":
            info = await self.probe.info(path)
            if info is None or info.duration_ms is None:
                why = self.probe.missing or "the audio's duration could not be read"
                raise DoesNotFit(f"a voice message needs its duration: {why}")
            media_id = await self._upload_path("voice", path)
            param = {"mediaId": media_id, "duration": str(info.duration_ms)}
            return await self._send(target, "sampleAudio", param)
        if kind == "video":
            return await self._send_video(target, path)
        return await self._send_file(target, path)

    async def _send_video(self, target: Target, path: str) -> str:
        if not _is_group(target):
            raise DoesNotFit("DingTalk robot messages to a person carry no video (groups only)")
        info = await self.probe.info(path)
        cover = await self.probe.cover(path)
        if info is None or info.duration_s is None or cover is None:
            why = self.probe.missing or "its duration or a cover frame could not be read"
            raise DoesNotFit(f"a video message needs its duration and a cover: {why}")
        video_id = await self._upload_path("video", path)
        cover_id = await self._upload("image", f"{Path(path).stem}-cover.jpg", cover)
        param = {
            "duration": str(info.duration_s),
            "videoMediaId": video_id,
            "videoType": "mp4",
            "picMediaId": cover_id,
        }
        return await self._send(target, "sampleVideo", param)

    async def _send_file(self, target: Target, path: str) -> str:
        p = Path(path)
        ext = p.suffix.lower().lstrip(".")
        if ext in FILE_FORMATS:
            name, content = p.name, await read_file_async(path)
        else:
            name, content = f"{p.name}.zip", await asyncio.to_thread(_zipped, path)
            if len(content) > MEDIA_LIMIT:
                raise DoesNotFit(f"zipped it is {human_size(len(content))}, over the 20 MB limit")
            ext = "zip"
        media_id = await self._upload("file", name, content)
        return await self._send(
            target, "sampleFile", {"mediaId": media_id, "fileName": name, "fileType": ext}
        )


def _is_group(target: Target) -> bool:
    """A group conversation: ``chat:<id>``, or an ``openConversationId`` (``cid…``)."""
    return target.chat or target.id.startswith("cid")


def _zipped(path: str) -> bytes:
    """``path`` alone in a zip archive, in memory."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(Path(path).name, read_file(path))
    return buf.getvalue()


def _error(what: str, status: int, answer: dict[str, Any]) -> Exception:
    code = answer.get("code") or answer.get("errcode")
    msg = answer.get("message") or answer.get("errmsg") or f"HTTP {status}"
    human = REASONS.get(code) if isinstance(code, str) else None
    if human:
        return DeliveryPermanentError(f"{what}: {human} ({msg}, {code})")
    return DeliveryPermanentError(f"{what}: {msg} ({code})")


__all__ = ["INVALID_TOKEN_CODES", "MEDIA_LIMIT", "VOICE_LIMIT", "DingTalkChannel"]
