"""Fake Feishu/Lark open platform: tenant token, image/file upload, im/v1/messages and replies.

Enforced as documented: images up to 10 MB in the listed formats and 12000 × 12000 px
(GIFs 2000 × 2000), files up to 30 MB, never
empty, with a ``file_type`` from the list (``mp4`` for a ``media`` message, ``opus`` for
``audio``); a ``media`` message carries its cover ``image_key``; a text request body stays
under 150 KB. A group chat (``oc_…``) takes messages unless the bot is not in it
(``outside``); a token can be revoked, or expire after ``tokens.expire_after`` uses (answer
99991663 either way).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from tests.fakes import feishu_card
from tests.fakes.server import FakeServer, Request, Response, Tokens, picture_size, suffix

ID_TYPES = {"open_id", "union_id", "chat_id", "user_id", "email"}
FILE_TYPES = {"opus", "mp4", "pdf", "doc", "xls", "ppt", "stream"}
IMAGE_FORMATS = {"jpg", "jpeg", "png", "webp", "gif", "bmp", "ico", "tif", "tiff", "heic"}
IMAGE_LIMIT = 10 * 1024 * 1024
FILE_LIMIT = 30 * 1024 * 1024
IMAGE_SIDE = 12000  # 上传图片: at most 12000 x 12000 px, GIFs 2000 x 2000
GIF_SIDE = 2000
TEXT_BODY_LIMIT = 150 * 1024
GROUP = "oc_group1"


def fail(code: int, msg: str, status: int = 400) -> Response:
    return Response(status, {"code": code, "msg": msg})


class FakeFeishu(FakeServer):
    def __init__(self, app_id: str = "cli_app", app_secret: str = "app-secret") -> None:
        super().__init__()
        self.app_id, self.app_secret = app_id, app_secret
        self.token_ttl = 7200
        self.tokens = Tokens("t-")
        self.valid_tokens = self.tokens.valid
        self.images: dict[str, bytes] = {}
        self.files: dict[str, tuple[str, str, bytes]] = {}  # key → (file_type, name, bytes)
        self.durations: dict[str, str] = {}  # file key → the duration field of its upload
        self.sent: list[dict[str, Any]] = []
        self.messages: dict[str, str] = {}  # message id → the chat it is in
        self.unreachable = {"ou_blocked"}
        self.outside = {"oc_elsewhere"}  # group chats the bot is not in
        self._n = itertools.count(1)
        self.uuids: dict[str, Response] = {}  # uuid → its answer: one message per uuid
        self.route("POST", "/open-apis/auth/v3/tenant_access_token/internal", self._token)
        self.route("POST", "/open-apis/im/v1/images", self._image)
        self.route("POST", "/open-apis/im/v1/files", self._file)
        self.route("POST", "/open-apis/im/v1/messages", self._message)
        self.route("POST", "/open-apis/im/v1/messages/*", self._reply)

    def revoke_tokens(self) -> None:
        self.tokens.revoke()

    def receive(self, chat_id: str = GROUP) -> str:
        """A message someone wrote in ``chat_id``; returns its id (to reply to)."""
        mid = f"om_in{next(self._n)}"
        self.messages[mid] = chat_id
        return mid

    async def _token(self, req: Request) -> Response:
        body = req.json or {}
        if body.get("app_id") != self.app_id or body.get("app_secret") != self.app_secret:
            return Response(200, {"code": 10014, "msg": "app secret invalid"})
        tok = self.tokens.issue()
        return Response(
            200, {"code": 0, "msg": "ok", "tenant_access_token": tok, "expire": self.token_ttl}
        )

    def _auth(self, req: Request) -> Response | None:
        auth = req.headers.get("authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        if self.tokens.check(token) != "ok":
            return fail(99991663, "Invalid access token for authorization.")
        return None

    async def _image(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        up = req.files.get("image")
        if req.form.get("image_type") != "message" or up is None:
            return fail(234001, "Invalid request param.")
        if suffix(up.filename) not in IMAGE_FORMATS:
            return fail(234011, "Can't regonise the image format.")
        if not up.content:
            return fail(234010, "File's size can't be 0.")
        if len(up.content) > IMAGE_LIMIT:
            return fail(234006, "The file size exceed the max value.")
        side = GIF_SIDE if suffix(up.filename) == "gif" else IMAGE_SIDE
        size = picture_size(up.content)
        if size is not None and max(size) > side:
            # the page gives the bounds, not the code they are refused with
            return fail(234007, f"The image resolution exceeds {side}x{side}.")
        key = f"img_v2_{next(self._n)}"
        self.images[key] = up.content
        return Response(200, {"code": 0, "msg": "success", "data": {"image_key": key}})

    async def _file(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        ftype, up = req.form.get("file_type"), req.files.get("file")
        if ftype not in FILE_TYPES or up is None or not req.form.get("file_name"):
            return fail(234001, "Invalid request param.")
        if ftype in {"mp4", "opus"} and suffix(up.filename) != ftype:
            return fail(234001, f"file_type {ftype} needs a .{ftype} file.")
        if not up.content:
            return fail(234010, "File's size can't be 0.")
        if len(up.content) > FILE_LIMIT:
            return fail(234006, "The file size exceed the max value.")
        key = f"file_v2_{next(self._n)}"
        self.files[key] = (ftype, req.form["file_name"], up.content)
        if "duration" in req.form:
            self.durations[key] = req.form["duration"]
        return Response(200, {"code": 0, "msg": "success", "data": {"file_key": key}})

    def _content(self, req: Request) -> tuple[str, dict[str, Any]] | Response:
        body = req.json or {}
        mtype = body.get("msg_type")
        if not isinstance(body.get("content"), str):
            return fail(230001, "Your request contains an invalid request parameter.")
        if mtype == "text" and len(req.body) > TEXT_BODY_LIMIT:
            return fail(230025, "The length of the message content reaches its limit.")
        content = json.loads(body["content"])
        if mtype == "text" and not str(content.get("text", "")).strip():
            return fail(230001, "text is empty")
        if mtype == "image" and content.get("image_key") not in self.images:
            return fail(230001, "invalid image_key")
        if mtype == "interactive" and (refused := feishu_card.problem(content, len(req.body))):
            return fail(*refused)
        need = {"media": "mp4", "audio": "opus"}.get(str(mtype))
        if mtype in {"file", "media", "audio"}:
            found = self.files.get(content.get("file_key"))
            if found is None or (need is not None and found[0] != need):
                return fail(230001, "invalid file_key")
        if mtype == "media" and content.get("image_key") not in self.images:
            return fail(230001, "a media message needs its cover image_key")
        return str(mtype), content

    def _record(
        self, id_type: str, receive_id: str, mtype: str, content: Any, **extra: Any
    ) -> Response:
        mid = f"om_{next(self._n)}"
        chat = receive_id if id_type == "chat_id" else f"p2p:{receive_id}"
        self.messages[mid] = chat
        self.sent.append(
            {
                "receive_id_type": id_type,
                "receive_id": receive_id,
                "msg_type": mtype,
                "content": content,
                "message_id": mid,
                **extra,
            }
        )
        return Response(200, {"code": 0, "msg": "success", "data": {"message_id": mid}})

    def _target_refusal(self, id_type: str, receive_id: str) -> Response | None:
        if id_type == "chat_id":
            if receive_id in self.outside:
                return fail(230002, "The bot can not be outside the group.")
        elif receive_id.startswith("oc_"):
            return fail(230001, "receive_id_type does not match the receive_id.")
        if receive_id in self.unreachable:
            return fail(230013, "Bot has NO availability to this user.")
        return None

    async def _message(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        id_type = req.query.get("receive_id_type")
        if id_type not in ID_TYPES:
            return fail(230001, "Your request contains an invalid request parameter.")
        receive_id = str((req.json or {}).get("receive_id", ""))
        if (refused := self._target_refusal(id_type, receive_id)) is not None:
            return refused
        parsed = self._content(req)
        if isinstance(parsed, Response):
            return parsed
        key = str((req.json or {}).get("uuid") or "")
        if key and key in self.uuids:
            return self.uuids[key]  # documented: the same uuid within an hour sends once
        answer = self._record(id_type, receive_id, *parsed)
        if key:
            self.uuids[key] = answer
        return answer

    async def _reply(self, req: Request) -> Response:
        if (err := self._auth(req)) is not None:
            return err
        head, _, action = req.path.removeprefix("/open-apis/im/v1/messages/").partition("/")
        if action != "reply":
            return Response(404, {"code": 404, "msg": "no such route"})
        chat = self.messages.get(head)
        if chat is None:
            return fail(230011, "The message was withdrawn.")
        parsed = self._content(req)
        if isinstance(parsed, Response):
            return parsed
        id_type, receive_id = (
            ("chat_id", chat)
            if chat.startswith("oc_")
            else (
                "open_id",
                chat.removeprefix("p2p:"),
            )
        )
        extra = {"in_thread": True} if (req.json or {}).get("reply_in_thread") else {}
        return self._record(id_type, receive_id, *parsed, reply_to=head, **extra)
