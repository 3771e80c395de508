"""Schedules API: a thin HTTP layer over ``chains.schedules`` (which records every change
in the audit trail, with the acting operator)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse

from chains import schedules
from chains.rerun import rerun_from
from dashboard.api_jobs import actor_of, services_of
from dashboard.errors import ApiError, not_found
from dashboard.shapes import safe
from delivery.custody import list_deliveries
from jobs.models import ChainRun

router = APIRouter(prefix="/api/v1")


async def _call(fn: Any, *args: Any, **kw: Any) -> Any:
    """Call a schedules function; its refusals become 4xx envelopes."""
    try:
        return await fn(*args, **kw)
    except LookupError as exc:
        raise ApiError(404, str(exc).strip("'\"")) from exc
    except ValueError as exc:
        problems = getattr(exc, "problems", None)
        extra = {"problems": problems} if problems else {}
        raise ApiError(422, str(exc), **extra) from exc


def _last_run(run: ChainRun | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {
        "id": run.id,
        "status": run.status,
        "trigger": run.trigger,
        "fire_at": run.fire_at,
        "finished_at": run.finished_at,
        "error": run.error,
    }


NEXT_Q = Query(
    schedules.NEXT_FIRES,
    ge=1,
    le=schedules.MAX_NEXT_FIRES,
    alias="next",
    description="how many upcoming fire times next_fires lists",
)


@router.get("/schedules")
async def list_schedules(request: Request, upcoming: int = NEXT_Q) -> dict[str, Any]:
    sm = services_of(request).sessionmaker
    rows = await _call(schedules.list_schedules, sm)
    last = await _call(schedules.last_runs, sm)
    items = []
    for row in rows:
        item = safe(schedules.to_dict(row, fires=upcoming))
        item["last_run"] = _last_run(last.get(row.id))
        items.append(item)
    return {"items": items}


@router.post("/schedules", status_code=201)
async def create_schedule(request: Request, body: Any = Body(...)) -> JSONResponse:
    """Takes the schedule file's shape (SPEC §10); 422 names every problem."""
    svc = services_of(request)
    try:
        spec = schedules.validate(body, svc.registry)
    except ValueError as exc:
        raise ApiError(422, str(exc), problems=getattr(exc, "problems", [str(exc)])) from exc
    row = await _call(schedules.create, svc.sessionmaker, spec, actor=actor_of(request))
    return JSONResponse(safe(schedules.to_dict(row)), status_code=201)


@router.get("/schedules/{schedule_id}")
async def get_schedule(schedule_id: str, request: Request, upcoming: int = NEXT_Q) -> Any:
    sm = services_of(request).sessionmaker
    row = await _call(schedules.get, sm, schedule_id)
    if row is None:
        raise not_found(f"schedule {schedule_id}")
    item = safe(schedules.to_dict(row, fires=upcoming))
    item["last_run"] = _last_run((await _call(schedules.last_runs, sm)).get(row.id))
    return item


@router.patch("/schedules/{schedule_id}")
async def patch_schedule(
    schedule_id: str, request: Request, body: dict[str, Any] = Body(...)
) -> Any:
    """``{"enabled": bool}`` toggles; other schedule-file fields update (re-validated)."""
    svc = services_of(request)
    changes = dict(body)
    actor = actor_of(request)
    row = None
    if set(changes) == {"enabled"}:
        if not isinstance(changes["enabled"], bool):
            raise ApiError(422, "enabled must be true or false")
        row = await _call(
            schedules.set_enabled, svc.sessionmaker, schedule_id, changes["enabled"], actor=actor
        )
    elif changes:
        row = await _call(
            schedules.update, svc.sessionmaker, schedule_id, changes, svc.registry, actor=actor
        )
    else:
        raise ApiError(422, 'nothing to change: send the fields to update, e.g. {"enabled": false}')
    return safe(schedules.to_dict(row))


@router.delete("/schedules/{schedule_id}")
async def delete_schedule(schedule_id: str, request: Request) -> dict[str, Any]:
    """Delete a schedule (by id or name) and its run history: ``{"deleted": id, "name"}``."""
    svc = services_of(request)
    row = await _call(schedules.delete, svc.sessionmaker, schedule_id, actor=actor_of(request))
    return {"deleted": row.id, "name": row.name}


@router.post("/schedules/{schedule_id}/run", status_code=202)
async def run_schedule(schedule_id: str, request: Request) -> JSONResponse:
    """Start an on-demand run now: 202 ``{"run_id"}``."""
    svc = services_of(request)
    run_id = await _call(schedules.trigger_manual, svc, schedule_id, actor=actor_of(request))
    return JSONResponse({"run_id": run_id}, status_code=202)


@router.get("/schedules/{schedule_id}/runs")
async def schedule_runs(
    schedule_id: str, request: Request, limit: int = Query(20, ge=1, le=200)
) -> dict[str, Any]:
    runs = await _call(
        schedules.list_runs, services_of(request).sessionmaker, schedule_id, limit=limit
    )
    return {"items": [safe(r) for r in runs]}


@router.get("/chain-runs/{run_id}")
async def chain_run(run_id: str, request: Request, items: bool = False) -> Any:
    """A chain run; ``?items=true`` also lists the item runs of its ``for_each`` steps."""

    sm = services_of(request).sessionmaker
    run = await _call(schedules.get_run, sm, run_id, items=items)
    if run is None:
        raise not_found(f"chain run {run_id}")
    # like a job's detail: the files its outcome carried and every delivery, with custody
    result = run.get("result") if isinstance(run.get("result"), dict) else {}
    run["artifacts"] = list(result.get("artifacts") or [])
    run["fetches"] = list(result.get("fetches") or [])
    run["deliveries"] = list(reversed(await list_deliveries(sm, job=run_id)))
    return safe(run)


@router.post("/chain-runs/{run_id}/rerun", status_code=202)
async def rerun_chain_run(
    run_id: str, request: Request, body: dict[str, Any] | None = Body(None)
) -> JSONResponse:
    """``{"from_step": index or step id}`` (default 0): a new run that reuses the recorded
    outputs of the earlier steps; 202 ``{"run_id", "rerun_of", "from_step"}``."""

    from_step = (body or {}).get("from_step", 0)
    if not isinstance(from_step, int | str) or isinstance(from_step, bool):
        raise ApiError(422, "from_step must be a step index or a step id")
    svc = services_of(request)
    new_id, index = await _call(rerun_from, svc, run_id, from_step, actor=actor_of(request))
    return JSONResponse({"run_id": new_id, "rerun_of": run_id, "from_step": index}, status_code=202)
