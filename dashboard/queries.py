"""The dashboard's SQL. Every function takes a session; every query is shaped to use an
index on ``jobs`` so it stays fast on millions of rows:

* job lists: keyset paging on ``(created_at, id)`` newest first, one filter column per
  index (``status``/``skill``/``channel``/``role_id`` + ``created_at``; the filter itself
  is ``jobs.queue.filters``, shared with bulk actions);
* "recent" windows: ``finished_at`` (``ix_jobs_finished``) or ``status IN (…) AND
  created_at >= t`` so the ``(status, created_at)`` index serves the range;
* queue depth: ``status = 'queued' | 'running'`` only — never a count over all rows.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections import defaultdict
from collections.abc import Collection
from typing import Any

from sqlalchemy import Text, and_, case, cast, func, literal_column, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from jobs.models import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SCHEDULED,
    SUCCEEDED,
    TIMED_OUT,
    Artifact,
    ChainRun,
    ChainRunStatus,
    Delivery,
    DeliveryStatus,
    Job,
    JobAttempt,
    OpsAction,
    Worker,
)
from jobs.queue.filters import JobFilter
from jobs.queue.prune import pruned_totals

FAILURE_STATUSES = (FAILED, TIMED_OUT)
FINISHED = (SUCCEEDED, FAILED, TIMED_OUT, CANCELLED)
DELIVERY_STATUSES = tuple(DeliveryStatus)
CHAIN_RUN_STATUSES = tuple(ChainRunStatus)
WORKER_ALIVE_S = 30.0
MAX_PAGE = 200


class BadQuery(ValueError):
    """A filter or cursor the caller sent cannot be used (message says why)."""


def encode_cursor(created_at: float, job_id: str) -> str:
    raw = f"{created_at!r}|{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        ts, job_id = raw.split("|", 1)
        value = float(ts)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise BadQuery("cursor is not one this API returned; start again without it") from exc
    if not math.isfinite(value):
        raise BadQuery("cursor is not one this API returned; start again without it")
    return value, job_id


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


async def list_jobs(
    session: AsyncSession, flt: JobFilter, *, limit: int = 50, cursor: str | None = None
) -> tuple[list[Job], str | None]:
    """One page of jobs, newest first, and the cursor of the next page (or None). A
    free-text ``q`` that matches little is found through its own indexes (the skill names
    it matches, ``pg_trgm`` on error, the primary key, session and actor: the planner's
    bitmap), a common one by the newest-first walk, which meets its matches within a few
    rows."""
    limit = max(1, min(int(limit), MAX_PAGE))
    conds: list[Any] = await flt.conditions_in(session)
    if cursor:
        c_at, c_id = decode_cursor(cursor)
        # ``created_at <= c`` alone is an index range; the OR only breaks ties.
        conds.append(Job.created_at <= c_at)
        conds.append(or_(Job.created_at < c_at, Job.id < c_id))
    stmt = (
        select(Job)
        .where(and_(*conds) if conds else literal_column("1") == 1)
        .order_by(Job.created_at.desc(), Job.id.desc())
        .limit(limit + 1)
    )
    rows = list((await session.execute(stmt)).scalars())
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_cursor(rows[-1].created_at, rows[-1].id)
    return rows, next_cursor


async def job_children(
    session: AsyncSession, job_ids: list[str]
) -> tuple[dict[str, list[Artifact]], dict[str, list[Delivery]]]:
    """Artifacts and deliveries of several jobs (two indexed ``IN`` queries)."""
    arts: dict[str, list[Artifact]] = defaultdict(list)
    dels: dict[str, list[Delivery]] = defaultdict(list)
    if not job_ids:
        return arts, dels
    for a in (
        await session.execute(
            select(Artifact).where(Artifact.job_id.in_(job_ids)).order_by(Artifact.id)
        )
    ).scalars():
        arts[a.job_id].append(a)
    for d in (
        await session.execute(
            select(Delivery).where(Delivery.job_id.in_(job_ids)).order_by(Delivery.id)
        )
    ).scalars():
        dels[d.job_id or ""].append(d)
    return arts, dels


async def get_job(session: AsyncSession, job_id: str) -> Job | None:
    return await session.get(Job, job_id)


async def job_attempts(session: AsyncSession, job_id: str) -> list[JobAttempt]:
    stmt = select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number)
    return list((await session.execute(stmt)).scalars())


async def get_artifact(session: AsyncSession, job_id: str, artifact_id: int) -> Artifact | None:
    art = await session.get(Artifact, artifact_id)
    return art if art is not None and art.job_id == job_id else None


# --- queue overview -------------------------------------------------------------------


#: a delivery ``pending`` longer than this is reported by default (``Settings``
#: ``delivery_pending_stale_sec``)
PENDING_STALE_S = 300.0


async def queue_depth(
    session: AsyncSession, now: float, stale_after: float = PENDING_STALE_S
) -> dict[str, Any]:
    """Queued / running counts, the age of the oldest waiting job, and the deliveries
    ``pending`` longer than ``stale_after`` (a result that has not reached its chat)."""
    counts = dict(
        (
            await session.execute(
                select(Job.status, func.count())
                .where(Job.status.in_((QUEUED, RUNNING)))
                .group_by(Job.status)
            )
        ).all()
    )
    oldest = (
        await session.execute(select(func.min(Job.queued_at)).where(Job.status == QUEUED))
    ).scalar()
    stale, oldest_pending = (
        await session.execute(
            select(func.count(), func.min(Delivery.created_at)).where(
                Delivery.status == DeliveryStatus.PENDING,
                Delivery.created_at < now - stale_after,
            )
        )
    ).one()
    return {
        "queued": int(counts.get(QUEUED, 0)),
        "running": int(counts.get(RUNNING, 0)),
        "oldest_queued_age_s": round(max(0.0, now - oldest), 3) if oldest else 0.0,
        "deliveries_pending_stale": int(stale or 0),
        "oldest_pending_delivery_age_s": (
            round(max(0.0, now - oldest_pending), 3) if oldest_pending else 0.0
        ),
    }


WINDOWS = {"5m": 300.0, "1h": 3600.0, "24h": 86400.0}


async def window_counts(
    session: AsyncSession, now: float, windows: dict[str, float] = WINDOWS
) -> list[tuple[str, str, list[int]]]:
    """``(skill, status, [n per window])`` of jobs finished in each window (default 5m,
    1h, 24h): one range scan of ``ix_jobs_finished``."""
    cols = [
        func.sum(case((Job.finished_at >= now - secs, 1), else_=0)) for secs in windows.values()
    ]
    stmt = (
        select(Job.skill, Job.status, *cols)
        .where(Job.finished_at >= now - max(windows.values()))
        .group_by(Job.skill, Job.status)
    )
    return [
        (row[0], row[1], [int(n or 0) for n in row[2:]])
        for row in (await session.execute(stmt)).all()
    ]


def rates_of(
    counts: list[tuple[str, str, list[int]]], windows: dict[str, float] = WINDOWS
) -> dict[str, dict[str, Any]]:
    """Jobs finished per outcome in each window, with throughput and failure rate."""
    per: dict[str, dict[str, int]] = {w: dict.fromkeys(FINISHED, 0) for w in windows}
    for _skill, status, ns in counts:
        if status in FINISHED:
            for w, n in zip(windows, ns, strict=True):
                per[w][status] += n
    out: dict[str, dict[str, Any]] = {}
    for w, secs in windows.items():
        c = per[w]
        failed = c[FAILED] + c[TIMED_OUT]
        done = c[SUCCEEDED] + failed
        out[w] = {
            "succeeded": c[SUCCEEDED],
            "failed": failed,
            "timed_out": c[TIMED_OUT],
            "cancelled": c[CANCELLED],
            "per_min": round((done + c[CANCELLED]) / (secs / 60.0), 3),
            "failure_rate": round(failed / done, 4) if done else 0.0,
        }
    return out


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Linear interpolation, the same definition as PostgreSQL's ``percentile_cont``."""
    if not sorted_values:
        return None
    k = (len(sorted_values) - 1) * p
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


