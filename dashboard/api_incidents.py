"""Incidents: failures grouped by signature (acting on their jobs is a bulk action with
``{"incident": id}`` in its filter, ``dashboard.api_jobs``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from dashboard.api_jobs import actor_of, services_of
from dashboard.errors import ApiError
from jobs.queue import incidents

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
