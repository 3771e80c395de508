"""Fake Telegram Bot API (``/bot<token>/<method>``), with the Bot API's documented limits.

Chats: users who started the bot (``known_chats``), groups the bot is in (``groups``,
negative ids), and the ones that answer the way Telegram does when something is wrong —
``blocked`` users, users who never pressed Start (``not_started``), groups the bot was
removed from (``left``), groups where it may not post (``read_only``), groups that became
supergroups (``migrated``). Limits: text 4096 and captions 1024 (UTF-16 code units), photos
10 MB and within 10000 px (w + h) and a 1:20 ratio, uploads 50 MB. ``receive`` makes a
message someone sent, so a reply has something to answer. ``parse_mode=HTML`` texts are
parsed as Telegram does (``telegram_html``): ``text`` is what the chat shows, ``html`` what
was sent, ``entities`` the formatting.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from tests.fakes import telegram_html
from tests.fakes.server import FakeServer, Request, Response, png_size, utf16_len

MEDIA_FIELDS = {
    "sendPhoto": "photo",
    "sendVideo": "video",
    "sendAudio": "audio",
    "sendVoice": "voice",
    "sendDocument": "document",
}
TEXT_LIMIT = 4096
CAPTION_LIMIT = 1024
PHOTO_LIMIT = 10 * 1024 * 1024
UPLOAD_LIMIT = 50 * 1024 * 1024
GROUP = "-1001234567890"


def error(status: int, description: str, **parameters: Any) -> Response:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return Response(status, body)


class FakeTelegram(FakeServer):
    def __init__(self, token: str = "123:ABC") -> None:
        super().__init__()
        self.token = token
        self.known_chats = {"1001", "1002"}
        self.migrated = {"-42": "-1004200000042"}  # old group id → its supergroup
        self.groups = {GROUP, *self.migrated.values()}
        self.blocked = {"1003"}
        self.not_started = {"1004"}
        self.left = {"-1009"}
        self.read_only = {"-1008"}
        self.sent: list[dict[str, Any]] = []  # what a chat would show, in order
        self.unsupported_tags: set[str] = set()  # an older Bot API: these tags are refused
        self.messages: dict[tuple[str, int], str] = {}  # (chat, message id) → who wrote it
        self._ids = itertools.count(1)
        # the published flood limits, enforced when ``enforce_rates`` is set: beyond them a
        # send is answered 429 with ``retry_after`` (counted in ``too_many``)
        self.enforce_rates = False
        self.per_chat_sec = 1.0  # one message per second in one chat
        self.per_bot_sec = 30  # 30 messages per second in all
        self.too_many = 0
        self._last_in_chat: dict[str, float] = {}
        self._recent: list[float] = []
        self.route("POST", "/bot*", self._handle)

    def receive(self, chat_id: str) -> int:
        """A message someone sent in ``chat_id``; returns its id."""
        mid = next(self._ids)
        self.messages[(chat_id, mid)] = "user"
        return mid

    async def _handle(self, req: Request) -> Response:
        _, _, rest = req.path.partition("/bot")
        token, _, method = rest.partition("/")
        if token != self.token:
            return error(401, "Unauthorized")
        if len(req.body) > UPLOAD_LIMIT + 1024 * 1024:
            return Response(413, "<html><body>413 Request Entity Too Large</body></html>")
        params: dict[str, Any] = dict(req.form) if req.form or req.files else (req.json or {})
        chat = str(params.get("chat_id", ""))
        refused = self._chat_refusal(chat)
        if refused is not None:
            return refused
        if self.enforce_rates and (flood := self._flood(chat)) is not None:
            return flood
        # ``at``: when the message reached the platform (the wall clock, as jobs record)
        entry: dict[str, Any] = {"method": method, "chat_id": chat, "at": time.time()}
        reply = self._reply(chat, params.get("reply_parameters"))
        if isinstance(reply, Response):
            return reply
        if reply is not None:
            entry["reply_to"] = reply
        if params.get("message_thread_id") not in (None, ""):  # a forum topic
            entry["message_thread_id"] = int(params["message_thread_id"])
        if method == "sendMessage":
            problem = self._text(params, entry)
        elif method in MEDIA_FIELDS:
            problem = self._media(method, req, params, entry)
        else:
            return error(404, "Not Found")
        if problem is not None:
            return problem
        mid = next(self._ids)
        entry["message_id"] = mid
        self.messages[(chat, mid)] = "bot"
        self.sent.append(entry)
        return Response(200, {"ok": True, "result": {"message_id": mid, "chat": {"id": int(chat)}}})

    def _flood(self, chat: str) -> Response | None:
        now = time.monotonic()
        self._recent = [t for t in self._recent if t > now - 1.0]
        last = self._last_in_chat.get(chat)
        # a little slack for clock granularity between the limiter and this server
        if (last is not None and now - last < self.per_chat_sec * 0.9) or len(
            self._recent
        ) >= self.per_bot_sec:
            self.too_many += 1
            return rate_limited(1)
        self._last_in_chat[chat] = now
        self._recent.append(now)
        return None

    def _chat_refusal(self, chat: str) -> Response | None:
        if chat in self.migrated:
            return error(
                400,
                "Bad Request: group chat was upgraded to a supergroup chat",
                migrate_to_chat_id=int(self.migrated[chat]),
            )
        if chat in self.blocked:
            return error(403, "Forbidden: bot was blocked by the user")
        if chat in self.not_started:
            return error(403, "Forbidden: bot can't initiate conversation with a user")
        if chat in self.left:
            return error(403, "Forbidden: bot was kicked from the supergroup chat")
        if chat in self.read_only:
            return error(400, "Bad Request: not enough rights to send text messages to the chat")
        if chat not in self.known_chats and chat not in self.groups:
            return error(400, "Bad Request: chat not found")
        return None

    def _reply(self, chat: str, raw: Any) -> int | Response | None:
        if raw is None:
            return None
        reply = json.loads(raw) if isinstance(raw, str) else raw
        mid = reply.get("message_id") if isinstance(reply, dict) else None
        if not isinstance(mid, int):
            return error(400, "Bad Request: invalid reply parameters")
        if (chat, mid) not in self.messages:
            if reply.get("allow_sending_without_reply"):
                return None
            return error(400, "Bad Request: message to be replied not found")
        return mid

    def _text(self, params: dict[str, Any], entry: dict[str, Any]) -> Response | None:
        text = params.get("text")
        mode = params.get("parse_mode")
        if mode == "HTML" and text:
            # the limit counts what is shown, after the entities are parsed
            parsed = telegram_html.parse(str(text), self.unsupported_tags)
            if isinstance(parsed, str):
                return error(400, f"Bad Request: can't parse entities: {parsed}")
            entry.update(html=text, parse_mode=mode, entities=parsed[1])
            text = parsed[0]
        elif mode:
            return error(400, f"Bad Request: unsupported parse_mode {mode!r}")
        if not text:
            return error(400, "Bad Request: message text is empty")
        if utf16_len(str(text)) > TEXT_LIMIT:
            return error(400, "Bad Request: message is too long")
        entry["text"] = text
        return None

    def _media(
        self, method: str, req: Request, params: dict[str, Any], entry: dict[str, Any]
    ) -> Response | None:
        field = MEDIA_FIELDS[method]
        if field in req.files:
            up = req.files[field]
            if method == "sendPhoto":
                problem = self._photo(up.content)
                if problem is not None:
                    return problem
            entry.update(filename=up.filename, content=up.content)
        elif isinstance(params.get(field), str):
            entry["url"] = params[field]
        else:
            return error(400, f"Bad Request: there is no {field} in the request")
        caption = params.get("caption")
        if caption and params.get("parse_mode") == "HTML":
            parsed = telegram_html.parse(str(caption), self.unsupported_tags)
            if isinstance(parsed, str):
                return error(400, f"Bad Request: can't parse entities: {parsed}")
            entry.update(caption_html=caption, parse_mode="HTML", caption_entities=parsed[1])
            caption = parsed[0]
        if caption:
            if utf16_len(str(caption)) > CAPTION_LIMIT:
                return error(400, "Bad Request: message caption is too long")
            entry["caption"] = caption
        if method == "sendVideo":
            for key in ("duration", "width", "height", "supports_streaming"):
                if key in params:
                    entry[key] = params[key]
            thumb = params.get("thumbnail")
            if thumb:
                attached = req.files.get(str(thumb).removeprefix("attach://"))
                if attached is None:
                    return error(400, "Bad Request: wrong thumbnail")
                entry["thumbnail"] = attached.content
        return None

    def _photo(self, content: bytes) -> Response | None:
        if len(content) > PHOTO_LIMIT:
            return error(400, "Bad Request: file is too big")
        size = png_size(content)
        if size is not None:
            w, h = size
            if w + h > 10000 or max(w, h) > 20 * max(min(w, h), 1):
                return error(400, "Bad Request: PHOTO_INVALID_DIMENSIONS")
        return None


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
