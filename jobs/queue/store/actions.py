"""Operator actions on a job: cancel, reopen (manual retry), delete."""

from __future__ import annotations

import time

from sqlalchemy import (
    delete,
    update,
)

from jobs.db import Sessions
from jobs.models import (
    CANCELLED,
    FINAL_STATUSES,
    QUEUED,
    RUNNING,
    SCHEDULED,
    Job,
)
from jobs.queue.store.tables import arq_id


async def cancel_queued(sm: Sessions, job_id: str) -> Job | None:
    """Cancel a job that has not started (queued, or scheduled for later). Returns it, or
    None if it is neither."""
    now = time.time()
    async with sm() as s:
        res = await s.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.in_((QUEUED, SCHEDULED)))
            .values(
                status=CANCELLED,
                cancel_requested=True,
                finished_at=now,
                lease_token=Job.lease_token + 1,
                error="cancelled before it started",
                updated_at=now,
            )
            .returning(Job)
        )
        job = res.scalar_one_or_none()
        await s.commit()
        return job


async def request_cancel(sm: Sessions, job_id: str) -> Job | None:
    """Flag a running job for cancellation (its worker stops it). None if not running."""
    async with sm() as s:
        res = await s.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == RUNNING)
            .values(cancel_requested=True, updated_at=time.time())
            .returning(Job)
        )
        job = res.scalar_one_or_none()
        await s.commit()
        return job


async def reopen(sm: Sessions, job_id: str) -> tuple[Job, int] | None:
    """Manual retry: a finished job goes back to the queue as a new attempt."""
    now = time.time()
    async with sm() as s:
        job = await s.get(Job, job_id)
        if job is None or job.status not in FINAL_STATUSES:
            return None
        new_token = job.lease_token + 1
        res = await s.execute(
            update(Job)
            .where(
                Job.id == job_id,
                Job.lease_token == job.lease_token,
                Job.status.in_(tuple(FINAL_STATUSES)),
            )
            .values(
                status=QUEUED,
                lease_token=new_token,
                cancel_requested=False,
                arq_job_id=arq_id(job_id, new_token),
                queued_at=now,
                finished_at=None,
                error=None,
                error_type=None,
                updated_at=now,
            )
            .returning(Job)
        )
        job = res.scalar_one_or_none()
        await s.commit()
        return (job, new_token) if job is not None else None


async def delete_finished(sm: Sessions, job_id: str) -> tuple[str, str] | None:
    """Delete a finished job (its attempts, artifacts and deliveries go with it): its
    ``(skill, status)``, or None when there is no such job or it has not finished."""
    async with sm() as s:
        row = (
            await s.execute(
                delete(Job)
                .where(Job.id == job_id, Job.status.in_(FINAL_STATUSES))
                .returning(Job.skill, Job.status)
            )
        ).first()
        await s.commit()
    return None if row is None else (str(row[0]), str(row[1]))
