"""Jobs failed outside any run: their runs were lost (the worker died or stalled) until the
run cap was used up (``store.fail_lost``).

No worker finishes such a job, so the worker whose take-over or reconciler pass failed it
(and counted it in its incident, for the operator) does what the finishing stage would
have done: the person in the chat is told in one short line (the normal delivery path, the
ledger keeping it to one message) and live dashboards get the event.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select

from jobs import texts
from jobs.finishing import Finisher
from jobs.models import FAILED, Job
from jobs.queue import broker, store
from jobs.services import Services
from jobs.settings import Settings

log = logging.getLogger("skilljobs.worker")

ERROR_TYPE = "lost"


def notice(settings: Settings, job: Job, ctx: dict[str, Any] | None) -> dict[str, Any]:
    """The failure envelope delivered to the person (their language), never stored."""
    lang = texts.language_of(settings, ctx)
    return {
        "ok": False,
        "error": job.error or store.LOST_CAP_REASON.format(n=job.attempts),
        "user_message": texts.text("lost_reason", lang),
        "error_type": ERROR_TYPE,
    }


async def _still_failed(services: Services, job_id: str, token: int) -> bool:
    """The fence of the notice: the job is still the one failed as lost (nobody retried it)."""
    async with services.sessionmaker() as s:
        row = (
            await s.execute(
                select(Job.status, Job.lease_token, Job.error_type).where(Job.id == job_id)
            )
        ).first()
    return row is not None and tuple(row) == (FAILED, token, ERROR_TYPE)


async def tell(services: Services, job_id: str, finisher: Finisher) -> None:
    """Tell the person and the operator that ``job_id`` was failed as lost, through the
    worker's ``finisher``. Never raises: the job's record is written already; what could
    not be told is logged."""
    try:
        job = await store.get_job(services.sessionmaker, job_id)
        if job is None or job.status != FAILED or job.error_type != ERROR_TYPE:
            return
        token = job.lease_token
        if services.redis is not None:
            await broker.publish_events(services, [(job.id, FAILED, job.skill)])
        ctx = services.box.unseal(job.context or {})

        async def fence() -> bool:
            return await _still_failed(services, job.id, token)

        await finisher(services, job, notice(services.settings, job, ctx), fence=fence)
        log.warning("job %s: failed as lost (%s); its origin was told", job.id, job.error)
    except Exception as exc:
        log.warning("job %s: failed as lost, but telling its origin failed: %r", job_id, exc)


__all__ = ["ERROR_TYPE", "notice", "tell"]
