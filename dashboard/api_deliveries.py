"""Deliveries across jobs: the ledger's rows by status, channel or job; resend or dismiss
one, or every one the list's filter matches (bulk)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Body, Query, Request

from dashboard import queries
from dashboard.api_jobs import actor_of, services_of
from dashboard.errors import ApiError
from dashboard.shapes import delivery_dict
from delivery.channels.registry import channels_for
from delivery.custody import dismiss, resend
from delivery.ledger import action_for
from jobs import audit
from jobs.models import Delivery
from jobs.services import Services

router = APIRouter(prefix="/api/v1")

DEFAULT_STATUSES = ("failed", "unknown")
DEFAULT_SINCE_S = 7 * 86400.0


def _statuses(status: str | None, job: str | None) -> tuple[str, ...]:
    statuses = tuple(s.strip() for s in (status or "").split(",") if s.strip())
    bad = [s for s in statuses if s not in queries.DELIVERY_STATUSES]
    if bad:
        allowed = ", ".join(str(s) for s in queries.DELIVERY_STATUSES)
        raise ApiError(422, f"status must be among {allowed} (not {bad[0]!r})")
    return statuses or (() if job else DEFAULT_STATUSES)


@router.get("/deliveries")
async def list_deliveries(
    request: Request,
    status: str | None = Query(None, max_length=200, description="comma list"),
    job: str | None = Query(None, max_length=64),
    channel: str | None = Query(None, max_length=64),
    since: float | None = Query(None, allow_inf_nan=False),
    limit: int = Query(50, ge=1, le=queries.MAX_PAGE),
) -> dict[str, Any]:
    """Newest first. Without ``job``: ``failed`` and ``unknown`` of the last 7 days, and
    every one ``pending`` past ``SKILLJOBS_DELIVERY_PENDING_STALE_SEC``, unless ``status`` /
    ``since`` say otherwise (the status index serves the range). Each open one says what
    an operator can do (``action``)."""
    svc = services_of(request)
    stuck = None
    if not status and not job:
        stuck = time.time() - float(svc.settings.delivery_pending_stale_sec)
    async with svc.read_sessionmaker() as session:
        rows = await queries.list_deliveries(
            session,
            statuses=_statuses(status, job),
            since=since if since is not None else time.time() - DEFAULT_SINCE_S,
            channel=channel or None,
            job_id=job or None,
            limit=limit,
            pending_before=stuck,
        )
    return {"items": [{**delivery_dict(d), **_custody(d)} for d in rows]}


BULK_CAP = 500  # deliveries one bulk action takes at most (each resend is a real send)
BULK_ACTIONS = ("resend", "dismiss")
_BULK_FIELDS = {"status", "channel", "job", "since"}


@router.post("/deliveries/bulk")
async def bulk(request: Request, body: dict[str, Any] = Body(...)) -> dict[str, Any]:
    """``{"action": "resend"|"dismiss", "filter": {status, channel, job, since} (the
    list's filter), "dry_run": true, "limit": n}`` → ``{"matched", "limit", "capped",
    "affected", "delivery_ids", "refused"}``: the oldest ``limit`` (at most 500) matching
    deliveries are taken; ``dry_run`` defaults to true. Each one is audited as it is
    resent or dismissed, and the whole as ``bulk.resend`` / ``bulk.dismiss``."""
    action, flt = body.get("action"), body.get("filter") or {}
    dry_run, limit = body.get("dry_run", True), body.get("limit", BULK_CAP)
    if action not in BULK_ACTIONS:
        raise ApiError(422, f"unknown action {action!r}: one of {', '.join(BULK_ACTIONS)}")
    if not isinstance(flt, dict) or not isinstance(dry_run, bool):
        raise ApiError(422, "filter must be an object and dry_run true or false")
    if set(flt) - _BULK_FIELDS:
        unknown = ", ".join(sorted(set(flt) - _BULK_FIELDS))
        raise ApiError(
            422, f"unknown filter field(s): {unknown} (known: channel, job, since, status)"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BULK_CAP:
        raise ApiError(422, f"limit must be a whole number from 1 to {BULK_CAP}")
    since = flt.get("since")
    if since is not None and (isinstance(since, bool) or not isinstance(since, int | float)):
        raise ApiError(422, "since must be a time in epoch seconds")
    job = str(flt["job"]) if flt.get("job") else None
    svc = services_of(request)
    async with svc.sessionmaker() as session:
        matched, ids = await queries.delivery_matches(
            session,
            statuses=_statuses(flt.get("status"), job),
            since=float(since) if since is not None else time.time() - DEFAULT_SINCE_S,
            channel=str(flt["channel"]) if flt.get("channel") else None,
            job_id=job,
            limit=limit,
            resendable_on=set(channels_for(svc)) if action == "resend" else None,
        )
    out: dict[str, Any] = {
        "action": action,
        "dry_run": dry_run,
        "filter": flt,
        "matched": matched,
        "limit": limit,
        "capped": matched > limit,
        "affected": 0,
        "delivery_ids": ids[:100],
        "refused": [],
    }
    if dry_run:
        return out
    actor = actor_of(request)
    out["affected"], out["refused"] = await _apply(svc, str(action), ids, actor)
    async with svc.sessionmaker() as s:
        audit.record(
            s,
            action=f"bulk.{action}",
            target="deliveries",
            actor=actor,
            details={
                "filter": flt,
                "matched": matched,
                "taken": len(ids),
                "affected": out["affected"],
                "result": "ok" if out["affected"] == len(ids) else "partial",
            },
        )
        await s.commit()
    return out


async def _apply(
    svc: Services, action: str, ids: list[int], actor: str
) -> tuple[int, list[dict[str, Any]]]:

    done, refused = 0, list[dict[str, Any]]()
    for delivery_id in ids:
        if action == "resend":
            res = await resend(svc, delivery_id, actor=actor)
        else:
            res = await dismiss(svc.sessionmaker, delivery_id, actor=actor)
        if res.ok:
            done += 1
        elif len(refused) < 100:
            refused.append({"delivery_id": delivery_id, "error": res.message})
    return done, refused


def _custody(d: Delivery) -> dict[str, Any]:
    """Who it belongs to, its generation and its receipt (delivery custody)."""
    return {
        "job_id": d.job_id,
        "chain_run_id": d.chain_run_id,
        "generation": d.generation,
        "message_id": d.message_id,
        "verified": d.verified if d.status == "sent" else None,
        "note": d.note,
        "sent_as": d.sent_as,
        "resendable": bool(d.content),
        "action": action_for(d.status, bool(d.content)),
    }


@router.post("/deliveries/{delivery_id}/resend")
async def resend_delivery(delivery_id: int, request: Request) -> dict[str, Any]:
    """Send an ``unknown``, ``failed`` or ``dismissed`` delivery again (a new generation)."""

    out = await resend(services_of(request), delivery_id, actor=actor_of(request))
    if not out.ok:
        raise ApiError(out.status_code, out.message)
    return out.to_dict()


@router.post("/deliveries/{delivery_id}/dismiss")
async def dismiss_delivery(delivery_id: int, request: Request) -> dict[str, Any]:
    """Close an ``unknown`` or ``failed`` delivery: it is never sent again."""

    out = await dismiss(services_of(request).sessionmaker, delivery_id, actor=actor_of(request))
    if not out.ok:
        raise ApiError(out.status_code, out.message)
    return out.to_dict()