async def live_counts(session: AsyncSession) -> list[tuple[str, str, int]]:
    """``(skill, status, n)`` of queued and running jobs (the status index)."""
    stmt = (
        select(Job.skill, Job.status, func.count())
        .where(Job.status.in_((QUEUED, RUNNING)))
        .group_by(Job.skill, Job.status)
    )
    return [(a, b, int(n)) for a, b, n in (await session.execute(stmt)).all()]


async def duration_percentiles(
    session: AsyncSession, now: float, window: float = 86400.0
) -> dict[str, tuple[float | None, float | None]]:
    """p50 and p95 run time (ms) per skill over jobs finished in the last ``window``."""
    cond = and_(Job.finished_at >= now - window, Job.duration_ms.is_not(None))
    if _dialect(session) == "postgresql":
        stmt = (
            select(
                Job.skill,
                func.percentile_cont(0.5).within_group(Job.duration_ms),
                func.percentile_cont(0.95).within_group(Job.duration_ms),
            )
            .where(cond)
            .group_by(Job.skill)
        )
        return {skill: (p50, p95) for skill, p50, p95 in (await session.execute(stmt)).all()}
    values: dict[str, list[float]] = defaultdict(list)
    for skill, ms in (await session.execute(select(Job.skill, Job.duration_ms).where(cond))).all():
        values[skill].append(float(ms or 0.0))  # NULLs are filtered out above
    out = {}
    for skill, vals in values.items():
        vals.sort()
        out[skill] = (percentile(vals, 0.5), percentile(vals, 0.95))
    return out


