"""The delivery ledger: each (job, recipient, item) is sent at most once and never silently
dropped.

How exactly-once is approached:

* Before sending, the sender *claims* the item: ``INSERT … ON CONFLICT (ledger_key) DO
  NOTHING`` creates a ``pending`` row owned by it (both PostgreSQL and SQLite). Whoever
  loses that race sends nothing.
* A row already ``sent`` is never claimed again — a re-run job or a retried delivery skips it.
* A ``pending`` row is taken over (compare-and-set on its ``updated_at`` and
  ``generation``) only when its claimant is gone: the claimant released it, its worker
  stopped or missed heartbeats for ``dead_after`` seconds, or the row sat untouched for
  ``stale_after`` seconds (far longer than any send can take). A ``failed`` row was refused
  by the channel and may be tried again by a later run.
* The owner is ``"<worker id>#<lease token>"``; the part before ``#`` is looked up in the
  ``workers`` table for liveness.

Custody (SPEC C13): right before the request goes out the row becomes ``sending``; the
answer makes it ``sent`` (with the platform's message id, ``verified`` false when there was
none, and the adapter's note and kind), ``failed``, or ``unknown`` when the request may have
landed without an answer (a read timeout, a connection dropped after the request was
written, a cancel mid-request). A row found ``sending`` whose claimant is gone is
``unknown`` too: its worker died between sending and recording. ``unknown`` is never sent
again blindly — except on channels whose platform drops repeats (``dedup``: Feishu's
``uuid``, WeCom's duplicate check), where it is repeated under the same key. Elsewhere an
operator resends it (a new ``generation``, :mod:`delivery.custody`) or dismisses it.
Every outcome is recorded only by the claim of the row's current generation.

Web sessions have no such window: the message and its ledger row are written in one
transaction (:func:`record_web_deliveries`), so a stored message is exactly a ``sent`` row.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from delivery.channels.base import SEND_KEY, Courier, Receipt, SendKey
from delivery.errors import (
    DeliveryOutcomeUnknown,
    DeliveryPermanentError,
    DeliveryTransientError,
)
from jobs import counters, storable, telemetry
from jobs.db import Fence, Sessions, db_unavailable, rowcount
from jobs.logs import SECRETS
from jobs.models import PENDING, SENT, Delivery, DeliveryStatus, Worker

log = logging.getLogger(__name__)

FAILED = DeliveryStatus.FAILED
SENDING = DeliveryStatus.SENDING
UNKNOWN = DeliveryStatus.UNKNOWN
DISMISSED = DeliveryStatus.DISMISSED
#: the outcomes the skilljobs_deliveries_total counters count (jobs.counters)
_ENDED = frozenset({SENT, FAILED, UNKNOWN})
UNKNOWN_DIED = "outcome unknown: the worker sending it stopped before recording the answer"
#: characters of a stored item body (what a resend sends)
CONTENT_CAP = 100_000
DEFAULT_TRIES = 3
MAX_WAIT = 60.0
#: how long recording a delivery's outcome waits for an unreachable database
RECORD_PATIENCE = 300.0


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


#: ``claimed_by`` of a row parked in the outbox (:mod:`delivery.outbox`): waiting for its
#: chat's rate limit, in order, sent by whichever worker's outbox gets to it
PARKED = "outbox"


@dataclass(frozen=True)
class RetryWindow:
    """How a send stopped by an outage (5xx, a connection error, a timeout before the
    request went out) is waited out in the outbox: tried again after exponential pauses
    with jitter (``base`` doubling up to ``cap`` seconds) for ``window`` seconds from its
    first such failure (``Delivery.retry_since``), then ``failed`` with the reason."""

    window: float
    base: float = 1.0
    cap: float = 15.0

    def pause(self, tries: int) -> float:
        step = min(self.cap, self.base * 2 ** min(max(0, tries - 1), 30))
        return float(step * random.uniform(0.75, 1.25))


class Gate(Protocol):
    """A send's way past the shared rate limits (:class:`delivery.outbox.Gate`): ``enter``
    says whether it may go now (a token taken) or must be parked; ``parked`` queues the
    parked row (``wait``: seconds until it may be tried); ``leave`` ends the turn.
    ``retry``: how an outage is waited out in the outbox (None: tried in place)."""

    note: str
    retry: RetryWindow | None

    async def enter(self) -> bool: ...

    async def parked(self, row_id: int, wait: float | None = None) -> None: ...

    async def leave(self) -> None: ...


@dataclass(frozen=True)
class Parcel:
    """One item of a :class:`Courier` in the ledger: its key, what it is (``kind``, the
    ``item`` it is listed as), what a resend sends (``content``), whether the platform drops
    a repeat of it (``dedup``) and its way past the shared rate limits (``gate``)."""

    key: str
    kind: str = "text"
    item: str = ""
    content: dict[str, Any] | None = None
    dedup: bool = False
    gate: Gate | None = None


#: one send of an item: the platform's receipt (None: it gave none)
Sender = Callable[[], Awaitable[Receipt | None]]


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


def action_for(status: str, resendable: bool) -> str | None:
    """What an operator can do about a delivery in ``status`` (None: nothing to do)."""
    if status == UNKNOWN:
        return "the message may have arrived: check the chat, then dismiss it" + (
            ", or resend it" if resendable else " (no stored content to resend)"
        )
    if status == FAILED:
        return "resend it once the cause is fixed, or dismiss it" if resendable else "dismiss it"
    if status == PENDING:
        return "waiting for its channel (rate limit or outage); it is retried by itself"
    return None


def custody_dict(row: Delivery) -> dict[str, Any]:
    """A delivery as operators see it (``deliveries list``, ``GET /api/v1/deliveries``):
    the public shape plus custody, the receipt and what a resend would send."""
    content = row.content or {}
    return {
        "id": row.id,
        "recipient": row.recipient,
        "kind": row.kind,
        "status": row.status,
        "error": row.error,
        "item": content.get("path") or row.item,
        "resendable": bool(content),
        "action": action_for(row.status, bool(content)),
        "job_id": row.job_id,
        "chain_run_id": row.chain_run_id,
        "generation": row.generation,
        "tries": row.tries,
        "message_id": row.message_id,
        "verified": row.verified if row.status == SENT else None,
        "note": row.note,
        "sent_as": row.sent_as,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "sent_at": row.sent_at,
    }


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


async def _cas(s: AsyncSession, row: Delivery, **values: Any) -> bool:
    """Change ``row`` only if nobody changed it since it was read."""
    res = await s.execute(
        update(Delivery)
        .where(
            Delivery.id == row.id,
            Delivery.status == row.status,
            Delivery.updated_at == row.updated_at,
            Delivery.generation == row.generation,
        )
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    await s.commit()
    return bool(rowcount(res) == 1)


async def _take_over(
    s: AsyncSession,
    row: Delivery,
    owner: str,
    now: float,
    *,
    dedup: bool,
    dead_after: float,
    stale_after: float,
) -> Delivery | None:
    """The existing row for this claim, or None when it is not ours to send."""
    if row.status in (SENT, DISMISSED):
        return None
    if row.status == UNKNOWN and not dedup:
        return None  # an operator decides (resend or dismiss)
    if row.status in (PENDING, SENDING) and row.claimed_by != owner:
        if not await _claimant_gone(s, row, now, dead_after, stale_after):
            return None
        if row.status == SENDING and not dedup:
            # its claimant died between sending and recording: nobody knows if it arrived
            await _cas(s, row, status=UNKNOWN, error=UNKNOWN_DIED, updated_at=now)
            return None
    if not await _cas(s, row, status=PENDING, claimed_by=owner, updated_at=now):
        return None
    await s.refresh(row)
    return row


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
    content: dict[str, Any] | None = None,
    dedup: bool = False,
    dead_after: float = 60.0,
    stale_after: float = 900.0,
) -> Delivery | None:
    """Claim the item for ``owner``; None when it was sent (or dismissed) already, someone
    alive holds it, or its outcome is ``unknown`` on a channel that does not de-duplicate
    (a row found ``sending`` whose claimant died becomes ``unknown`` here). ``dedup``: the
    platform drops a repeat, so an ``unknown`` item may be sent again under the same key."""
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
                generation=0,
                content=stored_content(content),
                claimed_by=owner,
                created_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["ledger_key"])
            .returning(Delivery)
        )
        created: Delivery | None = (await s.execute(stmt)).scalar_one_or_none()
        await s.commit()
        if created is not None:
            return created
        row = (await s.execute(select(Delivery).where(Delivery.ledger_key == key))).scalar_one()
        return await _take_over(
            s, row, owner, now, dedup=dedup, dead_after=dead_after, stale_after=stale_after
        )


def stored_content(content: dict[str, Any] | None) -> dict[str, Any] | None:
    """What is needed to send an item again, fit for the database and free of known secret
    values (``{"text"}`` or ``{"path", "caption"?}``)."""
    if not content:
        return None
    clean = {
        k: SECRETS.scrub(v) if isinstance(v, str) else v
        for k, v in content.items()
        if v is not None
    }
    value = storable.json_value(clean, cap=CONTENT_CAP)
    return value if isinstance(value, dict) else None


async def _finish(
    sessionmaker: Sessions, key: str, owner: str, generation: int | None = None, **values: Any
) -> bool:
    values["updated_at"] = time.time()
    if isinstance(values.get("error"), str):  # a channel's answer can hold anything
        values["error"] = storable.text(values["error"], cap=2000)
    if isinstance(values.get("note"), str):
        values["note"] = storable.text(values["note"], cap=2000)
    where = [Delivery.ledger_key == key, Delivery.claimed_by == owner]
    if generation is not None:  # a stale claim never records over a newer generation
        where.append(Delivery.generation == generation)
    # The database away (restarting, a connection terminated) is waited out: an outcome
    # not recorded would leave the row ``sending`` for ever (and a message that went out
    # looking unsent). The statement is idempotent (same claim, same values).
    delay, deadline = 0.2, time.monotonic() + RECORD_PATIENCE
    while True:
        try:
            return await _record(sessionmaker, where, values)
        except Exception as exc:
            if not db_unavailable(exc) or time.monotonic() > deadline:
                raise
            log.warning("delivery %s: not recorded yet (%s), again in %.1fs", key[:12], exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def _record(sessionmaker: Sessions, where: list[Any], values: dict[str, Any]) -> bool:
    """One try at the outcome's UPDATE; an ending outcome is counted (``jobs.counters``)
    when the process's sessions carry the counters."""
    async with sessionmaker() as s:
        count = s.info.get(counters.SESSION_KEY) if values.get("status") in _ENDED else None
        if count is None:
            res = await s.execute(update(Delivery).where(*where).values(**values))
            await s.commit()
            return bool(rowcount(res) == 1)
        stmt = update(Delivery).where(*where).values(**values).returning(Delivery.channel)
        channels = list((await s.execute(stmt)).scalars())
        await s.commit()
    await count.deliveries((c, values["status"]) for c in channels)
    return len(channels) == 1


