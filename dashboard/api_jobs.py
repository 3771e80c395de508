"""Jobs API: dispatch, list, detail, artifact download, retry / cancel / requeue-failed,
and bulk retry / cancel of every job a filter matches."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field
from starlette.datastructures import State

from dashboard import queries
from dashboard.auth import identity_of
from dashboard.errors import ApiError, not_found
from dashboard.shapes import job_dict, safe
from dashboard.sync_pool import SyncPool
from delivery import notices
from jobs import telemetry
from jobs.links import file_link, file_link_key
from jobs.queue import control, filters, pauses, rates
from jobs.queue.dispatcher import Dispatcher, runs_now
from jobs.services import Services
from jobs.settings import Settings

router = APIRouter(prefix="/api/v1")


def services_of(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def actor_of(request: Request) -> str:
    """Who is acting, for the audit trail: the identity of the caller's token (admin,
    read, session:<id>), never a header the caller chose."""
    return identity_of(request).actor


# --- dispatch ------------------------------------------------------------------------


class DispatchBody(BaseModel):
    skill: str = Field(min_length=1, max_length=128)
    input: dict[str, Any] = Field(default_factory=dict)
    context: dict[str, Any] = Field(default_factory=dict)
    external_id: str | None = None
    idempotency_key: str | None = Field(default=None, max_length=255)
    priority: int | None = Field(default=None, ge=0, le=9)  # 0 first, 9 last
    # later: ISO 8601 or epoch seconds / seconds from now (or "10m"); jobs.queue.delayed
    run_at: float | str | None = None
    delay_s: float | str | None = None


@router.post("/dispatch")
async def dispatch(body: DispatchBody, request: Request) -> JSONResponse:
    """Relay to the dispatcher: 202 receipt, 200 result envelope, or a 4xx refusal. (A
    valid body is answered by ``dashboard.dispatch_lane`` before the router; this route
    answers what the lane leaves to it.)"""
    status, answer = await dispatch_answer(body, request.app.state, request.headers)
    return JSONResponse(answer, status_code=status)


async def dispatch_answer(
    body: DispatchBody, state: State, headers: Mapping[str, str]
) -> tuple[int, dict[str, Any]]:
    """The status and JSON body answering ``body``. A ``traceparent`` header puts the
    dispatch (and the job) in the caller's trace."""
    with telemetry.incoming(headers.get("traceparent")):
        return await _dispatch(body, state, headers)


async def _dispatch(
    body: DispatchBody, state: State, headers: Mapping[str, str]
) -> tuple[int, dict[str, Any]]:
    key = body.idempotency_key or headers.get("idempotency-key") or None
    svc: Services = state.services
    pool: SyncPool | None = getattr(state, "sync_pool", None)
    later = body.run_at is not None or body.delay_s is not None
    if pool is not None and runs_now(
        svc.registry, body.skill, body.context, body.external_id, deferred=later
    ):
        # The sync line runs in an executor process: a CPU-bound skill cannot stall us.
        size = headers.get("content-length", "")
        running = pool.dispatch(
            size=int(size) if size.isdigit() else 1 << 30,
            skill=body.skill,
            input=body.input,
            context=body.context,
            external_id=body.external_id,
            idempotency_key=key,
            priority=body.priority,
        )
        attrs: dict[str, str | bool] = {
            "skilljobs.skill": body.skill,
            "skilljobs.background": False,
        }
        return await telemetry.traced("skilljobs.dispatch", running, attrs=attrs)
    answer = await Dispatcher(svc).dispatch(
        skill=body.skill,
        input=body.input,
        context=body.context,
        external_id=body.external_id,
        idempotency_key=key,
        priority=body.priority,
        run_at=body.run_at,
        delay_s=body.delay_s,
    )
    return answer.status_code, answer.body


# --- reading -------------------------------------------------------------------------


@router.get("/jobs")
async def list_jobs(
    request: Request,
    status: str | None = Query(None, description="one status or a comma list"),
    skill: str | None = None,
    channel: str | None = None,
    role: str | None = Query(None, description="role_id"),
    error_type: str | None = None,
    since: str | None = Query(None, description="created since: 2h, 30m, ISO time, epoch s"),
    until: str | None = Query(None, description="created before: 2h, ISO time, epoch s"),
    q: str | None = Query(None, max_length=filters.MAX_TEXT),
    limit: int = Query(50, ge=1, le=queries.MAX_PAGE),
    cursor: str | None = None,
) -> dict[str, Any]:
    """Newest first. The filter is the one bulk actions take (``jobs.queue.filters``)."""
    given = {"status": status, "skill": skill, "channel": channel, "role": role}
    given |= {"error_type": error_type, "since": since, "until": until, "q": q}
    try:
        flt = filters.JobFilter.parse(given)
    except filters.FilterError as exc:
        if exc.field in ("since", "until"):  # a value that is not a time, as for a number
            raise ApiError(422, str(exc)) from exc
        raise queries.BadQuery(str(exc)) from exc
    box = services_of(request).box
    async with services_of(request).read_sessionmaker() as session:
        rows, next_cursor = await queries.list_jobs(session, flt, limit=limit, cursor=cursor)
        arts, dels = await queries.job_children(session, [j.id for j in rows])
    return {
        "items": [job_dict(j, arts.get(j.id, []), dels.get(j.id, []), box=box) for j in rows],
        "next_cursor": next_cursor,
    }


