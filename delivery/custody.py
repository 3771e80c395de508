"""Operator custody of deliveries: list them by state, send one again, or dismiss it.

A delivery whose outcome is ``unknown`` (the request may have landed) or that ``failed`` is
never sent again by itself on a channel that does not de-duplicate; an operator decides:

* ``resend`` starts a new *generation* of the row and sends its stored content (the text,
  or the file and its caption) to the same recipient under the same ledger key. Every
  outcome is recorded only by a claim of the current generation, so a stale worker still
  holding the old one can never overwrite what the resend recorded.
* ``dismiss`` closes it (``dismissed``): nobody sends it again.

Both are recorded in the audit trail (``ops_actions``) with who did it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from delivery.channels.base import Channel, Courier, Receipt
from delivery.channels.registry import channels_for
from delivery.errors import DeliveryPermanentError
from delivery.ledger import (
    DISMISSED,
    FAILED,
    UNKNOWN,
    Parcel,
    Sender,
    custody_dict,
    deliver_once,
)
from delivery.plan import SEALED_RESULT, delivered_folder, plan, write_files
from delivery.richtext import PlainText
from jobs import audit
from jobs.db import Sessions, rowcount
from jobs.models import PENDING, Delivery, DeliveryStatus
from jobs.services import Services

STATUSES = tuple(str(s) for s in DeliveryStatus)
#: the states an operator may act on
OPEN = (str(UNKNOWN), str(FAILED))
RESENDABLE = (str(UNKNOWN), str(FAILED), str(DISMISSED))
MAX_LIST = 500


@dataclass
class Outcome:
    """An operator action's answer: ``status_code`` as the HTTP API gives it."""

    ok: bool
    message: str
    status_code: int = 200
    delivery: dict[str, Any] | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": self.ok, "message": self.message}
        if not self.ok:
            body["error"] = self.message
            body["error_type"] = "recoverable"
        if self.delivery is not None:
            body["delivery"] = self.delivery
        return body


async def list_deliveries(
    sessionmaker: Sessions,
    *,
    status: str | None = None,
    job: str | None = None,
    limit: int = 100,
    stale_after: float = 300.0,
) -> list[dict[str, Any]]:
    """Deliveries newest first, by ``status`` (comma list) and/or ``job`` (a job or a chain
    run id). Without either: every ``unknown`` and ``failed`` one, and every one still
    ``pending`` after ``stale_after`` seconds."""
    statuses = [s.strip() for s in (status or "").split(",") if s.strip()]
    bad = [s for s in statuses if s not in STATUSES]
    if bad:
        raise ValueError(f"status must be among {', '.join(STATUSES)} (not {bad[0]!r})")
    if not statuses and not job:
        statuses = list(OPEN)
    q = select(Delivery).order_by(Delivery.id.desc()).limit(max(1, min(limit, MAX_LIST)))
    if statuses and not status and not job:
        stuck = (Delivery.status == PENDING) & (Delivery.created_at < time.time() - stale_after)
        q = q.where(Delivery.status.in_(statuses) | stuck)
    elif statuses:
        q = q.where(Delivery.status.in_(statuses))
    if job:
        q = q.where((Delivery.job_id == job) | (Delivery.chain_run_id == job))
    async with sessionmaker() as s:
        return [custody_dict(r) for r in (await s.execute(q)).scalars()]


async def _audit(
    sessionmaker: Sessions, action: str, row: Delivery, actor: str, **details: Any
) -> None:
    async with sessionmaker() as s:
        audit.record(
            s,
            action=action,
            target=str(row.id),
            actor=actor or "",
            details={"recipient": row.recipient, "job_id": row.job_id, **details},
        )
        await s.commit()


async def _row(sessionmaker: Sessions, delivery_id: int) -> Delivery | None:
    async with sessionmaker() as s:
        row: Delivery | None = await s.get(Delivery, delivery_id)
        return row


async def dismiss(sessionmaker: Sessions, delivery_id: int, *, actor: str = "") -> Outcome:
    """Close an ``unknown`` or ``failed`` delivery: it is never sent again."""
    row = await _row(sessionmaker, delivery_id)
    if row is None:
        return Outcome(False, f"no delivery {delivery_id}", 404)
    if row.status not in OPEN:
        return Outcome(
            False,
            f"delivery {delivery_id} is {row.status}: only unknown or failed ones are dismissed",
            409,
            custody_dict(row),
        )
    async with sessionmaker() as s:
        res = await s.execute(
            update(Delivery)
            .where(Delivery.id == row.id, Delivery.status == row.status)
            .values(status=DISMISSED, claimed_by=None, updated_at=time.time())
        )
        await s.commit()
    if rowcount(res) != 1:
        return Outcome(False, f"delivery {delivery_id} changed meanwhile; look again", 409)
    await _audit(sessionmaker, "delivery_dismiss", row, actor, was=row.status)
    fresh = await _row(sessionmaker, delivery_id)
    return Outcome(True, "dismissed", delivery=custody_dict(fresh) if fresh else None)


def adapter_for(
    services: Services, row: Delivery, channels: dict[str, Channel] | None = None
) -> Channel | None:
    """The adapter a stored delivery goes out on (a web one bound to its job)."""
    chans = channels if channels is not None else channels_for(services)
    name = row.channel or row.recipient.partition(":")[0]
    adapter = chans.get(name)
    return adapter.for_job(row.job_id) if adapter is not None else None


