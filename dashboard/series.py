"""The overview charts' SQL: jobs finished, jobs waiting, deliveries per time bucket and
queue wait / run time percentiles per skill — each a range scan of one index
(``ix_jobs_finished``, ``ix_jobs_created``, ``ix_deliveries_status_created``), so the cost
grows with the window, not with the table."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, and_, case, cast, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from dashboard.queries import DELIVERY_STATUSES, FAILURE_STATUSES, percentile
from jobs.models import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Delivery, Job


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


SERIES_WINDOWS = {"1h": 3600.0, "6h": 21600.0, "24h": 86400.0}
MAX_POINTS = 1440


@dataclass
class Buckets:
    """``n`` buckets of ``step`` seconds, aligned to the clock, the last one holding now."""

    start: float
    step: float
    n: int

    @classmethod
    def of(cls, now: float, window: float, step: float) -> Buckets:
        n = max(1, math.ceil(window / step))
        end = (math.floor(now / step) + 1) * step
        return cls(start=end - n * step, step=step, n=n)

    def times(self) -> list[float]:
        return [self.start + i * self.step for i in range(self.n)]


def _bucket_of(session: AsyncSession, column: Any, b: Buckets) -> Any:
    expr = (column - b.start) / b.step
    if _dialect(session) == "postgresql":
        return func.floor(expr)
    return cast(expr, Integer)  # values are >= 0 here, so truncation is floor


def _spread(rows: Any, b: Buckets, names: tuple[str, ...]) -> dict[str, list[int]]:
    out = {name: [0] * b.n for name in names}
    for bucket, name, n in rows:
        i = int(bucket)
        if name in out and 0 <= i < b.n:
            out[name][i] += int(n)
    return out


async def finished_series(session: AsyncSession, b: Buckets) -> dict[str, list[int]]:
    """Jobs finished per bucket: succeeded, failed (timed out included), cancelled
    (a range scan of ``ix_jobs_finished``)."""
    bucket = _bucket_of(session, Job.finished_at, b).label("b")
    outcome = case((Job.status.in_(FAILURE_STATUSES), FAILED), else_=Job.status).label("o")
    stmt = (
        select(bucket, outcome, func.count())
        .where(Job.finished_at >= b.start)
        .group_by(bucket, outcome)
    )
    return _spread((await session.execute(stmt)).all(), b, (SUCCEEDED, FAILED, CANCELLED))


async def waiting_series(session: AsyncSession, b: Buckets) -> list[int]:
    """Jobs waiting at the end of each bucket, worked back from the depth now: a job
    created after ``t`` was not waiting at ``t``; one that left the queue (started, or
    cancelled before it started) after ``t`` was. Reads the created range
    (``ix_jobs_created``), the finished range (``ix_jobs_finished``) and running jobs
    (``ix_jobs_status_created``); a job re-queued by a retry counts from its creation."""
    depth = int(
        (await session.execute(select(func.count()).where(Job.status == QUEUED))).scalar() or 0
    )
    arrived = [0] * b.n
    left = [0] * b.n
    created = _bucket_of(session, Job.created_at, b).label("b")
    for bucket, n in (
        await session.execute(
            select(created, func.count()).where(Job.created_at >= b.start).group_by(created)
        )
    ).all():
        if 0 <= int(bucket) < b.n:
            arrived[int(bucket)] += int(n)
    left_at = func.coalesce(Job.started_at, Job.finished_at)
    lb = _bucket_of(session, left_at, b).label("b")
    for cond in (
        and_(Job.finished_at >= b.start, left_at >= b.start),
        and_(Job.status == RUNNING, Job.started_at >= b.start),
    ):
        for bucket, n in (
            await session.execute(select(lb, func.count()).where(cond).group_by(lb))
        ).all():
            if 0 <= int(bucket) < b.n:
                left[int(bucket)] += int(n)
    out = [0] * b.n
    after_arrived = after_left = 0
    for i in range(b.n - 1, -1, -1):
        out[i] = max(0, depth - after_arrived + after_left)
        after_arrived += arrived[i]
        after_left += left[i]
    return out


async def latency_by_skill(session: AsyncSession, since: float) -> list[dict[str, Any]]:
    """Per skill, over jobs finished since ``since``: queue wait (queued → started) and
    run time, p50 and p95 in ms."""
    wait = (Job.started_at - Job.queued_at) * 1000.0
    cond = and_(Job.finished_at >= since, Job.started_at.is_not(None))
    rows: list[tuple[str, int, Any, Any, Any, Any]] = []
    if _dialect(session) == "postgresql":
        stmt = (
            select(
                Job.skill,
                func.count(),
                func.percentile_cont(0.5).within_group(wait),
                func.percentile_cont(0.95).within_group(wait),
                func.percentile_cont(0.5).within_group(Job.duration_ms),
                func.percentile_cont(0.95).within_group(Job.duration_ms),
            )
            .where(cond)
            .group_by(Job.skill)
        )
        rows = [tuple(r) for r in (await session.execute(stmt)).all()]
    else:
        waits: dict[str, list[float]] = defaultdict(list)
        runs: dict[str, list[float]] = defaultdict(list)
        stmt2 = select(Job.skill, wait, Job.duration_ms).where(cond)
        for skill, w, ms in (await session.execute(stmt2)).all():
            waits[skill].append(max(0.0, float(w or 0.0)))
            if ms is not None:
                runs[skill].append(float(ms))
        for skill, ws in waits.items():
            ws.sort()
            rs = sorted(runs.get(skill, []))
            rows.append(
                (
                    skill,
                    len(ws),
                    percentile(ws, 0.5),
                    percentile(ws, 0.95),
                    percentile(rs, 0.5),
                    percentile(rs, 0.95),
                )
            )

    def rounded(v: Any) -> float | None:
        return round(max(0.0, float(v)), 1) if v is not None else None

    return [
        {
            "skill": skill,
            "jobs": int(n),
            "wait_p50_ms": rounded(w50),
            "wait_p95_ms": rounded(w95),
            "run_p50_ms": rounded(r50),
            "run_p95_ms": rounded(r95),
        }
        for skill, n, w50, w95, r50, r95 in sorted(rows, key=lambda r: r[0])
    ]


async def delivery_series(
    session: AsyncSession, b: Buckets
) -> tuple[dict[str, list[int]], list[dict[str, Any]]]:
    """Deliveries created per bucket by their status now, and per channel over the
    window: total, failed (``failed`` + ``unknown``) and the failure rate."""
    cond = and_(Delivery.status.in_(DELIVERY_STATUSES), Delivery.created_at >= b.start)
    bucket = _bucket_of(session, Delivery.created_at, b).label("b")
    series = _spread(
        (
            await session.execute(
                select(bucket, Delivery.status, func.count())
                .where(cond)
                .group_by(bucket, Delivery.status)
            )
        ).all(),
        b,
        tuple(str(s) for s in DELIVERY_STATUSES),
    )
    per: dict[str, dict[str, int]] = defaultdict(lambda: {"total": 0, "failed": 0})
    for channel, status, n in (
        await session.execute(
            select(Delivery.channel, Delivery.status, func.count())
            .where(cond)
            .group_by(Delivery.channel, Delivery.status)
        )
    ).all():
        per[channel or ""]["total"] += int(n)
        if status in ("failed", "unknown"):
            per[channel or ""]["failed"] += int(n)
    channels = [
        {
            "channel": ch,
            **c,
            "failure_rate": round(c["failed"] / c["total"], 4) if c["total"] else 0.0,
        }
        for ch, c in sorted(per.items())
    ]
    return series, channels
