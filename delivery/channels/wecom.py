"""WeCom (企业微信) adapter: gettoken, media/upload, message/send to a member of the corp and
appchat/send to a group chat the app created.

Limits (WeCom server API "上传临时素材", "发送应用消息", "应用推送消息"): every upload over 5
bytes; image 10 MB JPG/PNG, voice 2 MB AMR of at most 60 s, video 10 MB MP4, file 20 MB;
text at most 2048 bytes; a video's title at most 128 bytes. ``access_token`` lives 2 hours;
errcode 40014 (invalid) or 42001 (expired) refreshes it once. ``chat:<chatid>`` sends to an
app group chat. The app message API has no replies: a ``reply_to`` is ignored. Text with
Markdown goes as a ``markdown`` message (at most 2048 bytes each, ``delivery.richtext``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from delivery.channels.base import (
    DeliveryPermanentError,
    DeliveryTransientError,
    TokenCache,
    TokenRejected,
    json_body,
    read_file_async,
    request,
    token_key,
)
from delivery.channels.limits import (
    DoesNotFit,
    LimitedChannel,
    LinkFor,
    Target,
    fit,
    parse_target,
    rule,
    split_text,
    utf8_len,
)
from delivery.channels.probe import MediaProbe
from delivery.richtext import WECOM, Piece, has_markup, pieces

INVALID_TOKEN_CODES = {40014, 42001}
BUSY_CODES = {-1, 6000, 45009, 45033}  # system busy, API rate limits
DOES_NOT_FIT_CODES = {40004, 40005, 40006, 40009, 40011, 44001, 45001}
REASONS = {
    81013: "the member is not in the app's visible range (or does not exist); add them to it",
    60020: "the server's IP is not in the app's trusted IPs (企业可信IP); add it in the console",
    48002: "the app may not call this API; check the app's permissions",
    60011: "the app has no permission for this member or department",
    40056: "the agent id is wrong; check SKILLJOBS_WECOM_AGENT_ID",
    86003: "no such group chat: appchat ids are the chats this app created",
}
IMAGE_LIMIT = 10 * 1024 * 1024
VOICE_LIMIT = 2 * 1024 * 1024
VIDEO_LIMIT = 10 * 1024 * 1024
FILE_LIMIT = 20 * 1024 * 1024
TEXT_BYTES = 2048
TITLE_BYTES = 128
VOICE_SECONDS = 60
#: ``duplicate_check_interval`` of ``message/send``: an identical message to the same user
#: within it is sent once (the platform's default is 1800 s, at most 4 hours)
DUPLICATE_CHECK_SEC = 600


def byte_chunks(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` UTF-8 bytes, cut at paragraph or line breaks
    where it can, never inside a character."""
    return split_text(text, limit, utf8_len)