@router.get("/jobs/{job_id}")
async def get_job(job_id: str, request: Request) -> dict[str, Any]:
    async with services_of(request).sessionmaker() as session:
        job = await queries.get_job(session, job_id)
        if job is None:
            raise not_found(f"job {job_id}")
        arts, dels = await queries.job_children(session, [job_id])
        attempts = await queries.job_attempts(session, job_id)
    box = services_of(request).box
    out = job_dict(job, arts.get(job_id, []), dels.get(job_id, []), attempts, box=box)
    settings = services_of(request).settings
    out["artifacts"] = await asyncio.to_thread(signed_links, settings, job_id, out["artifacts"])
    # e.g. "limit org:o1": a queued job over a concurrency limit waits for a slot
    # a full concurrency limit or an empty start-rate bucket (jobs.queue.rates)
    out["waiting_for"] = await rates.waiting_for(services_of(request), job)
    # its skill is paused by an operator: a queued job waits for the resume
    paused = await pauses.paused_skills(services_of(request), required=False)
    out["paused"] = job.skill in paused
    return out


ARTIFACT_LINK_TTL_S = 86400  # a link from the job detail, to paste into a ticket or chat


def signed_links(
    settings: Settings, job_id: str, artifacts: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each artifact with ``link``: a signed ``/files/<token>`` address valid for a day
    (no API token needed: the signature is the authorization), or None when its file is
    gone or outside the workspace root (file reads: run in a thread)."""
    key = file_link_key(settings)
    root = settings.resolved_workspace_root.resolve()
    out = []
    for art in artifacts:
        path, problem = _servable(art["local_path"], root)
        link = None if problem else file_link(key, job_id, str(path), ARTIFACT_LINK_TTL_S)
        out.append({**art, "link": link})
    return out


def _servable(local_path: str, root: Path) -> tuple[Path, str | None]:
    """The resolved file (symlinks followed) and why it cannot be served, if so."""
    path = Path(local_path).resolve()
    if not path.is_relative_to(root):
        return path, "outside"
    if not path.is_file():
        return path, "missing"
    return path, None


@router.get("/jobs/{job_id}/artifacts/{artifact_id}")
async def download_artifact(job_id: str, artifact_id: int, request: Request) -> FileResponse:
    svc = services_of(request)
    async with svc.sessionmaker() as session:
        art = await queries.get_artifact(session, job_id, artifact_id)
    if art is None:
        raise not_found(f"artifact {artifact_id} of job {job_id}")
    path, problem = await asyncio.to_thread(
        _servable, art.local_path, svc.settings.resolved_workspace_root
    )
    if problem == "outside":
        raise ApiError(403, "artifact lies outside the workspace root and is not served")
    if problem == "missing":
        raise ApiError(410, f"artifact file {art.filename!r} no longer exists")
    # Always a download, never rendered by the browser.
    return FileResponse(
        path,
        filename=art.filename or path.name,
        media_type="application/octet-stream",
        content_disposition_type="attachment",
    )


# --- actions -------------------------------------------------------------------------


def _relay(result: control.ActionResult) -> JSONResponse:
    return JSONResponse(safe(result.to_dict()), status_code=result.status_code)


async def _control(action: Awaitable[control.ActionResult]) -> JSONResponse:
    try:
        result = await action
    except LookupError as exc:
        raise ApiError(404, str(exc)) from exc
    except ValueError as exc:
        raise ApiError(409, str(exc)) from exc
    return _relay(result)


@router.post("/jobs/{job_id}/retry")
async def retry(job_id: str, request: Request) -> JSONResponse:
    return await _control(control.retry_job(services_of(request), job_id, actor=actor_of(request)))


@router.delete("/jobs/{job_id}")
async def delete_job(job_id: str, request: Request) -> JSONResponse:
    """Delete a finished job (its attempts, files' records and deliveries); audited."""
    svc = services_of(request)
    return await _control(control.delete_job(svc, job_id, actor=actor_of(request)))


@router.post("/jobs/{job_id}/cancel")
async def cancel(job_id: str, request: Request) -> JSONResponse:
    svc, actor = services_of(request), actor_of(request)
    return await _control(control.cancel_job(svc, job_id, notices=notices, actor=actor))


@router.post("/skills/{skill}/requeue-failed")
async def requeue_failed(skill: str, request: Request) -> JSONResponse:
    svc = services_of(request)
    return await _control(control.requeue_failed(svc, skill, actor=actor_of(request)))


@router.post("/jobs/bulk")
async def bulk(request: Request, body: dict[str, Any] = Body(...)) -> dict[str, Any]:
    """``{"action": "retry"|"cancel"|"delete", "ids": [job ids]}`` acts on the selected
    jobs at once. ``{"action": …, "filter": {…the job list's filter…, incident},
    "dry_run": true, "limit": n}`` → how many jobs match, which (the oldest ``limit``,
    at most ``control.BULK_CAP``) were taken, and how many the action changed.
    ``dry_run`` defaults to true: acting takes an explicit ``false``."""
    if "ids" in body:  # the rows an operator selected: no dry run, the ids are the count
        ids = body["ids"]
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ApiError(422, "ids must be a list of job ids")
        try:
            return await control.act_on_selection(
                services_of(request),
                str(body.get("action")),
                ids,
                notices=notices,
                actor=actor_of(request),
            )
        except ValueError as exc:
            raise ApiError(422, str(exc)) from exc
    raw_filter = body.get("filter") or {}
    dry_run = body.get("dry_run", True)
    limit = body.get("limit", control.BULK_CAP)
    if not isinstance(raw_filter, dict) or not isinstance(dry_run, bool):
        raise ApiError(422, "filter must be an object and dry_run true or false")
    try:
        flt = filters.JobFilter.parse(raw_filter)
        return await control.bulk_action(
            services_of(request),
            str(body.get("action")),
            flt,
            notices=notices,
            dry_run=dry_run,
            limit=limit,
            actor=actor_of(request),
        )
    except LookupError as exc:
        raise ApiError(404, str(exc.args[0] if exc.args else exc)) from exc
    except ValueError as exc:
        raise ApiError(422, str(exc)) from exc
