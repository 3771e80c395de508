"""Who did what: the operations log (``ops_actions``) and the caller's own identity."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from dashboard import queries
from dashboard.api_jobs import services_of
from dashboard.auth import identity_of
from jobs.models import OpsAction

router = APIRouter(prefix="/api/v1")


def result_of(action: OpsAction) -> str:
    """``refused`` for a request the guard turned away, else what the action recorded
    (``ok`` when it recorded nothing: actions are logged once they took effect)."""
    details = action.details if isinstance(action.details, dict) else {}
    if action.action == "refused":
        return "refused"
    for key in ("result", "outcome", "status"):
        value = details.get(key)
        if isinstance(value, str) and value:
            return value
    if details.get("ok") is False:
        return "failed"
    return "ok"


def audit_dict(a: OpsAction) -> dict[str, Any]:
    return {
        "id": a.id,
        "at": a.created_at,
        "actor": a.actor,
        "action": a.action,
        "target": a.target,
        "result": result_of(a),
        "details": a.details if isinstance(a.details, dict) else {},
    }


@router.get("/audit")
async def audit(
    request: Request,
    actor: str | None = Query(None, max_length=128),
    action: str | None = Query(None, max_length=64),
    target: str | None = Query(None, max_length=255),
    before: int | None = Query(None, ge=1, description="an id from the previous page"),
    limit: int = Query(50, ge=1, le=queries.MAX_PAGE),
) -> dict[str, Any]:
    """Actions newest first: who (admin, read, session:<id>), what, target, when, result."""
    async with services_of(request).read_sessionmaker() as session:
        rows = await queries.list_audit(
            session, actor=actor, action=action, target=target, before=before, limit=limit
        )
    return {
        "items": [audit_dict(a) for a in rows],
        "next_before": rows[-1].id if len(rows) == limit else None,
    }


@router.get("/me")
async def me(request: Request) -> dict[str, Any]:
    """The caller's identity, so the page shows actions only to a token that may act."""
    ident = identity_of(request)
    return {"kind": ident.kind, "actor": ident.actor, "can_change": ident.can_change}
