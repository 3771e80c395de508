"""Web sessions (web, web_admin, orgdeleg): a message is stored on a known chat session and
pushed live on the Redis channel ``<prefix>:session:<session_id>`` (the SSE endpoint listens
there and sends ``event: message`` with the stored message JSON)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sqlalchemy import exists, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from delivery.channels.base import (
    Channel,
    DeliveryPermanentError,
    DeliveryTransientError,
    file_size,
    guess_mime,
)
from jobs.constants import SESSION_EVENTS
from jobs.models import ChatSession, JSONType, SessionMessage
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
    redis: Any,
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
    except (OSError, OperationalError, InterfaceError) as exc:
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


async def listen(
    redis_url_or_pool: Any, settings: Settings, session_id: str
) -> AsyncIterator[dict[str, Any]]:
    """Live messages pushed to ``session_id``, as stored-message dicts, until the consumer
    stops iterating. Takes a Redis URL (a connection is opened and closed here) or a pool."""
    import redis.asyncio as aioredis

    own = isinstance(redis_url_or_pool, str)
    client = aioredis.from_url(redis_url_or_pool) if own else redis_url_or_pool
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(settings.key(SESSION_EVENTS, session_id))
        while True:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
            if msg is None or msg.get("type") != "message":
                continue
            try:
                data = json.loads(msg["data"])
            except (TypeError, ValueError):
                log.warning("ignoring a malformed live message on session %s", session_id)
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
    """Delivery to a web chat session; the contact is the ``session_id``."""

    name = "web"
    supports_caption = True

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession] | None,
        redis: Any,
        settings: Settings,
        *,
        job_id: str | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.redis = redis
        self.settings = settings
        self.job_id = job_id

    def for_job(self, job_id: str | None) -> WebChannel:
        """The same channel, tagging the messages it stores with ``job_id``."""
        return WebChannel(self.sessionmaker, self.redis, self.settings, job_id=job_id)

    async def send_text(self, contact: str, text: str) -> str:
        if not (text or "").strip():
            raise DeliveryPermanentError("web: empty text")
        msg = await post_message(
            self.sessionmaker, self.redis, self.settings, contact, text, [], self.job_id
        )
        return str(msg["id"])

    async def send_media(
        self, kind: str, contact: str, path: str, caption: str | None = None
    ) -> str:
        size = file_size(path)
        msg = await post_message(
            self.sessionmaker,
            self.redis,
            self.settings,
            contact,
            caption or "",
            [attachment_dict(path, kind, size=size)],
            self.job_id,
        )
        return str(msg["id"])

    async def send_image(self, contact: str, path: str, caption: str | None = None) -> str:
        return await self.send_media("image", contact, path, caption)

    async def send_video(self, contact: str, path: str, caption: str | None = None) -> str:
        return await self.send_media("video", contact, path, caption)

    async def send_audio(self, contact: str, path: str, caption: str | None = None) -> str:
        return await self.send_media("audio", contact, path, caption)

    async def send_file(self, contact: str, path: str, caption: str | None = None) -> str:
        return await self.send_media("file", contact, path, caption)
