"""Reads of the job table, and the moves of the queue's bookkeeping: due scheduled jobs,
queued jobs whose enqueue went stale, the circuit breaker's recent failures."""

from __future__ import annotations

import time

from sqlalchemy import (
    func,
    select,
    update,
)

from jobs.db import Sessions, engine_of, is_sqlite, rowcount
from jobs.models import (
    CANCELLED,
    FAILED,
    QUEUED,
    SCHEDULED,
    SUCCEEDED,
    TIMED_OUT,
    AttemptOutcome,
    Job,
    JobAttempt,
)
from jobs.queue.store.tables import arq_id


async def promote_due(sm: Sessions, now: float, *, limit: int = 500) -> list[Job]:
    """Move the ``scheduled`` jobs whose ``run_at`` has come to ``queued`` (oldest time
    first) and return them, to be enqueued. The status is checked by the UPDATE itself, so
    of several workers promoting at once each job is moved by one; a job moved but not
    enqueued (the worker died in between, Redis away) is re-enqueued by the reconciler like
    any queued job whose entry is missing."""
    due = (
        select(Job.id)
        .where(Job.status == SCHEDULED, Job.run_at <= now)
        .order_by(Job.run_at)
        .limit(limit)
    )
    async with sm() as s:
        if not is_sqlite(engine_of(sm)):
            due = due.with_for_update(skip_locked=True)
        res = await s.execute(
            update(Job)
            .where(Job.id.in_(due.scalar_subquery()), Job.status == SCHEDULED)
            .values(status=QUEUED, queued_at=now, updated_at=now)
            .returning(Job)
            .execution_options(synchronize_session=False)
        )
        jobs = list(res.scalars())
        await s.commit()
    return jobs


async def next_run_at(sm: Sessions) -> float | None:
    """The earliest ``run_at`` of the jobs still scheduled (None: none)."""
    async with sm() as s:
        found = await s.scalar(select(func.min(Job.run_at)).where(Job.status == SCHEDULED))
    return None if found is None else float(found)


async def stale_queued(
    sm: Sessions, older_than: float, *, limit: int = 1000
) -> list[tuple[str, int, str | None]]:
    """Queued jobs whose enqueue is older than ``older_than`` seconds (id, token, arq id)."""
    cutoff = time.time() - older_than
    async with sm() as s:
        rows = (
            await s.execute(
                select(Job.id, Job.lease_token, Job.arq_job_id)
                .where(Job.status == QUEUED, Job.queued_at < cutoff)
                .order_by(Job.queued_at)
                .limit(limit)
            )
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


async def bump_queued(sm: Sessions, job_id: str, token: int) -> int | None:
    """Give a queued job a fresh enqueue token (before re-enqueueing it)."""
    new_token = token + 1
    now = time.time()
    async with sm() as s:
        res = await s.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == QUEUED, Job.lease_token == token)
            .values(
                lease_token=new_token,
                arq_job_id=arq_id(job_id, new_token),
                queued_at=now,
                updated_at=now,
            )
        )
        await s.commit()
        return new_token if rowcount(res) == 1 else None


async def recent_failures(
    sm: Sessions, skill: str, role_id: str, window_sec: float = 1800.0
) -> int:
    """How many of the last 2 finished runs of ``skill`` for ``role_id`` in the window failed
    (the circuit breaker of SPEC §7)."""
    since = time.time() - window_sec
    async with sm() as s:
        rows = (
            await s.execute(
                select(JobAttempt.outcome)
                .join(Job, Job.id == JobAttempt.job_id)
                .where(
                    Job.skill == skill,
                    Job.role_id == role_id,
                    JobAttempt.finished_at.is_not(None),
                    JobAttempt.finished_at >= since,
                    JobAttempt.outcome.not_in(
                        (AttemptOutcome.LOST, AttemptOutcome.REQUEUED, CANCELLED)
                    ),
                )
                .order_by(JobAttempt.finished_at.desc())
                .limit(2)
            )
        ).all()
    return sum(1 for (o,) in rows if o != SUCCEEDED)


async def get_job(sm: Sessions, job_id: str) -> Job | None:
    async with sm() as s:
        return await s.get(Job, job_id)


async def failed_job_ids(sm: Sessions, skill: str, limit: int = 10_000) -> list[str]:
    async with sm() as s:
        rows = await s.scalars(
            select(Job.id)
            .where(Job.skill == skill, Job.status.in_((FAILED, TIMED_OUT)))
            .order_by(Job.created_at)
            .limit(limit)
        )
        return list(rows)
