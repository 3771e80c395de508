"""What every channel adapter is: the common interface, the two delivery errors, the HTTP seam
that translates transport failures once, and a token cache for the APIs that need one."""

from __future__ import annotations

import asyncio
import contextvars
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import httpx

from delivery.errors import (
    DeliveryError,
    DeliveryOutcomeUnknown,
    DeliveryPermanentError,
    DeliveryTransientError,
)
from jobs import nofollow
from jobs.db import Fence


class SendKey:
    """The idempotency key of one send in progress (set by the ledger for each attempt).
    Adapters whose platform de-duplicates on a client key (Feishu ``uuid``) take one key per
    message request with :meth:`next`: the n-th request of a repeated send gets the same key
    as the n-th request of the first, so the platform delivers it once."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.n = 0

    def next(self) -> str:
        self.n += 1
        return f"{self.key}:{self.n}"


SEND_KEY: contextvars.ContextVar[SendKey | None] = contextvars.ContextVar("send_key", default=None)


def read_file(path: str | Path) -> bytes:
    """The bytes of a local attachment, or a permanent error naming the problem. The path
    was vetted as a real path inside a workspace: it is opened with no symlink followed, so
    one swapped in since is refused, not read through."""
    p = Path(path)
    try:
        return nofollow.read_real(p)
    except nofollow.Refused as exc:
        raise DeliveryPermanentError(f"not sent: {exc}") from exc
    except FileNotFoundError as exc:
        raise DeliveryPermanentError(f"file not found: {p.name}") from exc
    except IsADirectoryError as exc:
        raise DeliveryPermanentError(f"not a file: {p.name}") from exc
    except OSError as exc:
        raise DeliveryPermanentError(f"cannot read {p.name}: {exc.strerror}") from exc


async def read_file_async(path: str | Path) -> bytes:
    """File reads off the event loop (attachments can be tens of MB)."""
    return await asyncio.to_thread(read_file, path)


def file_size(path: str | Path) -> int:
    try:
        return Path(path).stat().st_size
    except FileNotFoundError as exc:
        raise DeliveryPermanentError(f"file not found: {Path(path).name}") from exc


def _retry_after(resp: httpx.Response, body: object = None) -> float | None:
    if isinstance(body, dict):
        params = body.get("parameters")
        if isinstance(params, dict) and isinstance(params.get("retry_after"), int | float):
            return float(params["retry_after"])
    raw = resp.headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


async def request(
    http: httpx.AsyncClient, method: str, url: str, *, what: str, **kwargs: Any
) -> httpx.Response:
    """One HTTP call to a channel API with transport failures translated once.

    Timeouts, connection errors, 429 and 5xx become :class:`DeliveryTransientError`
    (with ``retry_after`` when the server said so). A read timeout or a connection lost
    after the request was written is :class:`DeliveryOutcomeUnknown` — the message may have
    been delivered — except for requests that deliver nothing to anyone (reads, access
    tokens, media uploads: ``what`` names them), which are simply retried. Other statuses
    are returned: each adapter reads its own error body shape.
    """
    lost = DeliveryTransientError if _harmless(method, what) else DeliveryOutcomeUnknown
    try:
        resp = await http.request(method, url, **kwargs)
    except (httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        raise DeliveryTransientError(f"{what}: timed out connecting") from exc
    except httpx.TimeoutException as exc:  # read/write timeout: the request may have landed
        raise lost(f"{what}: timed out waiting for the answer") from exc
    except (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.ProxyError) as exc:
        raise DeliveryTransientError(f"{what}: connection failed ({type(exc).__name__})") from exc
    except httpx.TransportError as exc:  # dropped after the request went out
        raise lost(f"{what}: connection lost before the answer ({type(exc).__name__})") from exc
    if resp.status_code == 429 or resp.status_code >= 500:
        body = _json_or_none(resp)
        detail = _short_detail(body) or resp.reason_phrase
        raise DeliveryTransientError(
            f"{what}: HTTP {resp.status_code} {detail}".strip(),
            retry_after=_retry_after(resp, body),
        )
    return resp


_HARMLESS = re.compile(r"token|upload", re.I)


def _harmless(method: str, what: str) -> bool:
    """A request that shows nothing to anyone when repeated (no message is sent)."""
    return method.upper() == "GET" or _HARMLESS.search(what) is not None


def _json_or_none(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _short_detail(body: object) -> str:
    if not isinstance(body, dict):
        return ""
    for k in ("description", "msg", "errmsg", "message", "error"):
        if isinstance(body.get(k), str) and body[k]:
            return str(body[k])[:300]
    return ""


def json_body(resp: httpx.Response, what: str) -> dict[str, Any]:
    """A JSON object body, or a permanent error (4xx without one is permanent too)."""
    body = _json_or_none(resp)
    if not isinstance(body, dict):
        if resp.status_code >= 400:
            raise DeliveryPermanentError(f"{what}: HTTP {resp.status_code}")
        raise DeliveryPermanentError(f"{what}: the server did not answer with JSON")
    return body


T = TypeVar("T")


class TokenRejected(Exception):
    """The API answered that the access token is invalid or expired (each platform's code)."""


def token_key(*parts: str) -> str:
    """The key under which adapters of one app share its token in this process: the
    platform, the app's id and a digest of its secret (never the secret itself)."""
    import hashlib

    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


class TokenCache:
    """One access token, fetched on demand, kept until shortly before it expires, refreshed
    by a single caller at a time.

    Caches built with the same ``share`` key (adapters of one app built again, as the
    ``send_message`` skill does for each call) use one token of the process: the platforms
    ask for it to be cached (WeCom limits ``gettoken`` calls), and one refresh serves all."""

    #: share key → (token, monotonic expiry), for this process
    _shared: dict[str, tuple[str, float]] = {}

    def __init__(
        self,
        fetch: Callable[[], Awaitable[tuple[str, float]]],
        *,
        margin: float = 60.0,
        share: str | None = None,
    ):
        self._fetch = fetch
        self._margin = margin
        self._share = share
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()
        self.fetches = 0

    def _valid(self) -> str | None:
        now = time.monotonic()
        if self._token and now < self._expires_at:
            return self._token
        found = self._shared.get(self._share) if self._share else None
        if found is not None and now < found[1]:
            self._token, self._expires_at = found
            return found[0]
        return None

    async def get(self) -> str:
        if (token := self._valid()) is not None:
            return token
        async with self._lock:
            if (token := self._valid()) is not None:
                return token
            token, ttl = await self._fetch()
            self.fetches += 1
            self._token = token
            self._expires_at = time.monotonic() + max(0.0, ttl - self._margin)
            if self._share:
                self._shared[self._share] = (token, self._expires_at)
            return token

    def invalidate(self, token: str | None = None) -> None:
        """Forget the token (only if it is still ``token``, when given)."""
        if token is None or token == self._token:
            self._token = None
            self._expires_at = 0.0
        if self._share:
            found = self._shared.get(self._share)
            if found is not None and (token is None or found[0] == token):
                del self._shared[self._share]

    async def call(self, use: Callable[[str], Awaitable[T]], what: str) -> T:
        """``use(token)``; when it raises :class:`TokenRejected` the token is refreshed once
        and ``use`` repeated. Concurrent calls holding the same stale token share one
        refresh: only the first ``invalidate`` forgets it, the rest wait on the lock."""
        token = await self.get()
        try:
            return await use(token)
        except TokenRejected:
            self.invalidate(token)
        token = await self.get()
        try:
            return await use(token)
        except TokenRejected as exc:
            self.invalidate(token)
            raise DeliveryPermanentError(
                f"{what}: the platform refused a freshly issued access token ({exc}); "
                "check the app's credentials and that it is enabled"
            ) from exc


@dataclass(frozen=True)
class Receipt:
    """What one send put on the platform: the ids of the messages it posted (none when the
    platform gave none), what it went as when a channel had to choose (``sent_as``: a media
    kind, or ``link`` for a download link) and why not as asked (``note``). The ledger
    records the first id as the delivery's ``message_id``."""

    message_ids: tuple[str, ...] = ()
    sent_as: str = ""
    note: str = ""

    @property
    def message_id(self) -> str:
        """The first message's id ("" when the platform gave none)."""
        return self.message_ids[0] if self.message_ids else ""

    @classmethod
    def of(cls, *message_ids: str, sent_as: str = "", note: str = "") -> Receipt:
        """A receipt of the given ids (empty ones left out)."""
        return cls(tuple(m for m in message_ids if m), sent_as, note)


@dataclass(frozen=True)
class Courier:
    """Who delivers one result to whom, the same for each of its items: the ledger rows'
    recipient, owner and job, the fence checked before every send, and how long a send
    waits for a claimant that may still be alive (``delivery.ledger.deliver_once``)."""

    recipient: str
    owner: str
    channel: str = ""
    job_id: str | None = None
    chain_run_id: str | None = None
    fence: Fence | None = None
    tries: int = 3
    backoff: float = 1.0
    dead_after: float = 60.0
    stale_after: float = 900.0
    wait: float = 0.0


@dataclass(frozen=True)
class Send:
    """One item of a result on its way to ``contact``: a text, or a file (``path``, with
    ``text`` as its caption). ``key`` is its ledger key, ``item`` the ledger's name for it;
    files go only from inside ``workspace``."""

    kind: str  # text image video audio voice file
    item: str  # "text", "failure", "notice:<kind>" or "<kind>:<path>"
    contact: str
    key: str
    text: str | None = None
    path: str | None = None
    reply_to: str | None = None  # the message it answers
    workspace: Path | None = None


class Delivered(TypedDict):
    """The outcome of one item for one recipient, as a job or a chain run records it."""

    recipient: str
    kind: str
    status: str
    error: str | None


#: delivers one item through the ledger (one row per item, its caption's fallback after it)
SendOne = Callable[[Send], Awaitable[list[Delivered]]]


class Channel:
    """A chat channel. Every send returns a :class:`Receipt` or raises
    :class:`DeliveryTransientError` / :class:`DeliveryPermanentError`. What a channel can
    do is declared here, one typed attribute each, so nothing above asks which class it is.
    """

    name: str = ""
    #: the text can ride along with a media item
    supports_caption: bool = False
    #: a thread is reached by replying to a message in it (Feishu ``reply_in_thread``):
    #: every message of a result sent there is such a reply, not only the first
    thread_by_reply: bool = False
    #: ``![alt](url)`` in text is turned into media by this adapter
    converts_markdown_images: bool = False
    #: the platform drops a repeated send itself (Feishu ``uuid``, WeCom duplicate check),
    #: so a send whose outcome is unknown may be repeated with the same key
    dedups: bool = False
    #: Markdown in a text is converted to the platform's own markup (``delivery.richtext``)
    renders_markdown: bool = False
    #: the reader's page shows Markdown as written, long texts included (a web session)
    rich_text: bool = False
    #: printed columns can go in a monospace block (Telegram ``<pre>``, card code blocks)
    monospace: bool = False
    #: a message can answer another (``[[reply_to_current]]``, a group's request)
    replies: bool = True
    #: audio can go as a voice note (``[[audio_as_voice]]``)
    voice_notes: bool = False
    #: a long text goes as several messages (:meth:`text_pieces`); else as one message of
    #: up to ``TEXT_LIMIT`` characters
    splits_text: bool = False
    #: the most one text message holds, in the channel's own unit
    TEXT_LIMIT: int = 4096

    def dedups_for(self, contact: str) -> bool:
        """Whether the platform drops a repeat of a send to ``contact`` (see ``dedups``)."""
        return self.dedups

    def for_job(self, job_id: str | None) -> Channel:
        """The channel delivering one job's result (a web one tags its messages with it)."""
        return self

    def text_pieces(self, text: str) -> list[str]:
        """``text`` as the messages it goes as."""
        return [text]

    async def send_text(self, contact: str, text: str) -> Receipt:
        raise NotImplementedError

    async def send_image(self, contact: str, path: str, caption: str | None = None) -> Receipt:
        return await self.send_media("image", contact, path, caption)

    async def send_video(self, contact: str, path: str, caption: str | None = None) -> Receipt:
        return await self.send_media("video", contact, path, caption)

    async def send_audio(self, contact: str, path: str, caption: str | None = None) -> Receipt:
        return await self.send_media("audio", contact, path, caption)

    async def send_file(self, contact: str, path: str, caption: str | None = None) -> Receipt:
        return await self.send_media("file", contact, path, caption)

    async def send_media(
        self, kind: str, contact: str, path: str, caption: str | None = None
    ) -> Receipt:
        """``path`` as ``kind`` (image, video, audio, voice, file)."""
        raise NotImplementedError

    async def send_batch(
        self, courier: Courier, sends: Sequence[Send], one: SendOne
    ) -> AsyncIterator[Delivered]:
        """Deliver ``sends`` in order, yielding each outcome as it is known. By default each
        goes on its own through ``one`` (the ledger); a channel that can store many at once
        with their ledger rows overrides this. Raises ``LeaseLost`` (``delivery.ledger``)
        when the courier's fence says the attempt no longer owns the job."""
        for send in sends:
            for done in await one(send):
                yield done


# Tries of one send, and the longest wait between two (a ``retry_after`` is honoured up
# to that).
TRIES = 3
MAX_WAIT = 30.0

# ``![alt](url "title")``: a Markdown image in a text.
MARKDOWN_IMAGE = re.compile(r"!\[([^\]]*)\]\((\S+?)(?:\s+\"[^\"]*\")?\)")


async def with_retries(
    send: Callable[[], Awaitable[Any]], tries: int = TRIES, backoff: float = 1.0
) -> Any:
    """Call ``send``; transient failures are retried (``retry_after`` honoured)."""
    for attempt in range(1, tries + 1):
        try:
            return await send()
        except DeliveryOutcomeUnknown:
            raise  # it may have been delivered: repeating it is the caller's decision
        except DeliveryTransientError as exc:
            if attempt >= tries:
                raise DeliveryTransientError(f"gave up after {tries} tries: {exc.reason}") from exc
            wait = exc.retry_after if exc.retry_after is not None else backoff * 2 ** (attempt - 1)
            await asyncio.sleep(min(max(wait, 0.0), MAX_WAIT))
    raise AssertionError("unreachable")


__all__ = [
    "MARKDOWN_IMAGE",
    "MAX_WAIT",
    "SEND_KEY",
    "TRIES",
    "Channel",
    "Courier",
    "Delivered",
    "DeliveryError",
    "DeliveryOutcomeUnknown",
    "DeliveryPermanentError",
    "DeliveryTransientError",
    "Receipt",
    "Send",
    "SendKey",
    "SendOne",
    "TokenCache",
    "TokenRejected",
    "file_size",
    "json_body",
    "read_file",
    "read_file_async",
    "request",
    "token_key",
    "with_retries",
]
