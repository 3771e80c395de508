"""Queue overview, workers, per-role skill configuration, chat sessions, live event
streams and health checks."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import text

from dashboard import queries, shared
from dashboard.api_jobs import actor_of, services_of
from dashboard.auth import require_token_or_query
from dashboard.errors import ApiError
from dashboard.shapes import safe
from delivery.channels import web
from jobs import audit
from jobs.catalog.configs import ConfigStore
from jobs.constants import JOB_EVENTS
from jobs.migrate import is_current
from jobs.models import Worker
from jobs.queue import broker, worker_control
from jobs.queue.store import get_job
from jobs.services import Services

T = TypeVar("T")
log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1")
stream_router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_token_or_query)])
open_router = APIRouter()

SSE_PING_S = 15.0
QUEUE_REFRESH_S = 5.0  # the overview's day summary is shared this long (dashboard.shared)
SSE_HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}


# --- health --------------------------------------------------------------------------


@open_router.get("/healthz")
async def healthz() -> dict[str, Any]:
    """The process answers (no dependency is checked)."""
    return {"ok": True}


@open_router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Redis answers, the database answers, and its schema is at the current revision."""

    svc: Services = request.app.state.services
    checks: dict[str, str] = {}
    try:
        if svc.redis is None:
            checks["redis"] = "no connection"
        else:
            async with asyncio.timeout(3.0):
                await svc.redis.ping()
            checks["redis"] = "ok"
    except Exception as exc:
        # Say what is down, not why: exception text can carry hosts, users and paths.
        log.warning("readyz: redis: %s: %s", type(exc).__name__, exc)
        checks["redis"] = "unreachable"
    try:
        async with svc.engine.connect() as conn:
            async with asyncio.timeout(3.0):
                await conn.execute(text("SELECT 1"))
        checks["database"] = "ok"
        current = await is_current(svc.engine)
        checks["schema"] = (
            "ok" if current else "not at the latest revision: run `skilljobs db upgrade`"
        )
    except Exception as exc:
        log.warning("readyz: database: %s: %s", type(exc).__name__, exc)
        checks.setdefault("database", "unreachable")
        checks.setdefault("schema", "unknown")
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"ok": ok, "checks": checks}, status_code=200 if ok else 503)


# --- queue and workers ---------------------------------------------------------------


def worker_dict(w: Worker, now: float) -> dict[str, Any]:
    return {
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "started_at": w.started_at,
        "last_heartbeat": w.last_heartbeat,
        "heartbeat_age_s": round(now - w.last_heartbeat, 3),
        "alive": w.stopped_at is None and now - w.last_heartbeat <= queries.WORKER_ALIVE_S,
        "stopped_at": w.stopped_at,
        "running": list(w.running or []),
    }


@router.get("/queue")
async def queue(
    request: Request,
    brief: bool = Query(False, description="only the SPEC keys (cheapest, for monitors)"),
) -> dict[str, Any]:
    """SPEC §11 keys, plus 5m/1h/24h rates, per-skill stats and failing deliveries. Queue
    depth, running jobs, workers and the 5-minute counts are read now; the 1 h / 24 h
    rates, the skills' 24 h outcomes and run times and the failing deliveries come from a
    summary shared for a few seconds (``summary``: ``as_of`` and ``max_age_s``)."""
    now = time.time()
    sm = services_of(request).read_sessionmaker
    stale_after = float(services_of(request).settings.delivery_pending_stale_sec)

    async def run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        async with sm() as session:
            return await fn(session, *args)

    five = {"5m": queries.WINDOWS["5m"]}
    if brief:
        depth, counts, rows = await asyncio.gather(
            run(queries.queue_depth, now, stale_after),
            run(queries.window_counts, now, five),
            run(queries.list_workers),
        )
        rates = queries.rates_of(counts, five)
        return {
            **{k: depth[k] for k in ("queued", "running", "oldest_queued_age_s")},
            "succeeded_5m": rates["5m"]["succeeded"],
            "failed_5m": rates["5m"]["failed"],
            "workers": sum(1 for w in rows if worker_dict(w, now)["alive"]),
        }

    async def summary() -> Any:
        at = time.time()
        (counts, pct), failing = await asyncio.gather(
            run(queries.finished_summary, at), run(queries.failing_deliveries, at)
        )
        return counts, pct, failing

    # Independent reads: one connection each, side by side; the day's summary is shared.
    depth, live, rows, recent, shared_summary = await asyncio.gather(
        run(queries.queue_depth, now, stale_after),
        run(queries.live_counts),
        run(queries.list_workers),
        run(queries.window_counts, now, five),
        shared.of(request.app.state).get(("queue",), QUEUE_REFRESH_S, summary),
    )
    counts, pct, failing = shared_summary.value
    rates = {**queries.rates_of(counts), **queries.rates_of(recent, five)}
    skills = queries.skill_table(counts, live, pct)
    workers = [worker_dict(w, now) for w in rows]
    return {
        **depth,
        "succeeded_5m": rates["5m"]["succeeded"],
        "failed_5m": rates["5m"]["failed"],
        "workers": sum(1 for w in workers if w["alive"]),
        "workers_total": len(workers),
        "rates": rates,
        "skills": skills,
        "deliveries_failing": failing,
        "now": now,
        # the 1h/24h rates, the skills' outcomes and p50/p95, failing deliveries: computed
        # at as_of (shared by every viewer, never older than max_age_s); the rest is read now
        "summary": shared_summary.freshness(),
    }


