"""The delivery ledger: each (job, recipient, item) is sent at most once and never silently
dropped.

How exactly-once is approached:

* Before sending, the sender *claims* the item: ``INSERT … ON CONFLICT (ledger_key) DO
  NOTHING`` creates a ``pending`` row owned by it (both PostgreSQL and SQLite). Whoever
  loses that race sends nothing.
* A row already ``sent`` is never claimed again — a re-run job or a retried delivery skips it.
* A ``pending`` row is taken over (compare-and-set on its ``updated_at``) only when its
  claimant is gone: the claimant released it, its worker stopped or missed heartbeats for
  ``dead_after`` seconds, or the row sat untouched for ``stale_after`` seconds (far longer
  than any send can take). A ``failed`` row was refused by the channel and may be tried again
  by a later run.
* The owner is ``"<worker id>#<lease token>"``; the part before ``#`` is looked up in the
  ``workers`` table for liveness.

The honest limit (at-most-once window) for third-party channels: between the channel
accepting a send and ``mark_sent`` committing, the only record is the ``pending`` row. If the
worker dies exactly then — or a request that timed out was in fact delivered — the item is
picked up again and the recipient may see it twice. Everything else (re-runs, retries, lost
leases, concurrent workers) sends each item once.

Web sessions have no such window: the message and its ledger row are written in one
transaction (:func:`record_web_deliveries`), so a stored message is exactly a ``sent`` row.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from delivery.errors import DeliveryPermanentError, DeliveryTransientError
from jobs import storable
from jobs.models import PENDING, SENT, Delivery, Worker

log = logging.getLogger(__name__)

FAILED = "failed"
DEFAULT_TRIES = 3
MAX_WAIT = 60.0

Sessions = async_sessionmaker[AsyncSession]
Fence = Callable[[], Awaitable[bool]]


@dataclass(frozen=True)
class LedgerEntry:
    """The ledger row a web message is recorded under (same transaction as the message)."""

    key: str
    recipient: str
    owner: str
    kind: str = "text"
    item: str = ""
    job_id: str | None = None
    chain_run_id: str | None = None


class LeaseLost(Exception):
    """The attempt delivering lost its lease: stop without sending."""


def ledger_key(job_or_run_id: str, recipient: str, item: str) -> str:
    """The unique key of one item for one recipient of one job (or chain run)."""
    raw = "\x1f".join((job_or_run_id or "", recipient, item))
    return hashlib.sha256(raw.encode()).hexdigest()


def owner_id(worker_id: str | None, lease_token: int | None) -> str:
    return f"{worker_id or 'local'}#{lease_token or 0}"


def delivery_dict(row: Delivery) -> dict[str, Any]:
    """The public shape (SPEC §10 job.deliveries)."""
    return {"recipient": row.recipient, "kind": row.kind, "status": row.status, "error": row.error}


def _insert(session: AsyncSession) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(Delivery)
    return sqlite.insert(Delivery)


async def _claimant_gone(
    s: AsyncSession, row: Delivery, now: float, dead_after: float, stale_after: float
) -> bool:
    if not row.claimed_by:
        return True
    if row.updated_at < now - stale_after:
        return True
    worker_id = row.claimed_by.rsplit("#", 1)[0]
    w = await s.get(Worker, worker_id)
    if w is None:
        return False  # not a registered worker (CLI, tests): only staleness frees it
    return w.stopped_at is not None or w.last_heartbeat < now - dead_after


async def claim(
    sessionmaker: Sessions,
    key: str,
    *,
    recipient: str,
    owner: str,
    kind: str = "text",
    item: str = "",
    channel: str = "",
    job_id: str | None = None,
    chain_run_id: str | None = None,
    dead_after: float = 60.0,
    stale_after: float = 900.0,
) -> Delivery | None:
    """Claim the item for ``owner``; None when it was sent already or someone alive holds it."""
    now = time.time()
    async with sessionmaker() as s:
        stmt = (
            _insert(s)
            .values(
                ledger_key=key,
                job_id=job_id,
                chain_run_id=chain_run_id,
                recipient=recipient[:512],
                channel=channel,
                kind=kind,
                item=item,
                status=PENDING,
                tries=0,
                claimed_by=owner,
                created_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["ledger_key"])
            .returning(Delivery)
        )
        created = (await s.execute(stmt)).scalar_one_or_none()
        await s.commit()
        if created is not None:
            return created
        row = (await s.execute(select(Delivery).where(Delivery.ledger_key == key))).scalar_one()
        if row.status == SENT:
            return None
        if row.status == PENDING and row.claimed_by != owner:
            if not await _claimant_gone(s, row, now, dead_after, stale_after):
                return None
        # Take it over only if nobody changed it since we looked.
        res = await s.execute(
            update(Delivery)
            .where(
                Delivery.id == row.id,
                Delivery.status == row.status,
                Delivery.updated_at == row.updated_at,
            )
            .values(status=PENDING, claimed_by=owner, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        await s.commit()
        if res.rowcount != 1:  # type: ignore[attr-defined]
            return None
        await s.refresh(row)
        return row


async def _finish(sessionmaker: Sessions, key: str, owner: str, **values: Any) -> bool:
    values["updated_at"] = time.time()
    if isinstance(values.get("error"), str):  # a channel's answer can hold anything
        values["error"] = storable.text(values["error"], cap=2000)
    async with sessionmaker() as s:
        res = await s.execute(
            update(Delivery)
            .where(Delivery.ledger_key == key, Delivery.claimed_by == owner)
            .values(**values)
        )
        await s.commit()
        return bool(res.rowcount == 1)  # type: ignore[attr-defined]


async def mark_sent(sessionmaker: Sessions, key: str, owner: str, tries: int = 1) -> bool:
    """Record the item as sent (``tries``: send attempts made by this claim)."""
    return await _finish(
        sessionmaker,
        key,
        owner,
        status=SENT,
        error=None,
        sent_at=time.time(),
        tries=Delivery.tries + tries,
    )


async def mark_failed(
    sessionmaker: Sessions, key: str, owner: str, error: str, tries: int = 1
) -> bool:
    return await _finish(
        sessionmaker, key, owner, status=FAILED, error=error, tries=Delivery.tries + tries
    )


async def release(sessionmaker: Sessions, key: str, owner: str, note: str | None = None) -> bool:
    """Give a pending claim back (it was not sent) so the next run picks it up."""
    return await _finish(sessionmaker, key, owner, status=PENDING, claimed_by=None, error=note)


async def get(sessionmaker: Sessions, key: str) -> Delivery | None:
    async with sessionmaker() as s:
        return (
            await s.execute(select(Delivery).where(Delivery.ledger_key == key))
        ).scalar_one_or_none()


async def for_job(sessionmaker: Sessions, job_id: str) -> list[dict[str, Any]]:
    """A job's deliveries in the order they were first attempted."""
    async with sessionmaker() as s:
        rows = (
            await s.execute(select(Delivery).where(Delivery.job_id == job_id).order_by(Delivery.id))
        ).scalars()
        return [delivery_dict(r) for r in rows]


