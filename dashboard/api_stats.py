"""Time series for the overview charts: one aggregated endpoint, indexed range scans only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession

from dashboard import latency, series, shared
from dashboard.api_jobs import services_of
from dashboard.errors import ApiError
from jobs.db import Sessions

router = APIRouter(prefix="/api/v1")

METRICS = ("jobs", "queue_depth", "latency", "deliveries")
DEFAULT_STEP = {"1h": 60.0, "6h": 300.0, "24h": 600.0}
# an answer is recomputed after this many seconds and never served older than 3 times it
REFRESH = {"1h": 5.0, "6h": 15.0, "24h": 30.0}


def _metrics_of(raw: str | None) -> list[str]:
    if not raw:
        return list(METRICS)
    wanted = [m.strip() for m in raw.split(",") if m.strip()]
    unknown = [m for m in wanted if m not in METRICS]
    if unknown:
        raise ApiError(422, f"metric must be among {', '.join(METRICS)} (not {unknown[0]!r})")
    return wanted


@router.get("/stats/timeseries")
async def timeseries(
    request: Request,
    metric: str | None = Query(None, max_length=100, description="comma list; all when unset"),
    window: str = Query("1h", pattern="^(1h|6h|24h)$"),
    step: float | None = Query(None, ge=10, le=86400, allow_inf_nan=False),
) -> dict[str, Any]:
    """``jobs``: finished per bucket (succeeded / failed / cancelled); ``queue_depth``:
    waiting jobs at the end of each bucket; ``latency``: queue wait and run time p50/p95
    per skill over the window; ``deliveries``: created per bucket by status, and per
    channel the failure rate, and ``ratelimit_waits``: per channel, the sends that waited
    for the outbound rate limiter and the seconds they waited (every worker's counts since
    they began). ``t`` holds each bucket's start (epoch seconds); ``now`` (= ``as_of``)
    is when it was computed: answers are shared by every viewer of this process,
    recomputed in the background after ``REFRESH`` seconds and never served older than
    ``max_age_s``."""
    wanted = _metrics_of(metric)
    span = series.SERIES_WINDOWS[window]
    step = step or DEFAULT_STEP[window]
    if span / step > series.MAX_POINTS:
        raise ApiError(422, f"step too small: at most {series.MAX_POINTS} points per window")
    out = await _cached(request, (",".join(wanted), window, step), span, step, wanted)
    if "deliveries" in wanted:
        svc = services_of(request)
        waits = await latency.ratelimit_waits(svc.redis, svc.settings.key)
        out = {
            **out,
            "ratelimit_waits": [
                {"channel": ch, "waits": n, "waited_s": round(secs, 3)} for ch, n, secs in waits
            ],
        }
    return out


async def _cached(
    request: Request, key: tuple[Any, ...], span: float, step: float, wanted: list[str]
) -> dict[str, Any]:
    async def compute() -> dict[str, Any]:
        out = await _compute(services_of(request).read_sessionmaker, span, step, wanted)
        out["window"] = key[1]
        return out

    answer = await shared.of(request.app.state).get(
        ("timeseries", *key), REFRESH.get(key[1], 5.0), compute
    )
    return {**answer.value, **answer.freshness()}


async def _compute(sm: Sessions, span: float, step: float, wanted: list[str]) -> dict[str, Any]:
    """Each metric on its own connection, concurrently (each is one or a few range scans)."""
    now = time.time()
    b = series.Buckets.of(now, span, step)

    async def one(fn: Callable[[AsyncSession], Awaitable[Any]]) -> Any:
        async with sm() as session:
            return await fn(session)

    calls: dict[str, Callable[[AsyncSession], Awaitable[Any]]] = {
        "jobs": lambda s: series.finished_series(s, b),
        "queue_depth": lambda s: series.waiting_series(s, b),
        "latency": lambda s: series.latency_by_skill(s, now - span),
        "deliveries": lambda s: series.delivery_series(s, b),
    }
    names = [m for m in METRICS if m in wanted]
    results = dict(zip(names, await asyncio.gather(*(one(calls[m]) for m in names)), strict=True))
    out: dict[str, Any] = {"step": step, "start": b.start, "now": now, "t": b.times(), "series": {}}
    if "jobs" in results:
        out["series"]["jobs"] = results["jobs"]
    if "queue_depth" in results:
        out["series"]["queue_depth"] = {"queued": results["queue_depth"]}
    if "latency" in results:
        out["latency"] = results["latency"]
    if "deliveries" in results:
        out["series"]["deliveries"], out["delivery_channels"] = results["deliveries"]
    return out
