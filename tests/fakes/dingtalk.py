"""Fake DingTalk: new-API accessToken + robot batchSend, legacy gettoken + media/upload.

The real service lives on two hosts (api and oapi), so the fake is two servers:
``FakeDingTalk`` (api) and its ``.oapi``.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from tests.fakes.server import FakeServer, Request, Response


class FakeDingTalkOapi(FakeServer):
    def __init__(self, app_key: str, app_secret: str) -> None:
        super().__init__()
        self.app_key, self.app_secret = app_key, app_secret
        self.valid_tokens: set[str] = set()
        self.media: dict[str, tuple[str, str, bytes]] = {}
        self._n = itertools.count(1)
        self.route("GET", "/gettoken", self._token)
        self.route("POST", "/media/upload", self._upload)

    async def _token(self, req: Request) -> Response:
        if req.query.get("appkey") != self.app_key or req.query.get("appsecret") != self.app_secret:
            return Response(200, {"errcode": 40089, "errmsg": "invalid appkey or appsecret"})
        tok = f"ot-{next(self._n)}"
        self.valid_tokens.add(tok)
        return Response(
            200, {"errcode": 0, "errmsg": "ok", "access_token": tok, "expires_in": 7200}
        )

    async def _upload(self, req: Request) -> Response:
        if req.query.get("access_token") not in self.valid_tokens:
            return Response(200, {"errcode": 40014, "errmsg": "invalid access_token"})
        mtype = req.query.get("type")
        if mtype not in {"image", "voice", "video", "file"} or "media" not in req.files:
            return Response(200, {"errcode": 40004, "errmsg": "invalid media type"})
        mid = f"@lA{next(self._n)}"
        up = req.files["media"]
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
        self.valid_tokens: set[str] = set()
        self.users = {"user001", "user002"}
        self.throttled: set[str] = set()
        self.sent: list[dict[str, Any]] = []
        self.oapi = FakeDingTalkOapi(app_key, app_secret)
        self._n = itertools.count(1)
        self.route("POST", "/v1.0/oauth2/accessToken", self._token)
        self.route("POST", "/v1.0/robot/oToMessages/batchSend", self._send)

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
            return Response(
                400,
                {"code": "invalidClientIdOrSecret", "message": "无效的clientId或者clientSecret"},
            )
        tok = f"dt-{next(self._n)}"
        self.valid_tokens.add(tok)
        return Response(200, {"accessToken": tok, "expireIn": 7200})

    async def _send(self, req: Request) -> Response:
        if req.headers.get("x-acs-dingtalk-access-token") not in self.valid_tokens:
            return Response(
                401, {"code": "InvalidAuthentication", "message": "不合法的access_token"}
            )
        body = req.json or {}
        if body.get("robotCode") != self.robot_code:
            return Response(400, {"code": "invalidParameter.robotCode", "message": "robot 不存在"})
        if not isinstance(body.get("msgParam"), str):
            return Response(
                400, {"code": "invalidParameter", "message": "msgParam must be a string"}
            )
        param = json.loads(body["msgParam"])
        users = body.get("userIds") or []
        invalid = [u for u in users if u not in self.users]
        throttled = [u for u in users if u in self.throttled]
        for u in users:
            if u not in invalid and u not in throttled:
                self.sent.append({"userId": u, "msgKey": body.get("msgKey"), "msgParam": param})
        return Response(
            200,
            {
                "processQueryKey": f"pqk{next(self._n)}",
                "invalidStaffIdList": invalid,
                "flowControlledStaffIdList": throttled,
            },
        )
