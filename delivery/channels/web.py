"""Web sessions (web, web_admin, orgdeleg): a message is stored on a known chat session and
pushed live on the Redis channel ``<prefix>:session:<session_id>`` (the SSE endpoint listens
there and sends ``event: message`` with the stored message JSON)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from arq.connections import ArqRedis
from sqlalchemy import (
    exists,
    literal,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from delivery.channels.base import (
    Channel,
    Courier,
    Delivered,
    DeliveryPermanentError,
    DeliveryTransientError,
    Receipt,
    Send,
    SendOne,
    file_size,
    with_retries,
)
from delivery.channels.web_store import Outgoing, store_batch, store_batch_pg
from delivery.channels.web_store_sqlite import store_batch_sqlite
from delivery.ledger import LeaseLost, LedgerEntry
from delivery.render import RICH_TEXT_CAP
from jobs import telemetry
from jobs.batching import Batcher
from jobs.constants import SESSION_EVENTS
from jobs.db import DB_UNAVAILABLE, autocommit, engine_of, is_sqlite
from jobs.links import file_link, file_link_key
from jobs.media import guess_mime
from jobs.models import ChatSession, JSONType, SessionMessage
from jobs.queue.broker import publish_many
from jobs.settings import Settings

log = logging.getLogger(__name__)

WEB_CHANNELS = frozenset({"web", "web_admin"})


def message_dict(
    msg_id: int, text: str, attachments: list[Any], created_at: float, job_id: str | None = None
) -> dict[str, Any]:
    """The stored-message JSON (``GET /sessions/{id}/messages`` items and live pushes)."""
    return {
        "id": msg_id,
        "text": text,
        "attachments": attachments,
        "created_at": created_at,
        "job_id": job_id,
    }


def _insert(session: AsyncSession, table: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


async def ensure_session(
    sessionmaker: async_sessionmaker[AsyncSession],
    session_id: str,
    role_id: str = "",
    org_id: str = "",
    channel: str = "",
    external_id: str = "",
) -> None:
    """Record a chat session (idempotent: an existing session keeps its first values)."""
    if not session_id:
        raise ValueError("session_id is required")
    now = time.time()
    async with sessionmaker() as s:
        stmt = (
            _insert(s, ChatSession)
            .values(
                session_id=session_id,
                role_id=role_id or "",
                org_id=org_id or "",
                channel=channel or "",
                external_id=external_id or "",
                created_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["session_id"])
        )
        await s.execute(stmt)
        await s.commit()


async def post_message(
    sessionmaker: async_sessionmaker[AsyncSession] | None,
    redis: ArqRedis | None,
    settings: Settings,
    session_id: str,
    text: str,
    attachments: list[Any] | None = None,
    job_id: str | None = None,
) -> dict[str, Any]:
    """Store a message on a known chat session and push it live; returns the stored message.

    An unknown session is a :class:`DeliveryPermanentError`, never a silent success. The
    live push is best effort: the stored message is the delivery.
    """
    if sessionmaker is None:
        raise DeliveryPermanentError("web delivery is not configured (no database)")
    if not session_id:
        raise DeliveryPermanentError("unknown session '' (empty session id)")
    atts = list(attachments or [])
    sign_links(settings, atts, job_id)
    now = time.time()
    # One statement: insert only when the session exists.
    src = select(
        literal(session_id),
        literal(text or ""),
        literal(atts, type_=JSONType),
        literal(job_id),
        literal(now),
    ).where(exists().where(ChatSession.session_id == session_id))
    try:
        async with sessionmaker() as s:
            stmt = (
                _insert(s, SessionMessage)
                .from_select(["session_id", "text", "attachments", "job_id", "created_at"], src)
                .returning(SessionMessage.id)
            )
            msg_id = (await s.execute(stmt)).scalar_one_or_none()
            await s.commit()
    except DB_UNAVAILABLE as exc:
        raise DeliveryTransientError(f"web: database unreachable ({type(exc).__name__})") from exc
    if msg_id is None:
        raise DeliveryPermanentError(f"unknown session {session_id!r}")
    msg = message_dict(msg_id, text or "", atts, now, job_id)
    if redis is not None:
        try:
            await redis.publish(
                settings.key(SESSION_EVENTS, session_id), json.dumps(msg, ensure_ascii=False)
            )
        except Exception as exc:  # the message is stored; a missed push only delays display
            log.warning("live push to session %s failed: %s", session_id, exc)
    return msg


async def post_messages(
    sessionmaker: async_sessionmaker[AsyncSession] | None,
    redis: ArqRedis | None,
    settings: Settings,
    messages: list[Outgoing],
) -> list[dict[str, Any] | DeliveryPermanentError | None]:
    """Store many messages in one transaction and push them in one Redis round trip.

    Returns, per input and in order, the stored message, a :class:`DeliveryPermanentError`
    (unknown session) or None (a ledger entry says it was delivered already). Messages with a
    ``ledger`` entry are recorded in the delivery ledger in the same transaction, so a web
    delivery is stored exactly once. Raises :class:`DeliveryTransientError` when the database
    is unreachable.
    """
    if sessionmaker is None:
        raise DeliveryPermanentError("web delivery is not configured (no database)")
    if not messages:
        return []
    now = time.time()
    engine = engine_of(sessionmaker)
    pg = autocommit(engine)
    try:
        if pg is not None:
            known, dup, new_ids = await store_batch_pg(pg, messages, now)
        elif is_sqlite(engine):
            known, dup, new_ids = await store_batch_sqlite(engine, messages, now)
        else:
            known, dup, new_ids = await store_batch(sessionmaker, messages, now)
    except DB_UNAVAILABLE as exc:
        raise DeliveryTransientError(f"web: database unreachable ({type(exc).__name__})") from exc
    return await _push(redis, settings, messages, known, dup, new_ids, now)


async def _push(
    redis: ArqRedis | None,
    settings: Settings,
    messages: list[Outgoing],
    known: set[str],
    dup: set[int],
    new_ids: list[int],
    now: float,
) -> list[dict[str, Any] | DeliveryPermanentError | None]:
    out: list[dict[str, Any] | DeliveryPermanentError | None] = []
    stored: list[dict[str, Any]] = []
    pushed: list[Outgoing] = []
    it = iter(new_ids)
    for i, m in enumerate(messages):
        if i in dup:
            out.append(None)
            continue
        if m.session_id not in known:
            out.append(DeliveryPermanentError(f"unknown session {m.session_id!r}"))
            continue
        msg = message_dict(next(it), m.text or "", list(m.attachments or []), now, m.job_id)
        out.append(msg)
        stored.append(msg)
        pushed.append(m)
    if redis is not None and stored:
        try:
            await publish_many(
                redis,
                [
                    (
                        settings.key(SESSION_EVENTS, m.session_id),
                        json.dumps(msg, ensure_ascii=False),
                    )
                    for m, msg in zip(pushed, stored, strict=True)
                ],
            )
        except Exception as exc:  # stored is delivered; a missed push only delays display
            log.warning("live push of %d messages failed: %s", len(stored), exc)
    return out


def sign_links(
    settings: Settings, attachments: list[Any], job_id: str | None, key: bytes | None = None
) -> None:
    """Each delivered file gets a signed, expiring download link (``/files/<token>``) that
    works without the API token, for that one file only (of ``job_id``, when given)."""
    for att in attachments:
        if not isinstance(att, dict) or att.get("url") or not att.get("local_path"):
            continue
        key = key or file_link_key(settings)
        ttl = settings.file_link_ttl_sec
        att["url"] = file_link(key, job_id, str(att["local_path"]), ttl)


class MessageBatcher:
    """Coalesces concurrent web deliveries (group commit, :class:`jobs.batching.Batcher`):
    while a batch is being written, new messages queue up and go together in the next one.
    No added latency when idle; under load, one transaction and one Redis round trip carry
    up to ``max_batch`` messages, with two batches in flight."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession] | None,
        redis: ArqRedis | None,
        settings: Settings,
        *,
        max_batch: int = 500,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.redis = redis
        self.settings = settings
        # an item is the messages of one post_many call: they always share a batch
        self._batcher: Batcher[list[Outgoing], list[Any]] = Batcher(
            self._flush, max_batch=max_batch, concurrency=2, name="web-messages"
        )
        self._link_key: bytes | None = None

    async def post(self, msg: Outgoing) -> dict[str, Any]:
        """Store and push one message; its stored dict (raises on failure)."""
        (res,) = await self.post_many([msg])
        if isinstance(res, Exception):
            raise res
        if res is None:
            raise DeliveryPermanentError("already delivered")
        return res

    async def post_many(
        self, msgs: list[Outgoing]
    ) -> list[dict[str, Any] | DeliveryPermanentError | None]:
        """Messages that go in the same batch, in order; per message what
        :func:`post_messages` returns. Raises :class:`DeliveryTransientError`."""
        for msg in msgs:
            self._sign_links(msg)
        return await self._batcher.submit(msgs)

    def _sign_links(self, msg: Outgoing) -> None:
        if any(isinstance(a, dict) and not a.get("url") for a in msg.attachments):
            if self._link_key is None:
                self._link_key = file_link_key(self.settings)
            sign_links(self.settings, msg.attachments, msg.job_id, self._link_key)

    async def _flush(self, groups: list[list[Outgoing]]) -> list[list[Any]]:
        flat = [m for group in groups for m in group]
        results = await post_messages(self.sessionmaker, self.redis, self.settings, flat)
        out, i = [], 0
        for group in groups:
            out.append(results[i : i + len(group)])
            i += len(group)
        return out


