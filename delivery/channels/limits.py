"""What fits a chat platform, and how a result that does not fit still reaches the reader.

* Text is split into pieces the platform takes, on paragraph boundaries first, then lines,
  then words, in order; each platform measures in its own unit (UTF-16 code units,
  UTF-8 bytes of the JSON it is wrapped in…).
* Each media kind has a rule (size, formats) from the platform's documentation. A file that
  breaks it, or that the platform refuses as that kind (:class:`DoesNotFit`), goes as the
  next kind that fits (photo → document, video → file); past the file limit the reader gets
  a text with a short note and a download link. Without a link that is a permanent failure
  with the reason, never a silent caption-only delivery.
* A contact ``chat:<id>`` names a group conversation and ``…#<message id>`` asks for a reply
  to that message, so group targets and replies travel through the plain ``contact``
  strings of the router, the ledger and ``send_message``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from delivery.audio import convert
from delivery.channels.base import (
    Channel,
    DeliveryPermanentError,
    DeliveryTransientError,
    Receipt,
    file_size,
)
from delivery.channels.probe import MediaProbe

log = logging.getLogger(__name__)

Size = Callable[[str], int]
#: ``path -> URL`` of a signed download link for a file, or None when there is none
LinkFor = Callable[[str], str | None]

MB = 1024 * 1024
NEXT_KIND = {"image": "file", "video": "file", "audio": "file", "voice": "audio"}
KIND_WORDS = {
    "image": "an image",
    "video": "a video",
    "audio": "audio",
    "voice": "a voice note",
    "file": "a file",
}
LINK_NOTES = {  # (too large, cannot be sent as it is)
    "en": (
        "{name} ({size}) is too large to send here; download it here:",
        "{name} ({size}) cannot be sent here as it is; download it here:",
    ),
    "zh": (
        "{name}（{size}）太大，无法在这里直接发送，请通过链接下载：",
        "{name}（{size}）无法在这里直接发送，请通过链接下载：",
    ),
}


def utf8_len(text: str) -> int:
    return len(text.encode())


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units: how Telegram counts (an emoji is two)."""
    return len(text.encode("utf-16-le")) // 2


_SEPARATORS = ("\n\n", "\n", " ", "")


