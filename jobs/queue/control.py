"""Operator actions on jobs (CLI and dashboard): cancel, retry, requeue failed — each
recorded in the audit trail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.constants import FN_RUN_JOB
from jobs.models import FINAL_STATUSES, OpsAction
from jobs.queue import store
from jobs.queue.broker import enqueue, publish_cancel, publish_job_event, remove
from jobs.services import Services


@dataclass
class ActionResult:
    ok: bool
    message: str
    status_code: int = 200
    job_id: str | None = None
    status: str | None = None

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": self.ok, "message": self.message}
        if not self.ok:
            body["error"] = self.message
            body["error_type"] = "recoverable"
        if self.job_id:
            body["job_id"] = self.job_id
        if self.status:
            body["status"] = self.status
        return body


async def _audit(svc: Services, action: str, target: str, actor: str, **details: Any) -> None:
    async with svc.sessionmaker() as s:
        s.add(OpsAction(action=action, target=target, actor=actor or "", details=details))
        await s.commit()


async def cancel_job(svc: Services, job_id: str, *, actor: str = "") -> ActionResult:
    """A queued job never starts; a running one is stopped by its worker (subprocesses and
    their children killed) and ends ``cancelled``."""
    job = await store.cancel_queued(svc.sessionmaker, job_id)
    if job is not None:
        if job.arq_job_id:
            await remove(svc, job.arq_job_id)
        await publish_job_event(svc, job_id, "cancelled", job.skill)
        await _audit(svc, "cancel", job_id, actor, was="queued")
        return ActionResult(True, "cancelled before it started", job_id=job_id, status="cancelled")
    job = await store.request_cancel(svc.sessionmaker, job_id)
    if job is not None:
        await publish_cancel(svc, job_id)
        await _audit(svc, "cancel", job_id, actor, was="running")
        return ActionResult(
            True, "stopping: its worker cancels it now", job_id=job_id, status="running"
        )
    found = await store.get_job(svc.sessionmaker, job_id)
    if found is None:
        return ActionResult(False, f"no job {job_id}", 404)
    return ActionResult(
        False,
        f"job {job_id} already finished ({found.status})",
        409,
        job_id=job_id,
        status=found.status,
    )


async def retry_job(svc: Services, job_id: str, *, actor: str = "") -> ActionResult:
    """A finished job runs again as a new attempt of the same job."""
    reopened = await store.reopen(svc.sessionmaker, job_id)
    if reopened is None:
        found = await store.get_job(svc.sessionmaker, job_id)
        if found is None:
            return ActionResult(False, f"no job {job_id}", 404)
        return ActionResult(
            False,
            f"job {job_id} is {found.status}; only finished jobs "
            f"({', '.join(sorted(FINAL_STATUSES))}) can be retried",
            409,
            job_id=job_id,
            status=found.status,
        )
    job, token = reopened
    await enqueue(svc, FN_RUN_JOB, job_id, token, job_id=store.arq_id(job_id, token))
    await publish_job_event(svc, job_id, "queued", job.skill)
    await _audit(svc, "retry", job_id, actor)
    return ActionResult(True, "queued again as a new attempt", job_id=job_id, status="queued")


async def requeue_failed(svc: Services, skill: str, *, actor: str = "") -> ActionResult:
    """Retry every failed or timed-out job of ``skill``."""
    ids = await store.failed_job_ids(svc.sessionmaker, skill)
    n = 0
    for job_id in ids:
        reopened = await store.reopen(svc.sessionmaker, job_id)
        if reopened is None:
            continue
        job, token = reopened
        await enqueue(svc, FN_RUN_JOB, job_id, token, job_id=store.arq_id(job_id, token))
        await publish_job_event(svc, job_id, "queued", job.skill)
        n += 1
    await _audit(svc, "requeue_failed", skill, actor, count=n)
    return ActionResult(True, f"requeued {n} failed job{'s' if n != 1 else ''} of {skill}")
