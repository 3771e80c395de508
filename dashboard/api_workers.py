"""Worker actions: pause (finish what it runs, claim nothing new until resumed), resume,
drain (claim nothing new, finish what it runs, then exit) — ``jobs.queue.worker_control``,
each audited."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from dashboard import queries
from dashboard.api_jobs import actor_of, services_of
from dashboard.errors import ApiError
from jobs.queue import worker_control

router = APIRouter(prefix="/api/v1")


@router.get("/workers/state")
async def worker_state(request: Request) -> dict[str, Any]:
    """``{"items": [{"id", "paused", "draining"}]}`` for the workers ``GET
    /api/v1/workers`` lists."""
    svc = services_of(request)
    async with svc.sessionmaker() as session:
        ids = [w.id for w in await queries.list_workers(session)]
    try:
        found = await worker_control.states(svc, ids)
    except worker_control.WorkerControlError as exc:
        raise ApiError(exc.status_code, str(exc), "transient") from exc
    return {"items": [{"id": wid, **found[wid]} for wid in ids]}


async def _act(request: Request, action: str, worker_id: str) -> dict[str, Any]:
    svc = services_of(request)
    try:
        return await worker_control.act(svc, action, worker_id, actor=actor_of(request))
    except worker_control.WorkerControlError as exc:
        kind = "transient" if exc.status_code == 503 else "recoverable"
        raise ApiError(exc.status_code, str(exc), kind) from exc


@router.post("/workers/{worker_id}/pause")
async def pause(worker_id: str, request: Request) -> dict[str, Any]:
    """Stop taking jobs (running ones finish); audited."""
    return await _act(request, "pause", worker_id)


@router.post("/workers/{worker_id}/resume")
async def resume(worker_id: str, request: Request) -> dict[str, Any]:
    """Take jobs again (also calls off a drain under way); audited."""
    return await _act(request, "resume", worker_id)


@router.post("/workers/{worker_id}/forget")
async def forget(worker_id: str, request: Request) -> dict[str, Any]:
    """Remove a stopped (or long silent) worker from the list; audited."""
    svc = services_of(request)
    try:
        return await worker_control.forget(svc, worker_id, actor=actor_of(request))
    except worker_control.WorkerControlError as exc:
        raise ApiError(exc.status_code, str(exc), "recoverable") from exc


@router.post("/workers/{worker_id}/drain")
async def drain(worker_id: str, request: Request) -> dict[str, Any]:
    """Stop taking jobs, finish the running ones, then exit; audited."""
    return await _act(request, "drain", worker_id)