class WeComChannel(LimitedChannel):
    name = "wecom"
    dedups = True  # ``enable_duplicate_check`` on message/send (not on appchat/send)
    supports_caption = False
    TEXT_LIMIT = TEXT_BYTES
    RULES = {
        "image": rule(10, "jpg jpeg png", min_bytes=6),
        "audio": rule(2, "amr", min_bytes=6),
        "video": rule(10, "mp4", min_bytes=6),
        "file": rule(20, min_bytes=6),
    }

    def dedups_for(self, contact: str) -> bool:
        return not parse_target(contact).chat  # appchat/send has no duplicate check

    def __init__(
        self,
        http: httpx.AsyncClient,
        corp_id: str,
        corp_secret: str,
        agent_id: str,
        *,
        api_base: str = "https://qyapi.weixin.qq.com",
        link_for: LinkFor | None = None,
        probe: MediaProbe | None = None,
        lang: str = "en",
    ) -> None:
        super().__init__(link_for=link_for, probe=probe, lang=lang)
        self._http = http
        self._corp_id = corp_id
        self._corp_secret = corp_secret
        self._agent_id = agent_id
        self._base = api_base.rstrip("/")
        self.tokens = TokenCache(
            self._fetch_token, share=token_key("wecom", self._base, corp_id, corp_secret)
        )

    def text_size(self, text: str) -> int:
        return utf8_len(text)

    async def _fetch_token(self) -> tuple[str, float]:
        what = "wecom gettoken"
        resp = await request(
            self._http,
            "GET",
            f"{self._base}/cgi-bin/gettoken",
            what=what,
            params={"corpid": self._corp_id, "corpsecret": self._corp_secret},
        )
        body = json_body(resp, what)
        _check(body, what)
        return str(body["access_token"]), float(body.get("expires_in") or 7200)

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        """One call; an invalid or expired token is refreshed once and the call repeated."""
        extra = kwargs.pop("params", {})

        async def use(token: str) -> dict[str, Any]:
            params = {"access_token": token, **extra}
            resp = await request(
                self._http, method, f"{self._base}{path}", what=what, params=params, **kwargs
            )
            body = json_body(resp, what)
            if body.get("errcode") in INVALID_TOKEN_CODES:
                raise TokenRejected(f"errcode {body['errcode']}: {body.get('errmsg')}")
            _check(body, what)
            return body

        return await self.tokens.call(use, what)

    async def _upload(self, mtype: str, path: str) -> str:
        content = await read_file_async(path)
        body = await self._call(
            "POST",
            "/cgi-bin/media/upload",
            f"wecom media upload ({mtype})",
            params={"type": mtype},
            files={"media": (Path(path).name, content)},
        )
        return str(body["media_id"])

    async def _send(self, target: Target, msgtype: str, payload: dict[str, Any]) -> str:
        if target.chat:
            body = await self._call(
                "POST",
                "/cgi-bin/appchat/send",
                "wecom appchat send",
                json={"chatid": target.id, "msgtype": msgtype, msgtype: payload, "safe": 0},
            )
            return str(body.get("msgid", ""))
        agent: int | str = int(self._agent_id) if str(self._agent_id).isdigit() else self._agent_id
        body = await self._call(
            "POST",
            "/cgi-bin/message/send",
            "wecom message send",
            json={
                "touser": target.id,
                "agentid": agent,
                "msgtype": msgtype,
                msgtype: payload,
                # the same message to the same user within the interval is sent once
                "enable_duplicate_check": 1,
                "duplicate_check_interval": DUPLICATE_CHECK_SEC,
            },
        )
        if body.get("invaliduser"):
            raise DeliveryPermanentError(
                f"wecom message send: invalid user {body['invaliduser']}: not a member of the "
                "corp or outside the app's visible range"
            )
        return str(body.get("msgid", ""))

    renders_markdown = True  # text_pieces converts it (delivery.render keeps it)

    def text_pieces(self, text: str) -> list[str]:
        if has_markup(text):
            return list(pieces(text, WECOM, TEXT_BYTES))
        return super().text_pieces(text)

    async def _post_text(self, target: Target, text: str) -> str:
        if not isinstance(text, Piece):
            return await self._send(target, "text", {"content": text})
        try:
            return await self._send(target, "markdown", {"content": text})
        except DeliveryPermanentError as exc:
            if "(errcode 40008)" not in str(exc):  # markdown is not a type this app may send
                raise
        first = ""
        for plain in byte_chunks(text.plain, TEXT_BYTES):
            first = first or await self._send(target, "text", {"content": plain})
        return first

    async def _send_as(self, kind: str, target: Target, path: str, caption: str | None) -> str:
        if kind == "image":
            return await self._send(
                target, "image", {"media_id": await self._upload("image", path)}
            )
        if kind == "audio":
            info = await self.probe.info(path)
            if info is not None and info.duration and info.duration > VOICE_SECONDS:
                raise DoesNotFit(f"a voice message plays at most {VOICE_SECONDS} s")
            return await self._send(
                target, "voice", {"media_id": await self._upload("voice", path)}
            )
        if kind == "video":
            payload = {
                "media_id": await self._upload("video", path),
                "title": fit(Path(path).name, TITLE_BYTES, utf8_len),
            }
            return await self._send(target, "video", payload)
        return await self._send(target, "file", {"media_id": await self._upload("file", path)})


def _check(body: dict[str, Any], what: str) -> None:
    code = body.get("errcode", 0)
    if code == 0:
        return
    msg = body.get("errmsg") or "error"
    if code in DOES_NOT_FIT_CODES:
        raise DoesNotFit(f"WeCom refused it: {msg} (errcode {code})")
    if code in BUSY_CODES:
        raise DeliveryTransientError(f"{what}: {msg} (errcode {code})")
    human = REASONS.get(code) if isinstance(code, int) else None
    detail = f"{human} ({msg}, errcode {code})" if human else f"{msg} (errcode {code})"
    raise DeliveryPermanentError(f"{what}: {detail}")


__all__ = [
    "FILE_LIMIT",
    "IMAGE_LIMIT",
    "INVALID_TOKEN_CODES",
    "TEXT_BYTES",
    "VIDEO_LIMIT",
    "VOICE_LIMIT",
    "WeComChannel",
    "byte_chunks",
]
