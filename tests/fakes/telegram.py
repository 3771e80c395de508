"""Fake Telegram Bot API (``/bot<token>/<method>``)."""

from __future__ import annotations

import itertools
from typing import Any

from tests.fakes.server import FakeServer, Request, Response

MEDIA_FIELDS = {
    "sendPhoto": "photo",
    "sendVideo": "video",
    "sendAudio": "audio",
    "sendDocument": "document",
}


class FakeTelegram(FakeServer):
    def __init__(self, token: str = "123:ABC") -> None:
        super().__init__()
        self.token = token
        self.known_chats = {"1001", "1002"}
        self.sent: list[dict[str, Any]] = []  # what a chat would show, in order
        self._ids = itertools.count(1)
        self.route("POST", "/bot*", self._handle)

    async def _handle(self, req: Request) -> Response:
        _, _, rest = req.path.partition("/bot")
        token, _, method = rest.partition("/")
        if token != self.token:
            return Response(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
        params: dict[str, Any] = dict(req.form) if req.form or req.files else (req.json or {})
        chat = str(params.get("chat_id", ""))
        if chat not in self.known_chats:
            return Response(
                400, {"ok": False, "error_code": 400, "description": "Bad Request: chat not found"}
            )
        entry: dict[str, Any] = {"method": method, "chat_id": chat}
        if method == "sendMessage":
            if not params.get("text"):
                return Response(
                    400,
                    {
                        "ok": False,
                        "error_code": 400,
                        "description": "Bad Request: message text is empty",
                    },
                )
            entry["text"] = params["text"]
        elif method in MEDIA_FIELDS:
            field = MEDIA_FIELDS[method]
            if field in req.files:
                up = req.files[field]
                entry.update(filename=up.filename, content=up.content)
            elif isinstance(params.get(field), str):
                entry["url"] = params[field]
            else:
                return Response(
                    400,
                    {
                        "ok": False,
                        "error_code": 400,
                        "description": f"Bad Request: there is no {field} in the request",
                    },
                )
            if params.get("caption"):
                entry["caption"] = params["caption"]
        else:
            return Response(404, {"ok": False, "error_code": 404, "description": "Not Found"})
        mid = next(self._ids)
        entry["message_id"] = mid
        self.sent.append(entry)
        return Response(200, {"ok": True, "result": {"message_id": mid, "chat": {"id": int(chat)}}})


def rate_limited(retry_after: int) -> Response:
    return Response(
        429,
        {
            "ok": False,
            "error_code": 429,
            "description": f"Too Many Requests: retry after {retry_after}",
            "parameters": {"retry_after": retry_after},
        },
    )