def split_text(text: str, limit: int, size: Size = len) -> list[str]:
    """``text`` in order, in pieces of at most ``limit`` (measured by ``size``), cut at
    paragraph breaks, else line breaks, else spaces, else between characters. The break a
    cut falls on is dropped; empty pieces are left out. ``size`` must add up
    (``size(a + b) == size(a) + size(b)``), as character, code-unit and byte counts do."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    pieces = [text] if size(text) <= limit else _split(text, limit, size, _SEPARATORS)
    return [p for p in pieces if p.strip()]


def _split(text: str, limit: int, size: Size, seps: tuple[str, ...]) -> list[str]:
    sep, rest = seps[0], seps[1:]
    if not sep:
        return _hard_cut(text, limit, size)
    sep_size = size(sep)
    out: list[str] = []
    cur: list[str] = []
    cur_size = 0
    for part in text.split(sep):
        part_size = size(part)
        joined = cur_size + sep_size + part_size if cur else part_size
        if joined <= limit:
            cur.append(part)
            cur_size = joined
            continue
        if cur:
            out.append(sep.join(cur))
        if part_size <= limit:
            cur, cur_size = [part], part_size
        else:
            *done, last = _split(part, limit, size, rest)
            out.extend(done)
            cur, cur_size = [last], size(last)
    if cur:
        out.append(sep.join(cur))
    return out


def _hard_cut(text: str, limit: int, size: Size) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    cur_size = 0
    for ch in text:
        n = size(ch)
        if cur and cur_size + n > limit:
            out.append("".join(cur))
            cur, cur_size = [], 0
        cur.append(ch)
        cur_size += n
    return [*out, "".join(cur)]


def fit(text: str, limit: int, size: Size = len) -> str:
    """``text`` cut to ``limit`` (an ellipsis marks the cut) — for titles and names."""
    if size(text) <= limit:
        return text
    while text and size(text + "…") > limit:
        text = text[:-1]
    return text + "…" if text else ""


def human_size(n: int) -> str:
    if n >= MB:
        return f"{n / MB:.1f} MB"
    if n >= 1024:
        return f"{n / 1024:.0f} KB"
    return f"{n} bytes"


@dataclass(frozen=True)
class MediaRule:
    """What a platform takes as one media kind: size bounds and file formats."""

    max_bytes: int
    formats: frozenset[str] | None = None  # suffixes without the dot; None takes any
    min_bytes: int = 1

    def refusal(self, path: str, size: int) -> str | None:
        """Why ``path`` (of ``size`` bytes) breaks the rule, or None."""
        ext = Path(path).suffix.lower().lstrip(".")
        if self.formats is not None and ext not in self.formats:
            return f".{ext or '(none)'} is not one of {', '.join(sorted(self.formats))}"
        if size < self.min_bytes:
            return "empty file" if self.min_bytes <= 1 else f"under {self.min_bytes} bytes"
        if size > self.max_bytes:
            return f"{human_size(size)} is over the {human_size(self.max_bytes)} limit"
        return None


def rule(max_mb: float, formats: str | None = None, *, min_bytes: int = 1) -> MediaRule:
    """``rule(10, "jpg jpeg png")``: a :class:`MediaRule` written the way the docs read."""
    found = frozenset(formats.split()) if formats is not None else None
    return MediaRule(int(max_mb * MB), found, min_bytes)


class DoesNotFit(Exception):
    """This file cannot go as this kind (the platform refused it, or a field the message
    type requires cannot be had): the next kind is tried."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Target:
    """Where a send goes: ``id``; ``chat`` when the contact named a group conversation
    (``chat:<id>``); ``reply_to`` the message it answers, if any."""

    id: str
    chat: bool = False
    reply_to: str | None = None
    #: the topic / thread of the group conversation (Telegram ``message_thread_id``, a
    #: Feishu thread): every message of the send goes there
    thread: str | None = None


#: ``chat:<id>/<thread>``: a group conversation's topic or thread
THREAD_MARK = "/"


def after_first(target: Target) -> Target:
    """Where the messages after a send's first one go: the same place, no longer as a reply
    — except in a thread that is reached by replying (Feishu), where they keep the reply."""
    return target if target.thread else replace(target, reply_to=None)


def parse_target(contact: str, reply_to: str | None = None) -> Target:
    """``"chat:<id>/<thread>#<message id>"`` → ``Target(id, chat=True, reply_to=…,
    thread=…)``; an explicit ``reply_to`` wins over the ``#`` suffix."""
    place, _, anchor = contact.strip().partition("#")
    chat = place[:5].lower() == "chat:"
    thread = None
    if chat:
        place = place[5:]
        place, _, found = place.partition(THREAD_MARK)
        thread = found.strip() or None
    return Target(place.strip(), chat, reply_to or anchor.strip() or None, thread)


#: a token already taken for the next request of one send (``(channel, chat id)``): the
#: outbox takes it before it decides between sending now and parking the item
_CREDIT: contextvars.ContextVar[list[tuple[str, str]] | None] = contextvars.ContextVar(
    "ratelimit_credit", default=None
)


@contextlib.contextmanager
def credit(channel: str, target: Target) -> Iterator[None]:
    """Within this block the first request of a send to ``target`` on ``channel`` spends
    the token the caller already took instead of taking another."""
    marker = _CREDIT.set([(channel, target.id)])
    try:
        yield
    finally:
        _CREDIT.reset(marker)


def spend_credit(channel: str, target: Target) -> bool:
    """True (once) when a token was taken in advance for this request."""
    held = _CREDIT.get()
    if held and held[0] == (channel, target.id):
        held.clear()
        return True
    return False


class Limiter(Protocol):
    """The shared outbound rate limits (``delivery.ratelimit.RateLimiter``)."""

    async def acquire(self, channel: str, target: Target) -> float: ...

    async def settle(self, channel: str, target: Target) -> None: ...

    async def pause(self, channel: str, target: Target, retry_after: float) -> None: ...

    async def try_take(self, channel: str, target: Target) -> int: ...

    def due_in(self, channel: str, target: Target) -> int: ...

    async def count_wait(self, channel: str, waited: float, *, parked: bool = False) -> None: ...


