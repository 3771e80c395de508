"""Deliveries across jobs: the ledger's rows by status, channel or job."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query, Request

from dashboard import queries
from dashboard.api_jobs import actor_of, delivery_dict, services_of
from dashboard.errors import ApiError

router = APIRouter(prefix="/api/v1")

DEFAULT_STATUSES = ("failed", "unknown")
DEFAULT_SINCE_S = 7 * 86400.0


@router.get("/deliveries")
async def list_deliveries(
    request: Request,
    status: str | None = Query(None, max_length=200, description="comma list"),
    job: str | None = Query(None, max_length=64),
    channel: str | None = Query(None, max_length=64),
    since: float | None = Query(None, allow_inf_nan=False),
    limit: int = Query(50, ge=1, le=queries.MAX_PAGE),
) -> dict[str, Any]:
    """Newest first. Without ``job``: ``failed`` and ``unknown`` of the last 7 days unless
    ``status`` / ``since`` say otherwise (the status index serves the range)."""
    statuses = tuple(s.strip() for s in (status or "").split(",") if s.strip())
    bad = [s for s in statuses if s not in queries.DELIVERY_STATUSES]
    if bad:
        allowed = ", ".join(str(s) for s in queries.DELIVERY_STATUSES)
        raise ApiError(422, f"status must be among {allowed} (not {bad[0]!r})")
    if not statuses and not job:
        statuses = DEFAULT_STATUSES
    async with services_of(request).read_sessionmaker() as session:
        rows = await queries.list_deliveries(
            session,
            statuses=statuses,
            since=since if since is not None else time.time() - DEFAULT_SINCE_S,
            channel=channel or None,
            job_id=job or None,
            limit=limit,
        )
    return {"items": [{**delivery_dict(d), **_custody(d)} for d in rows]}


def _custody(d: Any) -> dict[str, Any]:
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
    }


@router.post("/deliveries/{delivery_id}/resend")
async def resend_delivery(delivery_id: int, request: Request) -> dict[str, Any]:
    """Send an ``unknown``, ``failed`` or ``dismissed`` delivery again (a new generation)."""
    from delivery.custody import resend

    out = await resend(services_of(request), delivery_id, actor=actor_of(request))
    if not out.ok:
        raise ApiError(out.status_code, out.message)
    return out.to_dict()


@router.post("/deliveries/{delivery_id}/dismiss")
async def dismiss_delivery(delivery_id: int, request: Request) -> dict[str, Any]:
    """Close an ``unknown`` or ``failed`` delivery: it is never sent again."""
    from delivery.custody import dismiss

    out = await dismiss(services_of(request).sessionmaker, delivery_id, actor=actor_of(request))
    if not out.ok:
        raise ApiError(out.status_code, out.message)
    return out.to_dict()