async def begin_send(sessionmaker: Sessions, key: str, owner: str, generation: int) -> bool:
    """``pending`` → ``sending`` right before the request goes out; False when the claim is
    no longer this owner's (taken over, resent as a newer generation)."""
    return await _finish(sessionmaker, key, owner, generation, status=SENDING)


async def mark_sent(
    sessionmaker: Sessions,
    key: str,
    owner: str,
    tries: int = 1,
    *,
    receipt: Receipt | None = None,
    generation: int | None = None,
) -> bool:
    """Record the item as sent (``tries``: send attempts made by this claim) with the
    platform's receipt: its message id (``verified`` false when it gave none), and the
    adapter's note and kind when it went other than asked."""
    message_id = (receipt.message_id or None) if receipt is not None else None
    return await _finish(
        sessionmaker,
        key,
        owner,
        generation,
        status=SENT,
        error=None,
        sent_at=time.time(),
        tries=Delivery.tries + tries,
        message_id=message_id[:255] if message_id else None,
        verified=message_id is not None,
        note=receipt.note or None if receipt is not None else None,
        sent_as=receipt.sent_as or None if receipt is not None else None,
    )


async def mark_failed(
    sessionmaker: Sessions,
    key: str,
    owner: str,
    error: str,
    tries: int = 1,
    *,
    generation: int | None = None,
) -> bool:
    return await _finish(
        sessionmaker,
        key,
        owner,
        generation,
        status=FAILED,
        error=error,
        tries=Delivery.tries + tries,
    )