async def finished_summary(
    session: AsyncSession, now: float
) -> tuple[list[tuple[str, str, list[int]]], dict[str, tuple[float | None, float | None]]]:
    """``window_counts`` and 24 h ``duration_percentiles`` together. On PostgreSQL it is
    one scan of the day's finished jobs (ordered-set aggregates skip NULL durations)."""
    if _dialect(session) != "postgresql":
        return await window_counts(session, now), await duration_percentiles(session, now)
    day = max(WINDOWS.values())
    cols = [
        func.sum(case((and_(Job.status == st, Job.finished_at >= now - secs), 1), else_=0))
        for st in FINISHED
        for secs in WINDOWS.values()
    ]
    stmt = (
        select(
            Job.skill,
            func.percentile_cont(0.5).within_group(Job.duration_ms),
            func.percentile_cont(0.95).within_group(Job.duration_ms),
            *cols,
        )
        .where(Job.finished_at >= now - day)
        .group_by(Job.skill)
    )
    counts: list[tuple[str, str, list[int]]] = []
    pct: dict[str, tuple[float | None, float | None]] = {}
    n = len(WINDOWS)
    for row in (await session.execute(stmt)).all():
        skill, p50, p95, *ns = row
        pct[skill] = (p50, p95)
        for i, st in enumerate(FINISHED):
            values = [int(x or 0) for x in ns[i * n : (i + 1) * n]]
            if values[-1]:
                counts.append((skill, st, values))
    return counts, pct


def skill_table(
    counts: list[tuple[str, str, list[int]]],
    live: list[tuple[str, str, int]],
    pct: dict[str, tuple[float | None, float | None]],
) -> list[dict[str, Any]]:
    """Per skill: waiting/running now, outcomes over 24 h, p50/p95 duration."""
    stats: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "queued": 0,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
            "p50_ms": None,
            "p95_ms": None,
        }
    )
    for skill, status, n in live:
        stats[skill][status] = n
    for skill, status, ns in counts:
        key = "failed" if status in FAILURE_STATUSES else status
        if key in ("succeeded", "failed", "cancelled"):
            stats[skill][key] += ns[-1]
    for skill, (p50, p95) in pct.items():
        stats[skill]["p50_ms"] = round(float(p50), 1) if p50 is not None else None
        stats[skill]["p95_ms"] = round(float(p95), 1) if p95 is not None else None
    return [{"skill": skill, **stats[skill]} for skill in sorted(stats)]