async def deliver_once(
    sessionmaker: Sessions,
    send: Callable[[], Awaitable[Any]],
    *,
    key: str,
    recipient: str,
    owner: str,
    kind: str = "text",
    item: str = "",
    channel: str = "",
    job_id: str | None = None,
    chain_run_id: str | None = None,
    fence: Fence | None = None,
    tries: int = DEFAULT_TRIES,
    backoff: float = 1.0,
    dead_after: float = 60.0,
    stale_after: float = 900.0,
    wait: float = 0.0,
) -> dict[str, Any]:
    """Claim → send (transient failures retried with backoff, ``retry_after`` honoured) →
    record. Returns the delivery dict; raises :class:`LeaseLost` when ``fence`` says this
    attempt no longer owns the job (nothing is sent then).

    ``wait``: how long to keep trying when another claimant that still looks alive holds
    the item — a re-run of a job whose worker was killed mid-delivery waits until that
    worker is known dead instead of leaving the item pending forever."""
    base = {"recipient": recipient, "kind": kind}
    if fence is not None and not await fence():
        raise LeaseLost(recipient)

    async def _claim() -> Delivery | None:
        return await claim(
            sessionmaker,
            key,
            recipient=recipient,
            owner=owner,
            kind=kind,
            item=item,
            channel=channel,
            job_id=job_id,
            chain_run_id=chain_run_id,
            dead_after=dead_after,
            stale_after=stale_after,
        )

    row = await _claim()
    deadline = time.monotonic() + wait
    while row is None and time.monotonic() < deadline:
        held = await get(sessionmaker, key)
        if held is None or held.status != PENDING or held.claimed_by == owner:
            break
        if fence is not None and not await fence():
            raise LeaseLost(recipient)
        await asyncio.sleep(min(1.0, max(dead_after / 4, 0.05)))
        row = await _claim()
    if row is None:
        existing = await get(sessionmaker, key)
        status = existing.status if existing is not None else PENDING
        note = None if status == SENT else "being delivered by another worker"
        return {**base, "status": status, "error": note, "duplicate": True}

    error = ""
    for attempt in range(1, max(1, tries) + 1):
        if fence is not None and not await fence():
            await asyncio.shield(release(sessionmaker, key, owner, "not sent: lease lost"))
            raise LeaseLost(recipient)
        try:
            await send()
        except DeliveryTransientError as exc:
            error = exc.reason
            if attempt >= tries:
                break
            wait = exc.retry_after if exc.retry_after is not None else backoff * 2 ** (attempt - 1)
            log.info("delivery to %s failed (%s), retrying in %.1fs", recipient, error, wait)
            await asyncio.sleep(min(max(wait, 0.0), MAX_WAIT))
            continue
        except DeliveryPermanentError as exc:
            await mark_failed(sessionmaker, key, owner, exc.reason, attempt)
            return {**base, "status": FAILED, "error": exc.reason}
        except asyncio.CancelledError:
            # Unknown whether it went out; leave it for the next run rather than lose it.
            await asyncio.shield(release(sessionmaker, key, owner, "interrupted while sending"))
            raise
        except Exception as exc:  # an adapter bug must not lose the rest of the delivery
            log.exception("delivery to %s: unexpected error", recipient)
            reason = f"internal error: {type(exc).__name__}: {exc}"
            await mark_failed(sessionmaker, key, owner, reason, attempt)
            return {**base, "status": FAILED, "error": reason}
        await asyncio.shield(mark_sent(sessionmaker, key, owner, attempt))
        return {**base, "status": SENT, "error": None}
    reason = f"gave up after {tries} tries: {error}"
    await mark_failed(sessionmaker, key, owner, reason, tries)
    return {**base, "status": FAILED, "error": reason}


