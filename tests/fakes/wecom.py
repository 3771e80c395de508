"""Fake WeCom API: gettoken, media/upload, message/send."""

from __future__ import annotations

import itertools
from typing import Any

from tests.fakes.server import FakeServer, Request, Response


class FakeWeCom(FakeServer):
    def __init__(
        self, corp_id: str = "ww1", corp_secret: str = "corp-secret", agent_id: int = 1000002
    ):
        super().__init__()
        self.corp_id, self.corp_secret, self.agent_id = corp_id, corp_secret, agent_id
        self.token_ttl = 7200
        self.valid_tokens: set[str] = set()
        self.media: dict[str, tuple[str, str, bytes]] = {}  # id → (type, filename, bytes)
        self.sent: list[dict[str, Any]] = []
        self.users = {"zhangsan", "lisi"}
        self._n = itertools.count(1)
        self.route("GET", "/cgi-bin/gettoken", self._token)
        self.route("POST", "/cgi-bin/media/upload", self._upload)
        self.route("POST", "/cgi-bin/message/send", self._send)

    def expire_tokens(self) -> None:
        self.valid_tokens.clear()

    async def _token(self, req: Request) -> Response:
        if (
            req.query.get("corpid") != self.corp_id
            or req.query.get("corpsecret") != self.corp_secret
        ):
            return Response(200, {"errcode": 40001, "errmsg": "invalid credential"})
        tok = f"wt-{next(self._n)}"
        self.valid_tokens.add(tok)
        return Response(
            200, {"errcode": 0, "errmsg": "ok", "access_token": tok, "expires_in": self.token_ttl}
        )

    def _auth(self, req: Request) -> Response | None:
        tok = req.query.get("access_token")
        if not tok:
            return Response(200, {"errcode": 41001, "errmsg": "access_token missing"})
        if tok not in self.valid_tokens:
            return Response(200, {"errcode": 42001, "errmsg": "access_token expired"})
        return None

    async def _upload(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        mtype = req.query.get("type")
        if mtype not in {"image", "voice", "video", "file"} or "media" not in req.files:
            return Response(200, {"errcode": 40004, "errmsg": "invalid media type"})
        mid = f"m{next(self._n)}"
        up = req.files["media"]
        self.media[mid] = (mtype, up.filename, up.content)
        return Response(
            200, {"errcode": 0, "errmsg": "", "type": mtype, "media_id": mid, "created_at": "1"}
        )

    async def _send(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        body = req.json or {}
        if body.get("agentid") != self.agent_id:
            return Response(200, {"errcode": 40056, "errmsg": "invalid agentid"})
        if body.get("touser") not in self.users:
            return Response(200, {"errcode": 81013, "errmsg": "user & party & tag all invalid"})
        mtype = body.get("msgtype")
        payload = body.get(mtype) or {}
        if mtype != "text" and payload.get("media_id") not in self.media:
            return Response(200, {"errcode": 40007, "errmsg": "invalid media_id"})
        mid = f"msg{next(self._n)}"
        self.sent.append({"touser": body["touser"], "msgtype": mtype, mtype: payload, "msgid": mid})
        return Response(200, {"errcode": 0, "errmsg": "ok", "invaliduser": "", "msgid": mid})