async def mark_unknown(
    sessionmaker: Sessions,
    key: str,
    owner: str,
    error: str,
    tries: int = 1,
    *,
    generation: int | None = None,
) -> bool:
    """The request may have been delivered: never sent again without an operator."""
    return await _finish(
        sessionmaker,
        key,
        owner,
        generation,
        status=UNKNOWN,
        error=error,
        tries=Delivery.tries + tries,
    )


async def release(
    sessionmaker: Sessions,
    key: str,
    owner: str,
    note: str | None = None,
    *,
    generation: int | None = None,
) -> bool:
    """Give a pending claim back (it was not sent) so the next run picks it up."""
    return await _finish(
        sessionmaker, key, owner, generation, status=PENDING, claimed_by=None, error=note
    )


_deliveries: Any = Delivery.__table__
_RECEIPT = (
    _deliveries.update()
    .where(_deliveries.c.ledger_key == bindparam("k"), _deliveries.c.status == SENT)
    .values(message_id=bindparam("m"), verified=True)
)


async def record_web_receipts(s: AsyncSession, receipts: list[tuple[str, str]]) -> None:
    """Message ids of web ledger rows ``sent`` in the caller's transaction (``receipts``:
    ledger key, stored message id), written with the messages themselves."""
    await s.execute(_RECEIPT, [{"k": k, "m": m[:255]} for k, m in receipts])


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