@router.get("/workers")
async def workers(request: Request) -> dict[str, Any]:
    """Workers, latest heartbeat first; a live one with its concurrency, processed and
    failed counts, resident memory and version (from its heartbeat)."""
    now = time.time()
    svc = services_of(request)
    async with svc.sessionmaker() as session:
        rows = await queries.list_workers(session)
    try:
        beats = await broker.heartbeats(svc, [w.id for w in rows])
    except Exception:  # Redis down: the rows alone
        beats = [{} for _ in rows]
    return {
        "items": [
            {**worker_dict(w, now), **worker_control.vitals(b)}
            for w, b in zip(rows, beats, strict=True)
        ]
    }


# --- per-role skill configuration -----------------------------------------------------


def _config_store(request: Request) -> Any:
    svc = services_of(request)
    return ConfigStore(svc.sessionmaker, svc.box)


@router.get("/roles/{role_id}/skills/{skill}/config")
async def get_config(role_id: str, skill: str, request: Request) -> dict[str, Any]:
    """The role's keys for the skill, secrets masked."""
    values = await _config_store(request).masked(role_id, skill)
    masked: dict[str, Any] = safe(values.get(skill, {}))
    return masked


@router.put("/roles/{role_id}/skills/{skill}/config")
async def put_config(
    role_id: str, skill: str, request: Request, body: dict[str, Any] = Body(...)
) -> dict[str, Any]:
    """Make ``body`` the role's whole configuration of the skill (a secret sent back
    masked keeps its stored value); answers the stored keys, secrets masked."""
    store = _config_store(request)
    try:
        await store.replace(role_id, skill, body)
    except ValueError as exc:
        raise ApiError(422, str(exc)) from exc
    svc = services_of(request)
    async with svc.sessionmaker() as s:
        audit.record(
            s,
            action="config_replace",
            target=f"{role_id}/{skill}",
            actor=actor_of(request),
            details={"keys": sorted(str(k) for k in body)},
        )
        await s.commit()
    values = await store.masked(role_id, skill)
    masked: dict[str, Any] = safe(values.get(skill, {}))
    return masked


# --- chat sessions -------------------------------------------------------------------


@router.get("/sessions/{session_id}/messages")
async def session_messages(
    session_id: str,
    request: Request,
    limit: int = Query(100, ge=1, le=1000),
    after_id: int | None = None,
) -> dict[str, Any]:
    """The session's stored messages, oldest first."""
    items = await web.list_messages(
        services_of(request).sessionmaker, session_id, limit=limit, after_id=after_id
    )
    return {"items": items}


def _sse(event: str, data: object) -> str:
    # json.dumps never emits a raw newline, so one data line always holds the event.
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _with_pings(source: AsyncIterator[str]) -> AsyncIterator[str]:
    """``source``'s chunks, plus a comment line whenever it is quiet for a while (keeps
    proxies from closing an idle stream). The source runs in its own task so a quiet
    period never cancels it midway."""
    queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=100)

    async def pump() -> None:
        try:
            async for chunk in source:
                await queue.put(chunk)
        except Exception as exc:
            log.warning("event stream ended: %s: %s", type(exc).__name__, exc)
        finally:
            await queue.put(None)

    task = asyncio.create_task(pump())
    try:
        yield "retry: 3000\n\n"
        while True:
            try:  # asyncio.timeout: wait_for (3.11) can swallow a concurrent cancellation
                async with asyncio.timeout(SSE_PING_S):
                    chunk = await queue.get()
            except TimeoutError:
                yield ": ping\n\n"
                continue
            if chunk is None:
                return
            yield chunk
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _stream(source: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        _with_pings(source), media_type="text/event-stream", headers=SSE_HEADERS
    )


@stream_router.get("/sessions/{session_id}/events")
async def session_events(session_id: str, request: Request) -> StreamingResponse:
    """Live pushes of a chat session: ``event: message`` with the stored message JSON."""
    svc = services_of(request)
    if svc.redis is None:
        raise ApiError(503, "no Redis connection: live events are unavailable", "transient")

    async def source() -> AsyncIterator[str]:
        live = web.listen(svc.redis, svc.settings, session_id, sessionmaker=svc.sessionmaker)
        async for message in live:
            yield _sse("message", message)

    return _stream(source())


def _job_event(raw: str | bytes) -> dict[str, Any] | None:
    """Only the fields the page needs, whatever else was published."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        return None
    return {k: data.get(k) for k in ("id", "status", "skill") if isinstance(data.get(k), str)}


async def _stored_job_event(svc: Services, raw: str | bytes) -> dict[str, Any] | None:
    """A published job event is only a hint (any Redis writer can publish one): the job is
    loaded by id and its stored status and skill are what the page gets."""
    event = _job_event(raw)
    if event is None or len(event["id"]) > 64:
        return None
    job = await get_job(svc.sessionmaker, event["id"])
    if job is None:
        return None
    out = {"id": job.id, "status": job.status, "skill": job.skill}
    if (phase := job.current_phase()) is not None:
        out["phase"] = phase["name"]  # preparing environment
    return out


@stream_router.get("/events")
async def job_events(request: Request) -> StreamingResponse:
    """Job status changes as ``event: job`` with ``{"id", "status", "skill"}`` (and
    ``"phase"`` while a running job prepares its environment)."""
    svc = services_of(request)
    if svc.redis is None:
        raise ApiError(503, "no Redis connection: live events are unavailable", "transient")
    pubsub = svc.redis.pubsub()
    await pubsub.subscribe(svc.settings.key(JOB_EVENTS))

    async def source() -> AsyncIterator[str]:
        try:
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                if msg is None or msg.get("type") != "message":
                    continue
                event = await _stored_job_event(svc, msg.get("data"))
                if event is not None:
                    yield _sse("job", event)
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]

    return _stream(source())