def sender_for(
    services: Services, adapter: Channel, contact: str, content: dict[str, Any], kind: str
) -> Sender:
    """Send a stored delivery's content (``{"text"}`` or ``{"path", "caption"?}``, and
    ``reply_to`` when it answers a message) again; files only from inside the workspaces.
    A result held sealed because its channel was not configured is planned for ``adapter``
    now and sent whole (text, then files)."""
    if SEALED_RESULT in content:
        return _held_result_sender(services, adapter, contact, content[SEALED_RESULT])
    text = content.get("text")
    caption = content.get("caption")
    if content.get("plain"):  # stored as plain text: never read as Markdown
        text = PlainText(text) if isinstance(text, str) else text
        caption = PlainText(caption) if isinstance(caption, str) else caption
    reply = content.get("reply_to")
    if reply not in (None, "") and "#" not in contact:  # a reply travels in the contact
        contact = f"{contact}#{reply}"
    path = content.get("path")
    outside = False
    if isinstance(path, str) and path:
        root = Path(services.settings.resolved_workspace_root).resolve()
        outside = not Path(path).resolve().is_relative_to(root)

    async def send() -> Receipt:
        if isinstance(path, str) and path:
            if outside:
                raise DeliveryPermanentError(f"{Path(path).name} is outside the workspaces")
            return await adapter.send_media(kind, contact, path, caption)
        return await adapter.send_text(contact, text if isinstance(text, str) else "")

    return send


def _inside(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root)


def _held_result_sender(
    services: Services, adapter: Channel, contact: str, sealed: dict[str, str]
) -> Sender:
    root = Path(services.settings.resolved_workspace_root).resolve()

    async def send() -> Receipt:
        try:
            held = services.box.decrypt(sealed)
        except (ValueError, KeyError, TypeError) as exc:
            raise DeliveryPermanentError(f"the held result cannot be read: {exc}") from exc
        ws = Path(str(held.get("workspace") or root))
        items = plan(
            held.get("result") or {},
            held.get("artifacts") or [],
            adapter,
            skill=str(held.get("skill") or ""),
            lang=str(held.get("lang") or "en"),
            workspace=ws,
            folder=delivered_folder(ws, "held"),
        )
        await write_files(items, "held")
        reply = held.get("reply_to")
        to = f"{contact}#{reply}" if reply and "#" not in contact else contact
        ids: list[str] = []
        for i, item in enumerate(items):
            target = to if i == 0 else contact
            if item.path is None:
                got = await adapter.send_text(target, item.text or "")
            elif not await asyncio.to_thread(_inside, item.path, root):
                raise DeliveryPermanentError(f"{Path(item.path).name} is outside the workspaces")
            else:
                got = await adapter.send_media(item.kind, target, item.path, item.text)
            ids += got.message_ids
        return Receipt.of(*ids)

    return send


async def resend(
    services: Services,
    delivery_id: int,
    *,
    actor: str = "",
    channels: dict[str, Channel] | None = None,
    backoff: float = 1.0,
) -> Outcome:
    """Send an ``unknown``, ``failed`` or ``dismissed`` delivery again as a new generation
    (its stored content, to the same recipient, under the same ledger key)."""
    sm = services.sessionmaker
    row = await _row(sm, delivery_id)
    if row is None:
        return Outcome(False, f"no delivery {delivery_id}", 404)
    if row.status not in RESENDABLE:
        return Outcome(
            False,
            f"delivery {delivery_id} is {row.status}: only unknown, failed or dismissed ones "
            "are sent again",
            409,
            custody_dict(row),
        )
    content = row.content or {}
    if not content:
        return Outcome(False, f"delivery {delivery_id} has no stored content to send again", 409)
    adapter = adapter_for(services, row, channels)
    if adapter is None:
        return Outcome(False, f"channel {row.channel!r} is not configured here", 409)
    owner = f"resend-{uuid.uuid4().hex[:12]}#{row.generation + 1}"
    async with sm() as s:
        res = await s.execute(
            update(Delivery)
            .where(
                Delivery.id == row.id,
                Delivery.status == row.status,
                Delivery.generation == row.generation,
            )
            .values(
                status=PENDING,
                generation=row.generation + 1,
                claimed_by=owner,
                error=None,
                message_id=None,
                verified=None,
                note=None,
                sent_as=None,
                sent_at=None,
                retry_since=None,
                updated_at=time.time(),
            )
        )
        await s.commit()
    if rowcount(res) != 1:
        return Outcome(False, f"delivery {delivery_id} changed meanwhile; look again", 409)
    await _audit(sm, "delivery_resend", row, actor, was=row.status, generation=row.generation + 1)
    contact = row.recipient.partition(":")[2]
    courier = Courier(
        row.recipient,
        owner,
        channel=row.channel,
        job_id=row.job_id,
        chain_run_id=row.chain_run_id,
        backoff=backoff,
    )
    parcel = Parcel(row.ledger_key, row.kind, row.item, dedup=adapter.dedups_for(contact))
    out = await deliver_once(
        sm, sender_for(services, adapter, contact, content, row.kind), courier, parcel
    )
    fresh = await _row(sm, delivery_id)
    body = custody_dict(fresh) if fresh is not None else None
    if out["status"] == "sent":
        return Outcome(True, "sent again", delivery=body)
    return Outcome(False, f"not sent: {out['status']}: {out.get('error')}", 502, body)


__all__ = [
    "OPEN",
    "RESENDABLE",
    "STATUSES",
    "Outcome",
    "adapter_for",
    "dismiss",
    "list_deliveries",
    "resend",
    "sender_for",
]
