"""Dispatching background jobs in tests, draining them with a real arq worker, waiting."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import select

from jobs.models import Job, JobAttempt
from jobs.queue import store
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.worker import build_worker

TG = {
    "channel": "telegram",
    "actor_key": "tg-1",
    "role_id": "r1",
    "org_id": "o1",
    "session_id": "s-tg",
}


async def dispatch(services, skill: str, inp: dict | None = None, ctx: dict | None = None) -> str:
    res = await Dispatcher(services).dispatch(skill, inp or {}, ctx or TG)
    assert res.status_code == 202, res.body
    return res.body["job_id"]


async def drain(services) -> None:
    w = build_worker(services, burst=True, handle_signals=False, scheduler=False)
    try:
        await asyncio.wait_for(w.async_run(), 60)
    finally:
        await w.close()


async def job_and_attempts(services, job_id: str) -> tuple[Job, list[JobAttempt]]:
    async with services.sessionmaker() as s:
        job = await s.get(Job, job_id)
        attempts = (
            await s.scalars(
                select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number)
            )
        ).all()
    return job, list(attempts)


async def wait_status(services, job_id: str, statuses: set[str], limit: float = 30.0) -> Job:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        job = await store.get_job(services.sessionmaker, job_id)
        if job.status in statuses:
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} stuck in {job.status}, wanted {statuses}")
