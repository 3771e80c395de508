"""Operator actions on jobs (CLI and dashboard): cancel, retry, requeue failed, and the
same for every job a search filter matches (bulk, ``jobs.queue.filters``) — each recorded
in the audit trail. A cancel tells the job's person through the ``Notices`` it is handed
(``delivery.notices``, by the CLI and the dashboard), as the runner is handed its own."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import func, select

from jobs import audit
from jobs.constants import FN_RUN_JOB
from jobs.finishing import Notices
from jobs.models import (
    CANCELLED,
    FAILED,
    FINAL_STATUSES,
    QUEUED,
    RUNNING,
    SCHEDULED,
    TIMED_OUT,
    Job,
)
from jobs.queue import incidents, store
from jobs.queue.broker import enqueue, publish_cancel, publish_job_event, remove
from jobs.queue.filters import JobFilter, parse_time
from jobs.queue.limits import job_meta
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
        audit.record(s, action=action, target=target, actor=actor, details=details)
        await s.commit()


async def _refused(
    svc: Services, action: str, job_id: str, actor: str, res: ActionResult, audit: bool
) -> ActionResult:
    """A refused action is in the audit trail too (result ``refused``, with why)."""
    if audit:
        await _audit(svc, action, job_id[:255], actor, result="refused", error=res.message)
    return res


async def cancel_job(
    svc: Services,
    job_id: str,
    *,
    notices: Notices,
    actor: str = "",
    audit_refusal: bool = True,
) -> ActionResult:
    """A queued job never starts; a running one is stopped by its worker (subprocesses and
    their children killed) and ends ``cancelled``. ``audit_refusal``: record a refusal
    (bulk actions count theirs in their own entry)."""
    job = await store.cancel_queued(svc.sessionmaker, job_id)
    if job is not None:
        if job.arq_job_id:
            await remove(svc, job.arq_job_id)
        await publish_job_event(svc, job_id, CANCELLED, job.skill)
        await _audit(svc, "cancel", job_id, actor, was=QUEUED)
        await notices.cancelled(svc, job)  # the person is told (once; off-able)
        return ActionResult(True, "cancelled before it started", job_id=job_id, status=CANCELLED)
    job = await store.request_cancel(svc.sessionmaker, job_id)
    if job is not None:
        await publish_cancel(svc, job_id)
        await _audit(svc, "cancel", job_id, actor, was=RUNNING)
        return ActionResult(
            True, "stopping: its worker cancels it now", job_id=job_id, status=RUNNING
        )
    found = await store.get_job(svc.sessionmaker, job_id)
    if found is None:
        res = ActionResult(False, f"no job {job_id}", 404)
    else:
        res = ActionResult(
            False,
            f"job {job_id} already finished ({found.status})",
            409,
            job_id=job_id,
            status=found.status,
        )
    return await _refused(svc, "cancel", job_id, actor, res, audit_refusal)


async def retry_job(
    svc: Services, job_id: str, *, actor: str = "", audit_refusal: bool = True
) -> ActionResult:
    """A finished job runs again as a new attempt of the same job."""
    reopened = await store.reopen(svc.sessionmaker, job_id)
    if reopened is None:
        found = await store.get_job(svc.sessionmaker, job_id)
        if found is None:
            res = ActionResult(False, f"no job {job_id}", 404)
        else:
            res = ActionResult(
                False,
                f"job {job_id} is {found.status}; only finished jobs "
                f"({', '.join(sorted(FINAL_STATUSES))}) can be retried",
                409,
                job_id=job_id,
                status=found.status,
            )
        return await _refused(svc, "retry", job_id, actor, res, audit_refusal)
    job, token = reopened
    await enqueue(
        svc, FN_RUN_JOB, job_id, token, job_id=store.arq_id(job_id, token), meta=job_meta(job)
    )
    await publish_job_event(svc, job_id, QUEUED, job.skill)
    await _audit(svc, "retry", job_id, actor)
    return ActionResult(True, "queued again as a new attempt", job_id=job_id, status=QUEUED)


async def requeue_failed(svc: Services, skill: str, *, actor: str = "") -> ActionResult:
    """Retry every failed or timed-out job of ``skill``."""
    ids = await store.failed_job_ids(svc.sessionmaker, skill)
    n = 0
    for job_id in ids:
        reopened = await store.reopen(svc.sessionmaker, job_id)
        if reopened is None:
            continue
        job, token = reopened
        await enqueue(
            svc, FN_RUN_JOB, job_id, token, job_id=store.arq_id(job_id, token), meta=job_meta(job)
        )
        await publish_job_event(svc, job_id, QUEUED, job.skill)
        n += 1
    await _audit(svc, "requeue_failed", skill, actor, count=n)
    return ActionResult(True, f"requeued {n} failed job{'s' if n != 1 else ''} of {skill}")


async def delete_job(
    svc: Services, job_id: str, *, actor: str = "", audit_refusal: bool = True
) -> ActionResult:
    """Delete a finished job with its attempts, files' records and deliveries (audited);
    a queued or running one is refused (cancel it first)."""
    gone = await store.delete_finished(svc.sessionmaker, job_id)
    if gone is None:
        found = await store.get_job(svc.sessionmaker, job_id)
        if found is None:
            res = ActionResult(False, f"no job {job_id}", 404, job_id=job_id)
        else:
            res = ActionResult(
                False,
                f"job {job_id} is {found.status}; only finished jobs can be deleted "
                "(cancel it first)",
                409,
                job_id=job_id,
                status=found.status,
            )
        return await _refused(svc, "delete", job_id, actor, res, audit_refusal)
    skill, status = gone
    await _audit(svc, "delete", job_id, actor, skill=skill, status=status)
    return ActionResult(True, "deleted", job_id=job_id, status="deleted")


# --- bulk actions by filter ---------------------------------------------------------------

BULK_CAP = 10_000  # jobs one bulk action touches at most (run it again for the rest)
BULK_ACTIONS = ("retry", "cancel", "delete")
_DEFAULT_STATUS = {
    "retry": (FAILED, TIMED_OUT),
    "cancel": (SCHEDULED, QUEUED, RUNNING),
    "delete": tuple(sorted(FINAL_STATUSES)),
}
SHOWN = 100  # job ids (and refusals) listed in an answer


async def _act_on(
    svc: Services, action: str, job_id: str, notices: Notices, actor: str
) -> ActionResult:
    """``action`` on one job of many (a refusal is counted in the bulk entry instead)."""
    if action == "cancel":
        return await cancel_job(svc, job_id, notices=notices, actor=actor, audit_refusal=False)
    act = retry_job if action == "retry" else delete_job
    return await act(svc, job_id, actor=actor, audit_refusal=False)


async def matching_jobs(
    svc: Services, flt: JobFilter, action: str, *, limit: int = BULK_CAP
) -> tuple[int, list[str]]:
    """How many jobs ``flt`` matches, and the ids of the oldest ``limit`` of them. Without
    a status, an action takes the jobs it applies to (retry: failed and timed out;
    cancel: queued and running)."""
    if not flt.status:
        flt = replace(flt, status=_DEFAULT_STATUS[action])
    async with svc.sessionmaker() as s:
        conds = await flt.conditions_in(s)
    if flt.incident:
        found = await incidents.get_incident(svc.sessionmaker, flt.incident)
        if found is None:
            raise LookupError(f"no incident {flt.incident!r}")
        rows_q = select(Job.id, Job.skill, Job.status, Job.error_type, Job.error).where(
            *conds, Job.skill == found.skill
        )
        async with svc.sessionmaker() as s:
            rows = (await s.execute(rows_q.order_by(Job.created_at).limit(BULK_CAP))).all()
        ids = [
            r.id
            for r in rows
            if incidents.signature(r.skill, r.error_type or r.status, r.error) == found.signature
        ]
        return len(ids), ids[:limit]
    async with svc.sessionmaker() as s:
        total = int((await s.execute(select(func.count()).where(*conds))).scalar() or 0)
        if not total:
            return 0, []
        q = select(Job.id, Job.created_at).where(*conds)
        if total > limit:  # only then the oldest first; else the planner need not sort
            q = q.order_by(Job.created_at, Job.id).limit(limit)
        found_rows = (await s.execute(q)).all()
    oldest_first = sorted(found_rows, key=lambda r: (r.created_at, r.id))
    return total, [r.id for r in oldest_first][:limit]


async def bulk_action(
    svc: Services,
    action: str,
    flt: JobFilter,
    *,
    notices: Notices,
    dry_run: bool = True,
    limit: int = BULK_CAP,
    actor: str = "",
) -> dict[str, Any]:
    """Retry or cancel every job ``flt`` matches (the job list's filter), the oldest
    ``limit`` (at most ``BULK_CAP``) at once. A dry run only counts them.

    ``{"action", "dry_run", "filter", "matched", "limit", "capped", "affected", "job_ids",
    "refused"}``: ``matched`` counts every job the filter matches, ``capped`` says more
    matched than one action takes (run it again for the rest), ``job_ids`` lists the
    jobs taken (at most 100 shown), ``refused`` those the action could not apply to (e.g.
    finished meanwhile) with why. Every real run is in the audit trail.
    """
    if action not in BULK_ACTIONS:
        raise ValueError(f"unknown action {action!r}: one of {', '.join(BULK_ACTIONS)}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BULK_CAP:
        raise ValueError(f"limit must be a whole number from 1 to {BULK_CAP}")
    # a dry run shows only the first ids: it need not read every one it counts
    matched, ids = await matching_jobs(
        svc, flt, action, limit=min(limit, SHOWN) if dry_run else limit
    )
    out: dict[str, Any] = {
        "action": action,
        "dry_run": dry_run,
        "filter": flt.to_dict(),
        "matched": matched,
        "limit": limit,
        "capped": matched > limit,
        "affected": 0,
        "job_ids": ids[:SHOWN],
        "refused": [],
    }
    if dry_run:
        return out
    for job_id in ids:
        res = await _act_on(svc, action, job_id, notices, actor)
        if res.ok:
            out["affected"] += 1
        elif len(out["refused"]) < SHOWN:
            out["refused"].append({"job_id": job_id, "error": res.message})
    await _audit(
        svc,
        f"bulk.{action}",
        "jobs",
        actor,
        filter=out["filter"],
        matched=matched,
        taken=len(ids),
        affected=out["affected"],
        refused=len(ids) - out["affected"],
        result="ok" if out["affected"] == len(ids) else "partial",
    )
    return out


SELECTION_CAP = 500  # jobs a selection (ids picked by an operator) may hold


async def act_on_selection(
    svc: Services, action: str, job_ids: list[str], *, notices: Notices, actor: str = ""
) -> dict[str, Any]:
    """Retry, cancel or delete the jobs an operator picked (the dashboard's per-row
    selection): ``{"action", "selected", "affected", "job_ids", "refused"}``, audited as
    one ``bulk.<action>`` entry besides each job's own."""
    if action not in BULK_ACTIONS:
        raise ValueError(f"unknown action {action!r}: one of {', '.join(BULK_ACTIONS)}")
    ids = list(dict.fromkeys(str(j) for j in job_ids))
    if not ids or len(ids) > SELECTION_CAP:
        raise ValueError(f"select from 1 to {SELECTION_CAP} jobs")
    out: dict[str, Any] = {"action": action, "selected": len(ids), "affected": 0}
    out |= {"job_ids": ids[:SHOWN], "refused": []}
    for job_id in ids:
        res = await _act_on(svc, action, job_id, notices, actor)
        if res.ok:
            out["affected"] += 1
        elif len(out["refused"]) < SHOWN:
            out["refused"].append({"job_id": job_id, "error": res.message})
    await _audit(
        svc,
        f"bulk.{action}",
        "jobs",
        actor,
        selection=ids[:SHOWN],
        taken=len(ids),
        affected=out["affected"],
        refused=len(ids) - out["affected"],
        result="ok" if out["affected"] == len(ids) else "partial",
    )
    return out


__all__ = [
    "BULK_ACTIONS",
    "BULK_CAP",
    "ActionResult",
    "JobFilter",
    "act_on_selection",
    "bulk_action",
    "cancel_job",
    "delete_job",
    "matching_jobs",
    "parse_time",
    "requeue_failed",
    "retry_job",
]
