"""Schedules API: a thin HTTP layer over ``chains.schedules``."""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse

from dashboard.api_jobs import actor_of, optional, safe, services_of
from dashboard.errors import ApiError, not_found

router = APIRouter(prefix="/api/v1")


def _schedules() -> Any:
    return optional("chains.schedules")


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _call(fn: Any, *args: Any, **kw: Any) -> Any:
    """Call a schedules function; its refusals become 4xx envelopes."""
    try:
        return await _maybe(fn(*args, **kw))
    except LookupError as exc:
        raise ApiError(404, str(exc)) from exc
    except ValueError as exc:
        raise ApiError(422, str(exc)) from exc


def _dict(mod: Any, obj: Any) -> Any:
    if obj is None or isinstance(obj, dict):
        return safe(obj)
    return safe(mod.to_dict(obj))


@router.get("/schedules")
async def list_schedules(request: Request) -> dict[str, Any]:
    mod = _schedules()
    items = await _call(mod.list_schedules, services_of(request))
    return {"items": [_dict(mod, s) for s in items]}


@router.post("/schedules", status_code=201)
async def create_schedule(request: Request, body: dict[str, Any] = Body(...)) -> JSONResponse:
    mod = _schedules()
    created = await _call(mod.create, services_of(request), body)
    return JSONResponse(_dict(mod, created), status_code=201)


@router.get("/schedules/{schedule_id}")
async def get_schedule(schedule_id: str, request: Request) -> Any:
    mod = _schedules()
    found = await _call(mod.get, services_of(request), schedule_id)
    if found is None:
        raise not_found(f"schedule {schedule_id}")
    return _dict(mod, found)


@router.patch("/schedules/{schedule_id}")
async def patch_schedule(
    schedule_id: str, request: Request, body: dict[str, Any] = Body(...)
) -> Any:
    """``{"enabled": bool}`` toggles; any other fields of the schedule file update it."""
    mod = _schedules()
    svc = services_of(request)
    changes = dict(body)
    result = None
    if "enabled" in changes:
        enabled = changes.pop("enabled")
        if not isinstance(enabled, bool):
            raise ApiError(422, "enabled must be true or false")
        result = await _call(mod.set_enabled, svc, schedule_id, enabled, actor=actor_of(request))
    if changes:
        result = await _call(mod.update, svc, schedule_id, changes, actor=actor_of(request))
    if result is None or isinstance(result, bool):
        result = await _call(mod.get, svc, schedule_id)
    if result is None:
        raise not_found(f"schedule {schedule_id}")
    return _dict(mod, result)


@router.post("/schedules/{schedule_id}/run", status_code=202)
async def run_schedule(schedule_id: str, request: Request) -> JSONResponse:
    mod = _schedules()
    run_id = await _call(mod.trigger_manual, services_of(request), schedule_id)
    return JSONResponse({"run_id": run_id}, status_code=202)


@router.get("/schedules/{schedule_id}/runs")
async def schedule_runs(
    schedule_id: str, request: Request, limit: int = Query(20, ge=1, le=200)
) -> dict[str, Any]:
    mod = _schedules()
    runs = await _call(mod.list_runs, services_of(request), schedule_id, limit=limit)
    return {"items": [_dict(mod, r) for r in runs]}


@router.get("/chain-runs/{run_id}")
async def chain_run(run_id: str, request: Request) -> Any:
    mod = _schedules()
    run = await _call(mod.get_run, services_of(request), run_id)
    if run is None:
        raise not_found(f"chain run {run_id}")
    return _dict(mod, run)