async def failing_deliveries(
    session: AsyncSession, now: float, window: float = 86400.0, limit: int = 20
) -> dict[str, Any]:
    """Failed deliveries of the last ``window`` seconds: per channel and the latest few."""
    cond = and_(Delivery.status == DeliveryStatus.FAILED, Delivery.created_at >= now - window)
    by_channel = {
        ch or "": int(n)
        for ch, n in (
            await session.execute(
                select(Delivery.channel, func.count()).where(cond).group_by(Delivery.channel)
            )
        ).all()
    }
    latest = (
        await session.execute(
            select(Delivery).where(cond).order_by(Delivery.created_at.desc()).limit(limit)
        )
    ).scalars()
    return {
        "total": sum(by_channel.values()),
        "by_channel": by_channel,
        "latest": [
            {
                "id": d.id,
                "job_id": d.job_id,
                "chain_run_id": d.chain_run_id,
                "recipient": d.recipient,
                "kind": d.kind,
                "error": d.error,
                "tries": d.tries,
                "created_at": d.created_at,
            }
            for d in latest
        ],
    }


async def list_workers(session: AsyncSession) -> list[Worker]:
    stmt = select(Worker).order_by(Worker.last_heartbeat.desc()).limit(500)
    return list((await session.execute(stmt)).scalars())


# --- metrics --------------------------------------------------------------------------

DURATION_BUCKETS_MS = (
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10000,
    30000,
    60000,
    120000,
    300000,
    600000,
    1800000,
)


async def metrics_live(
    session: AsyncSession, now: float, stale_after: float = PENDING_STALE_S
) -> dict[str, Any]:
    """What ``/metrics`` reads at every scrape (queued and running jobs, workers)."""
    snap: dict[str, Any] = {"depth": await queue_depth(session, now, stale_after)}
    # delayed jobs waiting for their time (the partial index of migration 0018)
    snap["depth"]["scheduled"] = int(
        await session.scalar(select(func.count()).where(Job.status == SCHEDULED)) or 0
    )
    snap["live"] = await live_counts(session)
    workers = (
        await session.execute(
            select(Worker.id, Worker.last_heartbeat, Worker.stalls, Worker.longest_stall_s).where(
                Worker.stopped_at.is_(None)
            )
        )
    ).all()
    snap["workers"] = [(wid, now - hb <= WORKER_ALIVE_S, now - hb) for wid, hb, _, _ in workers]
    snap["stalls"] = [(wid, int(n or 0), float(s or 0.0)) for wid, _, n, s in workers]
    return snap


async def metrics_window(session: AsyncSession, now: float, window: float) -> dict[str, Any]:
    """``/metrics``' figures over the last ``window`` seconds, read with indexed queries
    only (jobs finished: ``ix_jobs_finished``; deliveries: ``ix_deliveries_status_created``;
    runs: ``ix_chain_runs_status``), and the retention passes' totals."""
    since = now - window
    snap: dict[str, Any] = {"window": window}
    bucket_cols = [func.sum(case((Job.duration_ms <= b, 1), else_=0)) for b in DURATION_BUCKETS_MS]
    stmt = (
        select(
            Job.skill,
            Job.status,
            func.count(),
            func.count(Job.duration_ms),
            func.coalesce(func.sum(Job.duration_ms), 0.0),
            *bucket_cols,
        )
        .where(Job.finished_at >= since)
        .group_by(Job.skill, Job.status)
    )
    snap["finished"] = [tuple(r) for r in (await session.execute(stmt)).all()]
    snap["deliveries"] = [
        tuple(r)
        for r in (
            await session.execute(
                select(Delivery.channel, Delivery.status, func.count())
                .where(Delivery.status.in_(DELIVERY_STATUSES), Delivery.created_at >= since)
                .group_by(Delivery.channel, Delivery.status)
            )
        ).all()
    ]
    snap["chain_runs"] = [
        tuple(r)
        for r in (
            await session.execute(
                select(ChainRun.status, func.count())
                .where(ChainRun.status.in_(CHAIN_RUN_STATUSES), ChainRun.created_at >= since)
                .group_by(ChainRun.status)
            )
        ).all()
    ]
    passes = await session.scalars(
        select(OpsAction.details)
        .where(OpsAction.action == "prune")
        .order_by(OpsAction.id.desc())
        .limit(10_000)
    )
    snap["pruned"] = pruned_totals([d for d in passes if isinstance(d, dict)])
    return snap


