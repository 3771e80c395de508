"""Fake DingTalk: new-API accessToken + robot batchSend / groupMessages, legacy gettoken +
media/upload.

The real service lives on two hosts (api and oapi), so the fake is two servers:
``FakeDingTalk`` (api) and its ``.oapi``. Enforced as documented: uploads of images (jpg
gif png bmp), voice (amr mp3 wav, 2 MB), video (mp4) and files (doc docx xls xlsx ppt pptx
zip pdf rar), 20 MB each; ``msgParam`` at most 15,000 bytes; every field of each message
type (``sampleAudio`` a duration in ms, ``sampleVideo`` a duration in seconds, the video's
media id, ``videoType`` and a cover ``picMediaId``); a video goes to groups only (robot
messages to a person carry images, voice and files). ``groups`` are conversations the robot
is in, ``robotless`` ones it is not. Tokens: new API ``InvalidAuthentication``, legacy
errcode 40014 (unknown) / 42001 (expired); ``expire_after`` uses each.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from tests.fakes.server import FakeServer, Request, Response, Tokens, suffix

MB = 1024 * 1024
UPLOADS = {  # type → (formats, limit)
    "image": ({"jpg", "jpeg", "gif", "png", "bmp"}, 20 * MB),
    "voice": ({"amr", "mp3", "wav"}, 2 * MB),
    "video": ({"mp4"}, 20 * MB),
    "file": ({"doc", "docx", "xls", "xlsx", "ppt", "pptx", "zip", "pdf", "rar"}, 20 * MB),
}
MSG_PARAM_BYTES = 15_000
GROUP = "cidGroup1+abc=="


def _positive(value: Any) -> bool:
    """A whole number written as a string, as the message types' durations are."""
    return isinstance(value, str) and value.isdigit() and int(value) > 0


def bad(code: str, message: str, status: int = 400) -> Response:
    return Response(status, {"code": code, "message": message})


class FakeDingTalkOapi(FakeServer):
    def __init__(self, app_key: str, app_secret: str) -> None:
        super().__init__()
        self.app_key, self.app_secret = app_key, app_secret
        self.tokens = Tokens("ot-")
        self.valid_tokens = self.tokens.valid
        self.media: dict[str, tuple[str, str, bytes]] = {}
        self._n = itertools.count(1)
        self.route("GET", "/gettoken", self._token)
        self.route("POST", "/media/upload", self._upload)

    async def _token(self, req: Request) -> Response:
        if req.query.get("appkey") != self.app_key or req.query.get("appsecret") != self.app_secret:
            return Response(200, {"errcode": 40089, "errmsg": "invalid appkey or appsecret"})
        tok = self.tokens.issue()
        return Response(
            200, {"errcode": 0, "errmsg": "ok", "access_token": tok, "expires_in": 7200}
        )

    async def _upload(self, req: Request) -> Response:
        state = self.tokens.check(req.query.get("access_token"))
        if state == "expired":
            return Response(200, {"errcode": 42001, "errmsg": "access_token expired"})
        if state != "ok":
            return Response(200, {"errcode": 40014, "errmsg": "不合法的access_token"})
        mtype = str(req.query.get("type"))
        up = req.files.get("media")
        if mtype not in UPLOADS or up is None:
            return Response(200, {"errcode": 40004, "errmsg": "不合法的媒体文件类型"})
        formats, limit = UPLOADS[mtype]
        if suffix(up.filename) not in formats:
            return Response(200, {"errcode": 40005, "errmsg": "不合法的文件类型"})
        if not up.content or len(up.content) > limit:
            return Response(200, {"errcode": 40006, "errmsg": "不合法的文件大小"})
        mid = f"@lA{next(self._n)}"
        self.media[mid] = (mtype, up.filename, up.content)
        return Response(
            200, {"errcode": 0, "errmsg": "ok", "media_id": mid, "type": mtype, "created_at": 1}
        )