async def _wait_for_claim(
    sessionmaker: Sessions,
    claim_once: Callable[[], Awaitable[Delivery | None]],
    key: str,
    owner: str,
    recipient: str,
    fence: Fence | None,
    wait: float,
    dead_after: float,
) -> Delivery | None:
    row = await claim_once()
    deadline = time.monotonic() + wait
    while row is None and time.monotonic() < deadline:
        held = await get(sessionmaker, key)
        if held is None or held.status not in (PENDING, SENDING) or held.claimed_by == owner:
            break
        if fence is not None and not await fence():
            raise LeaseLost(recipient)
        await asyncio.sleep(min(1.0, max(dead_after / 4, 0.05)))
        row = await claim_once()
    return row


async def deliver_once(
    sessionmaker: Sessions, send: Sender, courier: Courier, parcel: Parcel
) -> dict[str, Any]:
    """Claim → ``sending`` → send (transient failures retried with backoff, ``retry_after``
    honoured) → record ``sent`` with the receipt ``send`` returns, ``failed``, or
    ``unknown`` when the request may have landed without an answer (on a ``dedup`` channel
    that one is repeated under the same key instead). Returns the delivery dict; raises
    :class:`LeaseLost` when the courier's ``fence`` says this attempt no longer owns the job
    (nothing is sent then).

    ``courier.wait``: how long to keep trying when another claimant that still looks alive
    holds the item — a re-run of a job whose worker was killed mid-delivery waits until that
    worker is known dead instead of leaving the item pending forever.

    ``parcel.gate``: the shared rate limits. When the item cannot go now it is *parked*
    instead of waited for: the row stays ``pending`` (its content stored) under
    :data:`PARKED`, queued in order for its chat, and the answer is ``pending`` with
    ``parked``."""
    recipient, owner, fence, key = courier.recipient, courier.owner, courier.fence, parcel.key
    base = {"recipient": recipient, "kind": parcel.kind}
    if fence is not None and not await fence():
        raise LeaseLost(recipient)

    async def _claim() -> Delivery | None:
        return await claim(
            sessionmaker,
            key,
            recipient=recipient,
            owner=owner,
            kind=parcel.kind,
            item=parcel.item,
            channel=courier.channel,
            job_id=courier.job_id,
            chain_run_id=courier.chain_run_id,
            content=parcel.content,
            dedup=parcel.dedup,
            dead_after=courier.dead_after,
            stale_after=courier.stale_after,
        )

    row = await _wait_for_claim(
        sessionmaker, _claim, key, owner, recipient, fence, courier.wait, courier.dead_after
    )
    gate = parcel.gate
    if row is None:
        existing = await get(sessionmaker, key)
        status = existing.status if existing is not None else PENDING
        note: str | None = "being delivered by another worker"
        if status == SENT:
            note = None
        elif status in (UNKNOWN, DISMISSED, FAILED) and existing is not None:
            note = existing.error
        held = {"id": existing.id} if existing is not None else {}
        if existing is not None and existing.claimed_by == PARKED and status == PENDING:
            held["parked"] = True
        return {**base, "status": status, "error": note, "duplicate": True, **held}
    if gate is not None and not await gate.enter():
        return await _park(sessionmaker, gate, row, key, owner, base)
    sending = _send_claimed(
        sessionmaker,
        send,
        row,
        key,
        owner,
        base,
        dedup=parcel.dedup,
        fence=fence,
        tries=courier.tries,
        backoff=courier.backoff,
        gate=gate,
    )
    attrs = {"skilljobs.channel": courier.channel, "skilljobs.kind": parcel.kind}
    try:
        return await telemetry.traced("skilljobs.deliver", sending, attrs=attrs, outcome=_sent)
    finally:
        if gate is not None:
            await gate.leave()


