"""Fake WeCom API: gettoken, media/upload, message/send and appchat/send.

Enforced as documented: uploads over 5 bytes; image 10 MB JPG/PNG, voice 2 MB AMR, video
10 MB MP4, file 20 MB; text at most 2048 bytes (WeCom would cut it; the fake refuses, so a
test sees it), a video title at most 128 bytes and description 512. ``chats`` are the app's
group chats; ``users`` the members in the app's visible range. A token is refused with 40014
when unknown and 42001 once expired (``tokens.expire_after`` uses, or ``expire_tokens``).
"""

from __future__ import annotations

import itertools
from typing import Any

from tests.fakes.server import FakeServer, Request, Response, Tokens, suffix

MB = 1024 * 1024
UPLOADS = {  # type → (formats or None, limit, errcode when too large)
    "image": ({"jpg", "jpeg", "png"}, 10 * MB, 40009),
    "voice": ({"amr"}, 2 * MB, 40006),
    "video": ({"mp4"}, 10 * MB, 40011),
    "file": (None, 20 * MB, 40006),
}
TEXT_BYTES = 2048


def fail(code: int, msg: str) -> Response:
    return Response(200, {"errcode": code, "errmsg": msg})


class FakeWeCom(FakeServer):
    def __init__(
        self, corp_id: str = "ww1", corp_secret: str = "corp-secret", agent_id: int = 1000002
    ):
        super().__init__()
        self.corp_id, self.corp_secret, self.agent_id = corp_id, corp_secret, agent_id
        self.token_ttl = 7200
        self.tokens = Tokens("wt-")
        self.valid_tokens = self.tokens.valid
        self.media: dict[str, tuple[str, str, bytes]] = {}  # id → (type, filename, bytes)
        self.sent: list[dict[str, Any]] = []
        self.users = {"zhangsan", "lisi"}
        self.chats = {"wrchat1"}  # group chats the app created
        self.untrusted_ip = False
        self._n = itertools.count(1)
        self.route("GET", "/cgi-bin/gettoken", self._token)
        self.route("POST", "/cgi-bin/media/upload", self._upload)
        self.route("POST", "/cgi-bin/message/send", self._send)
        self.route("POST", "/cgi-bin/appchat/send", self._appchat)

    def expire_tokens(self) -> None:
        self.tokens.revoke()

    async def _token(self, req: Request) -> Response:
        if (
            req.query.get("corpid") != self.corp_id
            or req.query.get("corpsecret") != self.corp_secret
        ):
            return fail(40001, "invalid credential")
        tok = self.tokens.issue()
        return Response(
            200, {"errcode": 0, "errmsg": "ok", "access_token": tok, "expires_in": self.token_ttl}
        )

    def _auth(self, req: Request) -> Response | None:
        tok = req.query.get("access_token")
        if not tok:
            return fail(41001, "access_token missing")
        state = self.tokens.check(tok)
        if state == "expired":
            return fail(42001, "access_token expired")
        if state != "ok":
            return fail(40014, "invalid access_token")
        if self.untrusted_ip:
            return fail(60020, "not allow to access from your ip")
        return None

    async def _upload(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        mtype = str(req.query.get("type"))
        up = req.files.get("media")
        if mtype not in UPLOADS or up is None:
            return fail(40004, "invalid media type")
        formats, limit, too_large = UPLOADS[mtype]
        if formats is not None and suffix(up.filename) not in formats:
            return fail(40004, "invalid media type")
        if len(up.content) <= 5:
            return fail(40006, "invalid file size")
        if len(up.content) > limit:
            return fail(too_large, "invalid file size")
        mid = f"m{next(self._n)}"
        self.media[mid] = (mtype, up.filename, up.content)
        return Response(
            200, {"errcode": 0, "errmsg": "", "type": mtype, "media_id": mid, "created_at": "1"}
        )

    def _payload_refusal(self, mtype: str, payload: dict[str, Any]) -> Response | None:
        if mtype in ("text", "markdown"):  # markdown: content of at most 2048 bytes too
            content = str(payload.get("content", ""))
            if not content.strip():
                return fail(44004, "empty content")
            if len(content.encode()) > TEXT_BYTES:
                return fail(45002, "content size out of limit")
            return None
        if mtype not in UPLOADS:
            return fail(40008, "invalid message type")
        found = self.media.get(payload.get("media_id"))
        if found is None or found[0] != mtype:
            return fail(40007, "invalid media_id")
        if mtype == "video":
            if len(str(payload.get("title", "")).encode()) > 128:
                return fail(45003, "title size out of limit")
            if len(str(payload.get("description", "")).encode()) > 512:
                return fail(45004, "description size out of limit")
        return None

    async def _send(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        body = req.json or {}
        if body.get("agentid") != self.agent_id:
            return fail(40056, "invalid agentid")
        if body.get("touser") not in self.users:
            return fail(81013, "user & party & tag all invalid")
        mtype = str(body.get("msgtype"))
        payload = body.get(mtype) or {}
        if (refused := self._payload_refusal(mtype, payload)) is not None:
            return refused
        mid = f"msg{next(self._n)}"
        self.sent.append({"touser": body["touser"], "msgtype": mtype, mtype: payload, "msgid": mid})
        return Response(200, {"errcode": 0, "errmsg": "ok", "invaliduser": "", "msgid": mid})

    async def _appchat(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        body = req.json or {}
        if body.get("chatid") not in self.chats:
            return fail(86003, "chatid not found")
        mtype = str(body.get("msgtype"))
        payload = body.get(mtype) or {}
        if (refused := self._payload_refusal(mtype, payload)) is not None:
            return refused
        mid = f"msg{next(self._n)}"
        self.sent.append({"chatid": body["chatid"], "msgtype": mtype, mtype: payload, "msgid": mid})
        return Response(200, {"errcode": 0, "errmsg": "ok"})