class FakeDingTalk(FakeServer):
    def __init__(
        self,
        app_key: str = "dingkey",
        app_secret: str = "ding-secret",
        robot_code: str = "dingrobot",
    ) -> None:
        super().__init__()
        self.app_key, self.app_secret, self.robot_code = app_key, app_secret, robot_code
        self.tokens = Tokens("dt-")
        self.valid_tokens = self.tokens.valid
        self.users = {"user001", "user002"}
        self.throttled: set[str] = set()
        self.groups = {GROUP}
        self.robotless = {"cidNoRobot=="}
        self.permission = True  # qyapi_robot_sendmsg granted
        self.sent: list[dict[str, Any]] = []
        self.oapi = FakeDingTalkOapi(app_key, app_secret)
        self._n = itertools.count(1)
        self.route("POST", "/v1.0/oauth2/accessToken", self._token)
        self.route("POST", "/v1.0/robot/oToMessages/batchSend", self._batch_send)
        self.route("POST", "/v1.0/robot/groupMessages/send", self._group_send)

    def start(self) -> FakeDingTalk:
        self.oapi.start()
        super().start()
        return self

    def stop(self) -> None:
        super().stop()
        self.oapi.stop()

    async def _token(self, req: Request) -> Response:
        body = req.json or {}
        if body.get("appKey") != self.app_key or body.get("appSecret") != self.app_secret:
            return bad("invalidClientIdOrSecret", "无效的clientId或者clientSecret")
        return Response(200, {"accessToken": self.tokens.issue(), "expireIn": 7200})

    def _common(self, req: Request) -> tuple[str, dict[str, Any]] | Response:
        """Token, permission, robot and message checks of both send APIs."""
        if self.tokens.check(req.headers.get("x-acs-dingtalk-access-token")) != "ok":
            return bad("InvalidAuthentication", "不合法的access_token")
        if not self.permission:
            return bad(
                "Forbidden.AccessDenied.AccessTokenPermissionDenied",
                "没有调用该接口的权限 (qyapi_robot_sendmsg)",
                403,
            )
        body = req.json or {}
        if body.get("robotCode") != self.robot_code:
            return bad("invalidParameter.robotCode.notExsit", "robot 不存在")
        raw = body.get("msgParam")
        if not isinstance(raw, str):
            return bad("invalidParameter", "msgParam must be a string")
        if len(raw.encode()) > MSG_PARAM_BYTES:
            return bad("invalidParameter.msgParam.invalid", "msgParam 超过 15000 字节")
        key = str(body.get("msgKey"))
        param = json.loads(raw)
        problem = self._param_problem(key, param)
        if problem:
            return bad("invalidParameter.msgParam.invalid", f"{key}: {problem}")
        return key, param

    def _media_is(self, media_id: Any, mtype: str) -> bool:
        found = self.oapi.media.get(media_id)
        return found is not None and found[0] == mtype

    def _param_problem(self, key: str, p: dict[str, Any]) -> str | None:
        if key == "sampleText":
            return None if str(p.get("content", "")).strip() else "content is required"
        if key == "sampleMarkdown":
            ok = str(p.get("title", "")).strip() and str(p.get("text", "")).strip()
            return None if ok else "title and text are required"
        if key == "sampleImageMsg":
            return None if self._media_is(p.get("photoURL"), "image") else "photoURL"
        if key == "sampleFile":
            ok = (
                self._media_is(p.get("mediaId"), "file") and p.get("fileName") and p.get("fileType")
            )
            return None if ok else "mediaId, fileName and fileType are required"
        if key == "sampleAudio":
            ok = self._media_is(p.get("mediaId"), "voice") and _positive(p.get("duration"))
            return None if ok else "mediaId and duration (ms) are required"
        if key == "sampleVideo":
            ok = (
                _positive(p.get("duration"))
                and self._media_is(p.get("videoMediaId"), "video")
                and p.get("videoType") == "mp4"
                and self._media_is(p.get("picMediaId"), "image")
            )
            return None if ok else "duration (s), videoMediaId, videoType and picMediaId"
        return "unknown msgKey"

    async def _batch_send(self, req: Request) -> Response:
        checked = self._common(req)
        if isinstance(checked, Response):
            return checked
        key, param = checked
        if key == "sampleVideo":
            return bad("invalidParameter.msgKey.invalid", "单聊机器人消息不支持视频 (sampleVideo)")
        users = (req.json or {}).get("userIds") or []
        invalid = [u for u in users if u not in self.users]
        throttled = [u for u in users if u in self.throttled]
        for u in users:
            if u not in invalid and u not in throttled:
                self.sent.append({"userId": u, "msgKey": key, "msgParam": param})
        return Response(
            200,
            {
                "processQueryKey": f"pqk{next(self._n)}",
                "invalidStaffIdList": invalid,
                "flowControlledStaffIdList": throttled,
            },
        )

    async def _group_send(self, req: Request) -> Response:
        checked = self._common(req)
        if isinstance(checked, Response):
            return checked
        key, param = checked
        conv = (req.json or {}).get("openConversationId")
        if conv in self.robotless:
            return bad("invalidParameter.robotCode.notExsit", "机器人不存在")
        if conv not in self.groups:
            return bad("invalid.openConversationId", "无效的openConversationId")
        self.sent.append({"openConversationId": conv, "msgKey": key, "msgParam": param})
        return Response(200, {"processQueryKey": f"pqk{next(self._n)}"})
