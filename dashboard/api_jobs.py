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
from dashboard.sync_pool import SyncPool
from delivery import notices
from jobs import telemetry
from jobs.context import scrub, secret_values
from jobs.crypto import ENC_TAG, REDACTED, SecretBox, redact
from jobs.envelope import is_partial
from jobs.links import file_link, file_link_key
from jobs.models import Artifact, Delivery, Job, JobAttempt
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


# --- shapes (SPEC §10) ---------------------------------------------------------------


def safe(obj: object, *, by_name: bool = True) -> Any:
    """Secret-named values masked (configuration-shaped data only: results are data and
    were scrubbed of the job's secret values when they ran, C12), and any sealed value
    masked wherever it sits."""

    def strip(v: object) -> Any:
        if isinstance(v, dict):
            if ENC_TAG in v and len(v) == 1:
                return REDACTED
            return {k: strip(x) for k, x in v.items()}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(redact(obj) if by_name else obj)


def job_secrets(job: Job, box: SecretBox | None) -> list[str]:
    """The job's secret values (from its sealed context): what is scrubbed from its result
    wherever it is shown (C12: by value, never by the result's field names)."""
    if box is None or not isinstance(job.context, dict):
        return []
    try:
        return secret_values(box.unseal(job.context), job.skill)
    except ValueError:  # written with another key: the sealed values stay masked anyway
        return []


def artifact_dict(a: Artifact) -> dict[str, Any]:
    return {
        "id": a.id,
        "filename": a.filename,
        "local_path": a.local_path,
        "media": a.media,
        "mime": a.mime,
        "size": a.size,
        "sha256": a.sha256,
        "source_url": a.source_url,
        "download_url": f"/api/v1/jobs/{a.job_id}/artifacts/{a.id}",
    }


def delivery_dict(d: Delivery) -> dict[str, Any]:
    return {
        "id": d.id,
        "recipient": d.recipient,
        "channel": d.channel,
        "kind": d.kind,
        "status": d.status,
        "error": d.error,
        "tries": d.tries,
        "created_at": d.created_at,
        "sent_at": d.sent_at,
    }


def attempt_dict(a: JobAttempt, secrets: list[str] | None = None) -> dict[str, Any]:
    """One run of the job, with the tails of what it printed (capped when recorded,
    scrubbed of the job's secret values then and again here)."""
    return {
        "number": a.number,
        "worker_id": a.worker_id,
        "started_at": a.started_at,
        "finished_at": a.finished_at,
        "outcome": a.outcome,
        "error": a.error,
        "error_type": a.error_type,
        "duration_ms": a.duration_ms,
        "stdout_tail": scrub(a.stdout_tail, secrets or []),
        "stderr_tail": scrub(a.stderr_tail, secrets or []),
    }


def job_dict(
    job: Job,
    artifacts: list[Artifact],
    deliveries: list[Delivery],
    attempts: list[JobAttempt] | None = None,
    box: SecretBox | None = None,
) -> dict[str, Any]:
    ctx = job.context if isinstance(job.context, dict) else {}
    out: dict[str, Any] = {
        "id": job.id,
        "skill": job.skill,
        "status": job.status,
        # what a running job does before its skill runs ("preparing environment"), or None
        "phase": (phase := job.current_phase()) and phase["name"],
        "phase_detail": phase and phase["detail"],
        "phase_since": phase and phase["since"],
        "attempts": job.attempts,
        "created_at": job.created_at,
        "run_at": job.run_at,  # a delayed job's time (``scheduled`` until then)
        "queued_at": job.queued_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "duration_ms": job.duration_ms,
        "result": safe(scrub(job.result, job_secrets(job, box)), by_name=False),
        "partial": is_partial(job.result),
        "error": job.error,
        "error_type": job.error_type,
        "cancel_requested": job.cancel_requested,
        "chain_run_id": job.chain_run_id,
        "priority": job.priority,
        "origin": {
            "channel": job.channel,
            "session_id": job.session_id,
            "external_id": job.external_id,
            "actor_key": job.actor_key,
            "role_id": job.role_id,
            "org_id": job.org_id,
            # the conversation and message the request came from, when the context named them
            **{k: str(ctx[k]) for k in ("conversation_id", "message_id") if ctx.get(k)},
        },
        "artifacts": [artifact_dict(a) for a in artifacts],
        "deliveries": [delivery_dict(d) for d in deliveries],
    }
    if attempts is not None:
        out["input"] = safe(job.input)
        out["context"] = safe(job.context)
        out["fetches"] = safe(job.fetches or [])
        out["wall_sec"] = job.wall_sec
        out["trace_id"] = telemetry.trace_id(job)  # its spans' trace, when tracing is on
        secrets = job_secrets(job, box)
        out["attempt_log"] = [attempt_dict(a, secrets) for a in attempts]
    return out


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