def _convertible(kind: str, path: str, found: MediaRule) -> bool:
    """Audio in a format this kind does not take: ffmpeg may make one it does."""
    ext = Path(path).suffix.lower().lstrip(".")
    return kind in ("voice", "audio") and found.formats is not None and ext not in found.formats


class LimitedChannel(Channel):
    """A chat platform with documented limits. Adapters define ``TEXT_LIMIT`` (measured by
    :meth:`text_size`), ``RULES`` per media kind, and the two sends: :meth:`_post_text`
    (one piece) and :meth:`_send_as` (one file as one kind, or :class:`DoesNotFit`)."""

    splits_text = True
    RULES: Mapping[str, MediaRule] = {}

    def __init__(
        self, *, link_for: LinkFor | None = None, probe: MediaProbe | None = None, lang: str = "en"
    ) -> None:
        self.link_for = link_for
        self.probe = probe if probe is not None else MediaProbe()
        self.lang = lang if lang in LINK_NOTES else "en"
        #: shared outbound rate limits (``delivery.ratelimit.RateLimiter``), set by the registry
        self.limiter: Limiter | None = None

    async def _gate(self, target: Target) -> None:
        """Wait for the shared rate limit before one message request."""
        if self.limiter is not None and not spend_credit(self.name, target):
            await self.limiter.acquire(self.name, target)

    async def _answered(self, target: Target) -> None:
        """The request is over: the chat's next token counts from now (shared limits)."""
        if self.limiter is not None:
            await self.limiter.settle(self.name, target)

    async def _paused(self, target: Target, exc: DeliveryTransientError) -> None:
        """A 429's ``retry_after`` pauses this chat's bucket for every worker."""
        if self.limiter is not None and exc.retry_after:
            await self.limiter.pause(self.name, target, exc.retry_after)

    def text_size(self, text: str) -> int:
        return len(text)

    async def _post_text(self, target: Target, text: str) -> str:
        raise NotImplementedError

    async def _send_as(self, kind: str, target: Target, path: str, caption: str | None) -> str:
        raise NotImplementedError

    # --- the Channel interface ---------------------------------------------------------

    async def send_text(self, contact: str, text: str, *, reply_to: str | None = None) -> Receipt:
        return Receipt.of(*await self._text(parse_target(contact, reply_to), text))

    async def send_media(
        self,
        kind: str,
        contact: str,
        path: str,
        caption: str | None = None,
        *,
        reply_to: str | None = None,
    ) -> Receipt:
        """``path`` as ``kind`` if it fits, else as the next kind that does, else as a link."""
        target = parse_target(contact, reply_to)
        if caption and not self.supports_caption:
            await self._text(target, caption)  # the text is never lost with the file
            caption, target = None, after_first(target)
        size = file_size(path)
        notes: list[str] = []
        current: str | None = kind if kind in self.RULES else "file"
        while current is not None:
            found = self.RULES.get(current)
            why = found.refusal(path, size) if found else "not taken on this channel"
            send_path, done = path, ""
            if why is not None and found is not None and _convertible(current, path, found):
                send_path, done, why = await self._converted(path, found, why)
            if why is None:
                await self._gate(target)
                try:
                    mid = await self._send_as(current, target, send_path, caption)
                except DoesNotFit as exc:
                    why = exc.reason
                except DeliveryTransientError as exc:
                    await self._paused(target, exc)
                    raise
                else:
                    return self._receipt([mid], current, path, [*notes, *([done] if done else [])])
                finally:
                    await self._answered(target)
            notes.append(f"not as {KIND_WORDS.get(current, current)}: {why}")
            current = NEXT_KIND.get(current)
        return await self._send_link(target, path, size, caption, notes)

    async def _converted(
        self, path: str, found: MediaRule, why: str
    ) -> tuple[str, str, str | None]:
        """``path`` converted by ffmpeg into a format ``found`` takes (:mod:`delivery.audio`):
        ``(path to send, note, None)``, or ``(path, "", why not)``."""

        conv = await convert(self.probe.ffmpeg, path, found.formats or ())
        if conv.path is None:
            return path, "", f"{why}; {conv.reason}"
        refused = found.refusal(conv.path, file_size(conv.path))
        if refused is not None:
            return path, "", f"{why}; converted to {conv.label} it is still refused: {refused}"
        ext = Path(path).suffix.lower() or "(none)"
        return conv.path, f"converted from {ext} to {conv.label} with ffmpeg", None

    async def send_image(
        self, contact: str, path: str, caption: str | None = None, *, reply_to: str | None = None
    ) -> Receipt:
        return await self.send_media("image", contact, path, caption, reply_to=reply_to)

    async def send_video(
        self, contact: str, path: str, caption: str | None = None, *, reply_to: str | None = None
    ) -> Receipt:
        return await self.send_media("video", contact, path, caption, reply_to=reply_to)

    async def send_audio(
        self, contact: str, path: str, caption: str | None = None, *, reply_to: str | None = None
    ) -> Receipt:
        return await self.send_media("audio", contact, path, caption, reply_to=reply_to)

    async def send_file(
        self, contact: str, path: str, caption: str | None = None, *, reply_to: str | None = None
    ) -> Receipt:
        return await self.send_media("file", contact, path, caption, reply_to=reply_to)

    # --- helpers -----------------------------------------------------------------------

    def text_pieces(self, text: str) -> list[str]:
        """``text`` as the messages :meth:`_post_text` sends, each within ``TEXT_LIMIT``
        (adapters that render Markdown convert it here, see ``delivery.richtext``)."""
        return split_text(text, self.TEXT_LIMIT, self.text_size)

    async def _text(self, target: Target, text: str) -> list[str]:
        """Send ``text`` as its pieces; the message ids the platform gave, in order."""
        pieces = self.text_pieces(text)
        if not pieces:
            raise DeliveryPermanentError(f"{self.name}: empty text, nothing to send")
        ids: list[str] = []
        for i, piece in enumerate(pieces):
            await self._gate(target)
            try:
                mid = await self._post_text(
                    target if i == 0 else replace(target, reply_to=None), piece
                )
            except DoesNotFit as exc:  # only files move on to another kind; text has none
                raise DeliveryPermanentError(f"{self.name}: {exc.reason}") from exc
            except DeliveryTransientError as exc:
                await self._paused(target, exc)
                raise
            finally:
                await self._answered(target)
            if mid:
                ids.append(mid)
        return ids

    async def _send_link(
        self, target: Target, path: str, size: int, caption: str | None, notes: list[str]
    ) -> Receipt:
        name = Path(path).name
        limit = self.RULES["file"].max_bytes if "file" in self.RULES else 0
        too_large = size > limit
        url = self.link_for(path) if self.link_for is not None else None
        if not url:
            head = (
                f"file too large for {self.name}: {name} is {human_size(size)} "
                f"(limit {human_size(limit)})"
                if too_large
                else f"{name} cannot be sent on {self.name}"
            )
            raise DeliveryPermanentError(
                f"{head}, and no download link is configured for it ({'; '.join(notes)})"
            )
        note = LINK_NOTES[self.lang][0 if too_large else 1].format(name=name, size=human_size(size))
        text = f"{caption}\n\n{note}\n{url}" if caption else f"{note}\n{url}"
        return self._receipt(await self._text(target, text), "link", path, notes)

    def _receipt(self, ids: list[str], kind: str, path: str, notes: list[str]) -> Receipt:
        note = "; ".join(notes)
        if note:
            log.info("%s: %s sent as %s (%s)", self.name, Path(path).name, kind, note)
        return Receipt.of(*ids, sent_as=kind, note=note)


__all__ = [
    "LINK_NOTES",
    "MB",
    "DoesNotFit",
    "LimitedChannel",
    "Limiter",
    "LinkFor",
    "MediaRule",
    "Target",
    "credit",
    "fit",
    "human_size",
    "parse_target",
    "rule",
    "spend_credit",
    "split_text",
    "utf8_len",
    "utf16_len",
]