async def list_deliveries(
    session: AsyncSession,
    *,
    statuses: tuple[str, ...],
    since: float,
    channel: str | None = None,
    job_id: str | None = None,
    limit: int = 50,
    pending_before: float | None = None,
) -> list[Delivery]:
    """Deliveries newest first: by job (``ix_deliveries_job_id``), else by status over a
    bounded time range (``ix_deliveries_status_created``); ``pending_before``: also the
    ones still ``pending`` that were created before then (stuck on their way)."""
    conds: list[Any] = []
    if job_id:
        conds.append(Delivery.job_id == job_id)
    else:
        wanted = and_(Delivery.status.in_(statuses), Delivery.created_at >= since)
        if pending_before is not None:
            stuck = and_(
                Delivery.status == DeliveryStatus.PENDING, Delivery.created_at < pending_before
            )
            wanted = or_(wanted, stuck)
        conds.append(wanted)
    if job_id and statuses:
        conds.append(Delivery.status.in_(statuses))
    if channel:
        conds.append(Delivery.channel == channel)
    stmt = (
        select(Delivery)
        .where(*conds)
        .order_by(Delivery.created_at.desc(), Delivery.id.desc())
        .limit(max(1, min(int(limit), MAX_PAGE)))
    )
    return list((await session.execute(stmt)).scalars())


async def delivery_matches(
    session: AsyncSession,
    *,
    statuses: tuple[str, ...],
    since: float,
    channel: str | None = None,
    job_id: str | None = None,
    limit: int = 500,
    resendable_on: Collection[str] | None = None,
) -> tuple[int, list[int]]:
    """How many deliveries the list's filter matches, and the ids of the oldest ``limit``
    (what a bulk resend or dismiss takes). ``resendable_on``: only those a resend can
    send — with stored content, on one of these (configured) channels."""
    conds: list[Any] = [Delivery.status.in_(statuses)]
    if resendable_on is not None:
        conds += [
            Delivery.content.is_not(None),
            cast(Delivery.content, Text) != "null",
            Delivery.channel.in_(list(resendable_on)),
        ]
    if job_id:
        conds.append(Delivery.job_id == job_id)
    else:
        conds.append(Delivery.created_at >= since)
    if channel:
        conds.append(Delivery.channel == channel)
    total = int((await session.execute(select(func.count()).where(*conds))).scalar() or 0)
    if not total:
        return 0, []
    stmt = select(Delivery.id).where(*conds).order_by(Delivery.created_at, Delivery.id)
    return total, list((await session.execute(stmt.limit(max(1, limit)))).scalars())


async def list_audit(
    session: AsyncSession,
    *,
    actor: str | None = None,
    action: str | None = None,
    target: str | None = None,
    before: int | None = None,
    limit: int = 50,
) -> list[OpsAction]:
    """The operations log newest first (primary-key order), paged by ``before`` id."""
    conds: list[Any] = []
    for column, value in (
        (OpsAction.actor, actor),
        (OpsAction.action, action),
        (OpsAction.target, target),
    ):
        if value:
            conds.append(column == value)
    if before is not None:
        conds.append(OpsAction.id < before)
    stmt = (
        select(OpsAction)
        .where(*conds)
        .order_by(OpsAction.id.desc())
        .limit(max(1, min(int(limit), MAX_PAGE)))
    )
    return list((await session.execute(stmt)).scalars())
