"""Fake Feishu/Lark open platform: tenant token, image/file upload, im/v1/messages."""

from __future__ import annotations

import itertools
import json
from typing import Any

from tests.fakes.server import FakeServer, Request, Response

ID_TYPES = {"open_id", "union_id", "chat_id", "user_id", "email"}


class FakeFeishu(FakeServer):
    def __init__(self, app_id: str = "cli_app", app_secret: str = "app-secret") -> None:
        super().__init__()
        self.app_id, self.app_secret = app_id, app_secret
        self.token_ttl = 7200
        self.valid_tokens: set[str] = set()
        self.images: dict[str, bytes] = {}
        self.files: dict[str, tuple[str, str, bytes]] = {}  # key → (file_type, name, bytes)
        self.sent: list[dict[str, Any]] = []
        self.unreachable = {"ou_blocked"}
        self._n = itertools.count(1)
        self.route("POST", "/open-apis/auth/v3/tenant_access_token/internal", self._token)
        self.route("POST", "/open-apis/im/v1/images", self._image)
        self.route("POST", "/open-apis/im/v1/files", self._file)
        self.route("POST", "/open-apis/im/v1/messages", self._message)

    def revoke_tokens(self) -> None:
        self.valid_tokens.clear()

    async def _token(self, req: Request) -> Response:
        body = req.json or {}
        if body.get("app_id") != self.app_id or body.get("app_secret") != self.app_secret:
            return Response(200, {"code": 10014, "msg": "app secret invalid"})
        tok = f"t-{next(self._n)}"
        self.valid_tokens.add(tok)
        return Response(
            200, {"code": 0, "msg": "ok", "tenant_access_token": tok, "expire": self.token_ttl}
        )

    def _auth(self, req: Request) -> Response | None:
        auth = req.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.valid_tokens:
            return Response(
                400, {"code": 99991663, "msg": "Invalid access token for authorization."}
            )
        return None

    async def _image(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        if req.form.get("image_type") != "message" or "image" not in req.files:
            return Response(400, {"code": 234001, "msg": "Invalid request param."})
        key = f"img_v2_{next(self._n)}"
        self.images[key] = req.files["image"].content
        return Response(200, {"code": 0, "msg": "success", "data": {"image_key": key}})

    async def _file(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        ftype = req.form.get("file_type")
        if (
            ftype not in {"opus", "mp4", "pdf", "doc", "xls", "ppt", "stream"}
            or "file" not in req.files
        ):
            return Response(400, {"code": 234001, "msg": "Invalid request param."})
        key = f"file_v2_{next(self._n)}"
        self.files[key] = (ftype, req.form.get("file_name", ""), req.files["file"].content)
        return Response(200, {"code": 0, "msg": "success", "data": {"file_key": key}})

    async def _message(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        id_type = req.query.get("receive_id_type")
        body = req.json or {}
        if id_type not in ID_TYPES or not isinstance(body.get("content"), str):
            return Response(
                400, {"code": 230001, "msg": "Your request contains an invalid request parameter."}
            )
        if body.get("receive_id") in self.unreachable:
            return Response(400, {"code": 230013, "msg": "Bot has NO availability to this user."})
        content = json.loads(body["content"])
        mtype = body.get("msg_type")
        if mtype == "image" and content.get("image_key") not in self.images:
            return Response(400, {"code": 230001, "msg": "invalid image_key"})
        if mtype in {"file", "media", "audio"} and content.get("file_key") not in self.files:
            return Response(400, {"code": 230001, "msg": "invalid file_key"})
        mid = f"om_{next(self._n)}"
        self.sent.append(
            {
                "receive_id_type": id_type,
                "receive_id": body["receive_id"],
                "msg_type": mtype,
                "content": content,
                "message_id": mid,
            }
        )
        return Response(200, {"code": 0, "msg": "success", "data": {"message_id": mid}})
