"""Operator actions on jobs (CLI and dashboard): cancel, retry, requeue failed, and the
same by filter (bulk) — each recorded in the audit trail."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select

from jobs.constants import FN_RUN_JOB
from jobs.models import FINAL_STATUSES, JOB_STATUSES, Job, OpsAction
from jobs.queue import incidents, store
from jobs.queue.broker import enqueue, publish_cancel, publish_job_event, remove
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
    await enqueue(
        svc, FN_RUN_JOB, job_id, token, job_id=store.arq_id(job_id, token), meta=job_meta(job)
    )
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
        await enqueue(
            svc, FN_RUN_JOB, job_id, token, job_id=store.arq_id(job_id, token), meta=job_meta(job)
        )
        await publish_job_event(svc, job_id, "queued", job.skill)
        n += 1
    await _audit(svc, "requeue_failed", skill, actor, count=n)
    return ActionResult(True, f"requeued {n} failed job{'s' if n != 1 else ''} of {skill}")


# --- bulk actions by filter ---------------------------------------------------------------

BULK_CAP = 10_000  # jobs one bulk action touches at most
BULK_ACTIONS = ("retry", "cancel")
_DEFAULT_STATUS = {"retry": ("failed", "timed_out"), "cancel": ("queued", "running")}
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.I)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: Any, *, now: float | None = None) -> float | None:
    """``2h`` / ``30m`` / ``7d`` (that long ago), an ISO 8601 time, or epoch seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value)
    span = _SPAN.match(text)
    if span:
        now = time.time() if now is None else now
        return now - float(span.group(1)) * _UNIT[span.group(2).lower()]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: use 2h, 30m, 7d, an ISO time or epoch seconds"
        ) from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


@dataclass
class JobFilter:
    """Which jobs a bulk action takes: every given field must match. Times apply to when
    the job finished (or was created, while it has not)."""

    status: tuple[str, ...] = ()
    skill: str | None = None
    error_type: str | None = None
    since: float | None = None
    until: float | None = None
    incident: str | None = None

    @classmethod
    def parse(cls, data: dict[str, Any], *, now: float | None = None) -> JobFilter:
        unknown = set(data) - {"status", "skill", "error_type", "since", "until", "incident"}
        if unknown:
            raise ValueError(f"unknown filter field(s): {', '.join(sorted(unknown))}")
        status = data.get("status") or ()
        statuses = tuple(status.split(",") if isinstance(status, str) else status)
        bad = [s for s in statuses if s not in JOB_STATUSES]
        if bad:
            raise ValueError(f"unknown status {bad[0]!r}: one of {', '.join(JOB_STATUSES)}")
        return cls(
            status=statuses,
            skill=data.get("skill") or None,
            error_type=data.get("error_type") or None,
            since=parse_time(data.get("since"), now=now),
            until=parse_time(data.get("until"), now=now),
            incident=data.get("incident") or None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, ())}


async def matching_jobs(svc: Services, flt: JobFilter, action: str) -> list[str]:
    """Ids of the jobs ``flt`` matches (oldest first, at most ``BULK_CAP``)."""
    statuses = flt.status or _DEFAULT_STATUS[action]
    at = func.coalesce(Job.finished_at, Job.created_at)
    q = select(Job.id, Job.skill, Job.status, Job.error_type, Job.error).where(
        Job.status.in_(statuses)
    )
    if flt.skill:
        q = q.where(Job.skill == flt.skill)
    if flt.error_type:
        q = q.where(Job.error_type == flt.error_type)
    if flt.since is not None:
        q = q.where(at >= flt.since)
    if flt.until is not None:
        q = q.where(at <= flt.until)
    wanted = None
    if flt.incident:
        found = await incidents.get_incident(svc.sessionmaker, flt.incident)
        if found is None:
            raise LookupError(f"no incident {flt.incident!r}")
        wanted = found.signature
        q = q.where(Job.skill == found.skill)
    async with svc.sessionmaker() as s:
        rows = (await s.execute(q.order_by(at).limit(BULK_CAP))).all()
    if wanted is None:
        return [r.id for r in rows]
    return [
        r.id
        for r in rows
        if incidents.signature(r.skill, r.error_type or r.status, r.error) == wanted
    ]


async def bulk_action(
    svc: Services,
    action: str,
    flt: JobFilter,
    *,
    dry_run: bool = True,
    actor: str = "",
) -> dict[str, Any]:
    """Retry or cancel every job ``flt`` matches. A dry run only counts them.

    ``{"action", "dry_run", "filter", "matched", "affected", "job_ids", "refused"}``:
    ``job_ids`` are the matched jobs (at most 100 shown), ``refused`` the ones the action
    could not apply to (e.g. finished meanwhile) with why.
    """
    if action not in BULK_ACTIONS:
        raise ValueError(f"unknown action {action!r}: one of {', '.join(BULK_ACTIONS)}")
    ids = await matching_jobs(svc, flt, action)
    out: dict[str, Any] = {
        "action": action,
        "dry_run": dry_run,
        "filter": flt.to_dict(),
        "matched": len(ids),
        "affected": 0,
        "job_ids": ids[:100],
        "refused": [],
    }
    if dry_run:
        return out
    fn = retry_job if action == "retry" else cancel_job
    for job_id in ids:
        res = await fn(svc, job_id, actor=actor)
        if res.ok:
            out["affected"] += 1
        elif len(out["refused"]) < 100:
            out["refused"].append({"job_id": job_id, "error": res.message})
    await _audit(
        svc,
        f"bulk.{action}",
        "jobs",
        actor,
        filter=out["filter"],
        matched=len(ids),
        affected=out["affected"],
    )
    return out
