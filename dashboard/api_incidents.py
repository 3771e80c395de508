"""Incidents and bulk actions: failures grouped by signature, and acting on jobs by filter."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Query, Request

from dashboard.api_jobs import actor_of, services_of
from dashboard.errors import ApiError
from jobs.queue import control, incidents

router = APIRouter(prefix="/api/v1")


@router.get("/incidents")
async def list_incidents(
    request: Request,
    status: str | None = Query(None, pattern="^(open|acked)$"),
    skill: str | None = None,
    limit: int = Query(50, ge=1, le=500),
) -> dict[str, Any]:
    """Incidents, most recently seen first: count, first/last seen, sample job ids."""
    sm = services_of(request).sessionmaker
    items = await incidents.list_incidents(sm, status=status, skill=skill, limit=limit)
    return {"items": items, "open": await incidents.count_open(sm)}


@router.post("/incidents/{incident_id}/ack")
async def ack_incident(incident_id: str, request: Request) -> dict[str, Any]:
    """Acknowledge; a later failure of the same signature re-opens it."""
    sm = services_of(request).sessionmaker
    try:
        return await incidents.ack(sm, incident_id, actor=actor_of(request))
    except LookupError as exc:
        raise ApiError(404, str(exc)) from exc


@router.post("/jobs/bulk")
async def bulk(request: Request, body: dict[str, Any] = Body(...)) -> dict[str, Any]:
    """``{"action": "retry"|"cancel", "filter": {status, skill, error_type, since, until,
    incident}, "dry_run": true}`` → the count matched (and affected unless a dry run).
    ``dry_run`` defaults to true: acting takes an explicit ``false``."""
    action = body.get("action")
    raw_filter = body.get("filter") or {}
    dry_run = body.get("dry_run", True)
    if not isinstance(raw_filter, dict) or not isinstance(dry_run, bool):
        raise ApiError(422, "filter must be an object and dry_run true or false")
    try:
        flt = control.JobFilter.parse(raw_filter)
        return await control.bulk_action(
            services_of(request),
            str(action),
            flt,
            dry_run=dry_run,
            actor=actor_of(request),
        )
    except LookupError as exc:
        raise ApiError(404, str(exc)) from exc
    except ValueError as exc:
        raise ApiError(422, str(exc)) from exc