async def list_messages(
    sessionmaker: async_sessionmaker[AsyncSession],
    session_id: str,
    limit: int = 100,
    after_id: int | None = None,
) -> list[dict[str, Any]]:
    """The session's latest ``limit`` messages, oldest first (``after_id``: only newer ones)."""
    limit = max(1, min(int(limit), 1000))
    q = select(SessionMessage).where(SessionMessage.session_id == session_id)
    if after_id is not None:
        q = q.where(SessionMessage.id > after_id)
    q = q.order_by(SessionMessage.id.desc()).limit(limit)
    async with sessionmaker() as s:
        rows = (await s.execute(q)).scalars().all()
    return [
        message_dict(r.id, r.text, r.attachments or [], r.created_at, r.job_id)
        for r in reversed(rows)
    ]


def _live_fields(data: object) -> dict[str, Any] | None:
    """A live push reduced to the stored-message fields, each of its stored type."""
    if not isinstance(data, dict):
        return None
    msg_id, text, atts = data.get("id"), data.get("text"), data.get("attachments")
    created, job_id = data.get("created_at"), data.get("job_id")
    if not isinstance(msg_id, int) or isinstance(msg_id, bool) or not isinstance(text, str):
        return None
    if not isinstance(atts, list) or not isinstance(created, int | float):
        return None
    job = job_id if isinstance(job_id, str) else None
    return message_dict(msg_id, text, atts, float(created), job)


