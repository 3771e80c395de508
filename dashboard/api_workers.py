"""Pausing workers: a paused worker finishes what it runs and claims nothing new until it
is resumed (the worker reads its pause key before each claim, at most once a second)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from dashboard import queries
from dashboard.api_jobs import actor_of, services_of
from dashboard.errors import ApiError, not_found
from jobs.constants import WORKER_PAUSE
from jobs.models import OpsAction, Worker
from jobs.services import Services

router = APIRouter(prefix="/api/v1")

PAUSE_TTL_S = 30 * 86400  # a paused worker that never comes back leaves no key forever


def _redis(svc: Services) -> Any:
    if svc.redis is None:
        raise ApiError(503, "Redis is not connected: workers cannot be paused now", "transient")
    return svc.redis


@router.get("/workers/state")
async def worker_state(request: Request) -> dict[str, Any]:
    """``{"items": [{"id", "paused"}]}`` for the workers ``GET /api/v1/workers`` lists."""
    svc = services_of(request)
    async with svc.sessionmaker() as session:
        ids = [w.id for w in await queries.list_workers(session)]
    if not ids:
        return {"items": []}
    keys = [svc.settings.key(WORKER_PAUSE, wid) for wid in ids]
    flags = await _redis(svc).mget(keys)
    return {
        "items": [{"id": wid, "paused": f is not None} for wid, f in zip(ids, flags, strict=True)]
    }


async def _set(request: Request, worker_id: str, paused: bool) -> dict[str, Any]:
    svc = services_of(request)
    async with svc.sessionmaker() as session:
        if await session.get(Worker, worker_id) is None:
            raise not_found(f"worker {worker_id}")
    key = svc.settings.key(WORKER_PAUSE, worker_id)
    actor = actor_of(request)
    if paused:
        await _redis(svc).set(key, actor, ex=PAUSE_TTL_S)
    else:
        await _redis(svc).delete(key)
    action = "worker.pause" if paused else "worker.resume"
    async with svc.sessionmaker() as s:
        s.add(OpsAction(action=action, target=worker_id[:255], actor=actor))
        await s.commit()
    return {"ok": True, "id": worker_id, "paused": paused}


@router.post("/workers/{worker_id}/pause")
async def pause(worker_id: str, request: Request) -> dict[str, Any]:
    """Stop taking jobs (running ones finish); audited."""
    return await _set(request, worker_id, True)


@router.post("/workers/{worker_id}/resume")
async def resume(worker_id: str, request: Request) -> dict[str, Any]:
    """Take jobs again; audited."""
    return await _set(request, worker_id, False)