def _sent(delivery: dict[str, Any]) -> dict[str, str]:
    return {"skilljobs.delivery.status": str(delivery.get("status", ""))}


async def park(sessionmaker: Sessions, key: str, owner: str, generation: int, note: str) -> bool:
    """Hand a claimed row to the outbox: ``pending`` under :data:`PARKED` (not sent)."""
    return await _finish(
        sessionmaker, key, owner, generation, status=PENDING, claimed_by=PARKED, error=note
    )


async def _park(
    sessionmaker: Sessions,
    gate: Gate,
    row: Delivery,
    key: str,
    owner: str,
    base: dict[str, Any],
    wait: float | None = None,
) -> dict[str, Any]:
    if await park(sessionmaker, key, owner, row.generation, gate.note):
        await gate.parked(row.id, wait)
    else:
        await gate.leave()
    return {**base, "status": PENDING, "error": gate.note, "parked": True, "id": row.id}


async def _wait_out(
    sessionmaker: Sessions,
    gate: Gate,
    retry: RetryWindow,
    row: Delivery,
    key: str,
    owner: str,
    base: dict[str, Any],
    error: str,
    attempt: int,
) -> dict[str, Any]:
    """A send an outage stopped: parked to be tried again after a pause while the row's
    retry window lasts (the row keeps its place at the head of its chat's queue), else
    ``failed`` with the reason (resendable)."""
    gen = row.generation
    now = time.time()
    since = row.retry_since if row.retry_since is not None else now
    tries = (row.tries or 0) + attempt
    left = since + retry.window - now
    if left <= 0:
        reason = f"gave up after {tries} tries over {now - since:.0f}s: {error}"
        await mark_failed(sessionmaker, key, owner, reason, attempt, generation=gen)
        return {**base, "status": FAILED, "error": reason}
    wait = max(0.05, min(retry.pause(tries), left))
    note = f"retrying in the outbox (try {tries} failed: {error})"
    parked = await _finish(
        sessionmaker,
        key,
        owner,
        gen,
        status=PENDING,
        claimed_by=PARKED,
        error=note,
        tries=Delivery.tries + attempt,
        retry_since=since,
    )
    if parked:
        log.info("delivery to %s: %s; again in %.1fs", base["recipient"], error, wait)
        await gate.parked(row.id, wait)
    else:
        await gate.leave()
    return {**base, "status": PENDING, "error": note, "parked": True, "id": row.id}


async def claim_parked(
    sessionmaker: Sessions, row: Delivery, owner: str, *, sending: bool = False
) -> bool:
    """Take a parked row out of the outbox for ``owner`` (compare-and-set: one taker);
    ``sending``: and mark it ``sending`` in the same statement, its request going next."""
    values: dict[str, Any] = {"claimed_by": owner, "updated_at": time.time()}
    if sending:
        values["status"] = SENDING
    async with sessionmaker() as s:
        res = await s.execute(
            update(Delivery)
            .where(
                Delivery.id == row.id,
                Delivery.status == PENDING,
                Delivery.claimed_by == PARKED,
                Delivery.generation == row.generation,
            )
            .values(**values)
        )
        await s.commit()
        return bool(rowcount(res) == 1)