async def record_web_deliveries(
    s: AsyncSession,
    keyed: list[tuple[int, str, LedgerEntry]],
    known_sessions: set[str],
    now: float,
) -> set[int]:
    """Ledger rows for web messages written in the caller's transaction (``keyed``: index,
    session id, entry). Returns the indexes that were delivered already and must be skipped.

    Because the message and its ledger row commit together, web delivery has no
    at-most-once window: a row is ``sent`` exactly when its message is stored. Rows that
    exist as ``pending`` or ``failed`` are taken over (locked first on PostgreSQL); a row
    inserted concurrently by another transaction makes this one skip the message.
    """
    keys = sorted({e.key for _, _, e in keyed})
    q = select(Delivery.ledger_key, Delivery.status).where(Delivery.ledger_key.in_(keys))
    if s.get_bind().dialect.name == "postgresql":
        q = q.order_by(Delivery.ledger_key).with_for_update()
    existing: dict[str, str] = {row[0]: row[1] for row in (await s.execute(q)).all()}
    dup: set[int] = set()
    seen: set[str] = set()
    new_rows: list[tuple[int, dict[str, Any]]] = []
    takeover: list[tuple[int, str, dict[str, Any]]] = []
    for i, session_id, e in keyed:
        if e.key in seen or existing.get(e.key) == SENT:
            dup.add(i)
            continue
        seen.add(e.key)
        ok = session_id in known_sessions
        values = {
            "status": SENT if ok else FAILED,
            "error": None if ok else storable.text(f"unknown session {session_id!r}", cap=2000),
            "claimed_by": e.owner,
            "sent_at": now if ok else None,
            "updated_at": now,
        }
        if e.key in existing:
            takeover.append((i, e.key, values))
            continue
        new_rows.append(
            (
                i,
                {
                    "ledger_key": e.key,
                    "job_id": e.job_id,
                    "chain_run_id": e.chain_run_id,
                    "recipient": e.recipient[:512],
                    "channel": "web",
                    "kind": e.kind,
                    "item": e.item,
                    "tries": 1,
                    "created_at": now,
                    **values,
                },
            )
        )
    if new_rows:
        # executemany form: one cached statement whatever the batch size (a multi-row
        # VALUES list would be compiled again for every new length)
        res = await s.execute(
            _insert(s)
            .on_conflict_do_nothing(index_elements=["ledger_key"])
            .returning(Delivery.ledger_key),
            [r for _, r in new_rows],
        )
        inserted = set(res.scalars())
        dup |= {i for i, r in new_rows if r["ledger_key"] not in inserted}
    for i, key, values in takeover:
        res = await s.execute(
            update(Delivery)
            .where(Delivery.ledger_key == key, Delivery.status != SENT)
            .values(tries=Delivery.tries + 1, **values)
        )
        if res.rowcount != 1:  # type: ignore[attr-defined]
            dup.add(i)
    return dup