async def _stored(
    sessionmaker: async_sessionmaker[AsyncSession], session_id: str, msg_id: int
) -> dict[str, Any] | None:
    async with sessionmaker() as s:
        row = await s.get(SessionMessage, msg_id)
    if row is None or row.session_id != session_id:
        return None
    return message_dict(row.id, row.text, list(row.attachments or []), row.created_at, row.job_id)


async def listen(
    redis_url_or_pool: Any,
    settings: Settings,
    session_id: str,
    *,
    sessionmaker: async_sessionmaker[AsyncSession] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Live messages pushed to ``session_id``, as stored-message dicts, until the consumer
    stops iterating. Takes a Redis URL (a connection is opened and closed here) or a pool.

    What arrives on the channel is only a hint (anyone who can write to Redis can publish):
    with a ``sessionmaker`` the message is loaded by id from this session's stored messages,
    else it is reduced to the stored-message fields."""
    import redis.asyncio as aioredis

    own = isinstance(redis_url_or_pool, str)
    client = aioredis.from_url(redis_url_or_pool) if own else redis_url_or_pool  # type: ignore[no-untyped-call]
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(settings.key(SESSION_EVENTS, session_id))
        while True:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
            if msg is None or msg.get("type") != "message":
                continue
            try:
                data = _live_fields(json.loads(msg["data"]))
            except (TypeError, ValueError):
                data = None
            if data is not None and sessionmaker is not None:
                data = await _stored(sessionmaker, session_id, data["id"])
            if data is None:
                log.warning("ignoring a live message on session %s: not a stored one", session_id)
                continue
            yield data
    finally:
        try:
            await pubsub.unsubscribe()
        finally:
            await pubsub.aclose()
            if own:
                await client.aclose()


def attachment_dict(path: str, kind: str, *, size: int | None = None) -> dict[str, Any]:
    """How a delivered file is described on a web message (the normalized attachment shape)."""
    p = Path(path)
    if size is None:
        try:
            size = p.stat().st_size
        except OSError:
            size = 0
    return {
        "type": kind,
        "att_type": kind,
        "filename": p.name,
        "local_path": str(p),
        "url": "",
        "mime": guess_mime(p),
        "size": size,
    }


class WebChannel(Channel):
    """Delivery to a web chat session; the contact is the ``session_id``. A result's items
    are stored together, each with its ledger row, in one transaction (:meth:`send_batch`).
    """

    name = "web"
    supports_caption = True
    rich_text = True
    monospace = True
    replies = False  # a chat session has no replies
    TEXT_LIMIT = RICH_TEXT_CAP  # one message, up to what the page shows

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession] | None,
        redis: ArqRedis | None,
        settings: Settings,
        *,
        job_id: str | None = None,
        batcher: MessageBatcher | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.redis = redis
        self.settings = settings
        self.job_id = job_id
        self.batcher = batcher or MessageBatcher(sessionmaker, redis, settings)

    def for_job(self, job_id: str | None) -> WebChannel:
        """The same channel (sharing its batcher), tagging stored messages with ``job_id``."""
        return WebChannel(
            self.sessionmaker, self.redis, self.settings, job_id=job_id, batcher=self.batcher
        )

    async def send_text(self, contact: str, text: str) -> Receipt:
        if not (text or "").strip():
            raise DeliveryPermanentError("web: empty text")
        msg = await self.batcher.post(Outgoing(contact, text, [], self.job_id))
        return Receipt.of(str(msg["id"]))

    async def send_media(
        self, kind: str, contact: str, path: str, caption: str | None = None
    ) -> Receipt:
        size = file_size(path)
        att = attachment_dict(path, kind, size=size)
        msg = await self.batcher.post(Outgoing(contact, caption or "", [att], self.job_id))
        return Receipt.of(str(msg["id"]))

    async def send_batch(
        self, courier: Courier, sends: Sequence[Send], one: SendOne
    ) -> AsyncIterator[Delivered]:
        """Every item stored together with its ledger row in one transaction (exactly once,
        no window); a file that cannot be attached goes on its own after them (it fails there,
        with its reason, and keeps its caption)."""
        rest: list[Send] = []
        batch: list[tuple[Send, Outgoing]] = []
        for send in sends:
            attachments: list[dict[str, Any]] = []
            if send.path is not None:
                att = _attachable(send.path, send.kind, send.workspace)
                if att is None:
                    rest.append(send)
                    continue
                attachments = [att]
            entry = LedgerEntry(
                key=send.key,
                recipient=courier.recipient,
                owner=courier.owner,
                kind=send.kind,
                item=send.path or send.item,
                job_id=courier.job_id,
                chain_run_id=courier.chain_run_id,
            )
            msg = Outgoing(send.contact, send.text or "", attachments, courier.job_id, entry)
            batch.append((send, msg))
        if batch:
            attrs = {"skilljobs.channel": courier.channel}
            stored = self._store(courier, batch)
            for done in await telemetry.traced("skilljobs.deliver", stored, attrs=attrs):
                yield done
        for send in rest:
            for done in await one(send):
                yield done

    async def _store(self, courier: Courier, batch: list[tuple[Send, Outgoing]]) -> list[Delivered]:
        if courier.fence is not None and not await courier.fence():
            raise LeaseLost(courier.recipient)

        async def post() -> list[dict[str, Any] | DeliveryPermanentError | None]:
            return await self.batcher.post_many([o for _, o in batch])

        try:
            results = await with_retries(post, backoff=courier.backoff)
        except DeliveryTransientError as exc:
            # nothing was committed: the next run delivers these
            return [_delivered(courier, s, exc.reason) for s, _ in batch]
        # (each ledger row got its message's id as its receipt when the message was stored)
        return [
            _delivered(courier, s, res.reason if isinstance(res, DeliveryPermanentError) else None)
            for (s, _), res in zip(batch, results, strict=True)
        ]


def _delivered(courier: Courier, send: Send, error: str | None) -> Delivered:
    status = "failed" if error else "sent"
    return {"recipient": courier.recipient, "kind": send.kind, "status": status, "error": error}


def _attachable(path: str, kind: str, workspace: Path | None) -> dict[str, Any] | None:
    p = Path(path)
    if workspace is None or not p.is_relative_to(workspace) or not p.is_file():
        return None
    return attachment_dict(path, kind)