async def send_claimed(
    sessionmaker: Sessions,
    send: Sender,
    row: Delivery,
    owner: str,
    *,
    dedup: bool = False,
    tries: int = DEFAULT_TRIES,
    backoff: float = 1.0,
    gate: Gate | None = None,
    sending: bool = False,
) -> dict[str, Any]:
    """Send a row this ``owner`` holds (a parked one it took): ``sending`` → outcome
    (``sending``: the row says so already, :func:`claim_parked`)."""
    base = {"recipient": row.recipient, "kind": row.kind}
    return await _send_claimed(
        sessionmaker,
        send,
        row,
        row.ledger_key,
        owner,
        base,
        dedup=dedup,
        fence=None,
        tries=tries,
        backoff=backoff,
        gate=gate,
        sending=sending,
    )


async def _send_claimed(
    sessionmaker: Sessions,
    send: Sender,
    row: Delivery,
    key: str,
    owner: str,
    base: dict[str, Any],
    *,
    dedup: bool,
    fence: Fence | None,
    tries: int,
    backoff: float,
    gate: Gate | None = None,
    sending: bool = False,
) -> dict[str, Any]:
    gen = row.generation
    recipient = base["recipient"]
    error = ""
    for attempt in range(1, max(1, tries) + 1):
        if fence is not None and not await fence():
            await asyncio.shield(
                release(sessionmaker, key, owner, "not sent: lease lost", generation=gen)
            )
            raise LeaseLost(recipient)
        if not (sending and attempt == 1) and not await begin_send(sessionmaker, key, owner, gen):
            return {**base, "status": PENDING, "error": "taken over", "duplicate": True}
        marker = SEND_KEY.set(SendKey(f"{key}:{gen}"))
        try:
            receipt = await send()
        except DeliveryOutcomeUnknown as exc:
            error = exc.reason
            if not dedup or attempt >= tries:
                await mark_unknown(sessionmaker, key, owner, error, attempt, generation=gen)
                return {**base, "status": UNKNOWN, "error": error}
            log.info("delivery to %s: outcome unknown (%s), repeating it", recipient, error)
            await asyncio.sleep(min(backoff * 2 ** (attempt - 1), MAX_WAIT))
            continue
        except DeliveryTransientError as exc:
            error = exc.reason
            if gate is not None and exc.retry_after:
                # the platform said when: the row waits in the outbox, not in this task
                return await _park(sessionmaker, gate, row, key, owner, base, exc.retry_after)
            if gate is not None and gate.retry is not None:
                # an outage: waited out in the outbox for the channel's window
                return await _wait_out(
                    sessionmaker, gate, gate.retry, row, key, owner, base, error, attempt
                )
            if attempt >= tries:
                break
            pause = exc.retry_after if exc.retry_after is not None else backoff * 2 ** (attempt - 1)
            log.info("delivery to %s failed (%s), retrying in %.1fs", recipient, error, pause)
            await asyncio.sleep(min(max(pause, 0.0), MAX_WAIT))
            continue
        except DeliveryPermanentError as exc:
            await mark_failed(sessionmaker, key, owner, exc.reason, attempt, generation=gen)
            return {**base, "status": FAILED, "error": exc.reason}
        except asyncio.CancelledError:
            # The request may have gone out: unknown, unless the platform drops repeats.
            if dedup:
                await asyncio.shield(
                    release(sessionmaker, key, owner, "interrupted while sending", generation=gen)
                )
            else:
                await asyncio.shield(
                    mark_unknown(
                        sessionmaker, key, owner, "interrupted while sending", generation=gen
                    )
                )
            raise
        except Exception as exc:  # an adapter bug must not lose the rest of the delivery
            log.exception("delivery to %s: unexpected error", recipient)
            reason = f"internal error: {type(exc).__name__}: {exc}"
            await mark_failed(sessionmaker, key, owner, reason, attempt, generation=gen)
            return {**base, "status": FAILED, "error": reason}
        finally:
            SEND_KEY.reset(marker)
        await asyncio.shield(
            mark_sent(sessionmaker, key, owner, attempt, receipt=receipt, generation=gen)
        )
        return {**base, "status": SENT, "error": None}
    reason = f"gave up after {tries} tries: {error}"
    await mark_failed(sessionmaker, key, owner, reason, tries, generation=gen)
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
        if rowcount(res) != 1:
            dup.add(i)
    return dup
