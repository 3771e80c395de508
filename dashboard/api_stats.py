"""Time series for the overview charts: one aggregated endpoint, indexed range scans only."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query, Request

from dashboard import queries
from dashboard.api_jobs import services_of
from dashboard.errors import ApiError

router = APIRouter(prefix="/api/v1")

METRICS = ("jobs", "queue_depth", "latency", "deliveries")
DEFAULT_STEP = {"1h": 60.0, "6h": 300.0, "24h": 600.0}


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
    channel the failure rate. ``t`` holds each bucket's start (epoch seconds)."""
    wanted = _metrics_of(metric)
    span = queries.SERIES_WINDOWS[window]
    step = step or DEFAULT_STEP[window]
    if span / step > queries.MAX_POINTS:
        raise ApiError(422, f"step too small: at most {queries.MAX_POINTS} points per window")
    now = time.time()
    b = queries.Buckets.of(now, span, step)
    out: dict[str, Any] = {
        "window": window,
        "step": step,
        "start": b.start,
        "now": now,
        "t": b.times(),
        "series": {},
    }
    async with services_of(request).sessionmaker() as session:
        if "jobs" in wanted:
            out["series"]["jobs"] = await queries.finished_series(session, b)
        if "queue_depth" in wanted:
            out["series"]["queue_depth"] = {"queued": await queries.waiting_series(session, b)}
        if "latency" in wanted:
            out["latency"] = await queries.latency_by_skill(session, now - span)
        if "deliveries" in wanted:
            series, channels = await queries.delivery_series(session, b)
            out["series"]["deliveries"] = series
            out["delivery_channels"] = channels
    return out
