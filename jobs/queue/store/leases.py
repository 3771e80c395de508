"""The leases of running jobs (``jobs.queue.lease``): their renewal, their expiry and
take-over (a job lost too often is failed instead), the workers' rows."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import (
    func,
    select,
)

from jobs.constants import MAX_RUNS
from jobs.db import Sessions
from jobs.models import (
    FAILED,
    RUNNING,
    AttemptOutcome,
    Job,
    JobAttempt,
    Worker,
)
from jobs.queue import incidents
from jobs.queue.lease import write_fenced
from jobs.queue.store.finishes import close_attempt, requeue
from jobs.queue.store.tables import LEASES


@dataclass(frozen=True, slots=True)
class Renewal:
    """What a lease renewal found: the leases ``still`` held (renewed), those with a cancel
    requested, and those ``busy`` (locked by another transaction — this worker's own
    finish, usually — so neither renewed nor lost: asked again at the next heartbeat)."""

    still: set[str]
    cancel: set[str]
    busy: set[str]


async def renew_leases(
    sm: Sessions, worker_id: str, held: dict[str, int], lease_sec: float
) -> Renewal:
    """Extend the leases this worker holds.

    Rows another transaction has locked are skipped (``SKIP LOCKED``), not waited for: a
    batched finish locks the rows of its jobs in its own order, and a renewal waiting for
    one of them while holding another would deadlock with it."""
    if not held:
        return Renewal(set(), set(), set())
    now = time.time()
    ids = sorted(held)
    c = LEASES.table.c
    mine = (
        select(c.id)
        .where(c.id.in_(ids), c.lease_owner == worker_id, c.status == RUNNING)
        .order_by(c.id)
        .with_for_update(skip_locked=True)
    )
    renewal = LEASES.renew(c.id.in_(mine.scalar_subquery()), expires=now + lease_sec)
    async with sm() as s:
        res = await s.execute(renewal.returning(c.id, c.lease_token, c.cancel_requested))
        rows = res.all()
        await s.commit()
        missing = [i for i in ids if i not in {r[0] for r in rows}]
        busy: set[str] = set()
        if missing:  # locked (still ours as last committed) or really gone
            found = await s.execute(
                select(Job.id, Job.lease_token, Job.lease_owner, Job.status).where(
                    Job.id.in_(missing)
                )
            )
            busy = {
                i
                for i, tok, owner, status in found.all()
                if owner == worker_id and status == RUNNING and held.get(i) == tok
            }
            await s.commit()
    still = {r[0] for r in rows if held.get(r[0]) == r[1]}
    cancel = {r[0] for r in rows if r[2] and r[0] in still}
    return Renewal(still, cancel, busy)


LOST_CAP_REASON = "lost {n} times (the worker running it died or stalled each time)"


async def expire_leases(
    sm: Sessions,
    *,
    limit: int = 500,
    owners: set[str] | None = None,
    before: float | None = None,
    why: str = "stopped heartbeating (lease expired)",
    failed: list[str] | None = None,
) -> list[tuple[str, int]]:
    """Requeue running jobs whose lease ran out (their worker died). Returns (id, token).

    ``owners``/``before``: only the leases of those workers last renewed long enough ago
    that ``lease_expires_at < before`` (a peer found the worker's heartbeat missing). Each
    attempt taken away ends ``lost`` and counts toward the run cap: a job that has had its
    ``MAX_RUNS`` runs is failed instead of run again (its id appended to ``failed``, for
    the caller to tell its origin: ``jobs.queue.lost``).
    """
    now = time.time()
    out: list[tuple[str, int]] = []
    if owners is not None and not owners:
        return []
    query = select(Job.id, Job.lease_token, Job.lease_owner, Job.attempts, Job.skill).where(
        *LEASES.expired(now if before is None else before, owners)
    )
    async with sm() as s:
        rows = (await s.execute(query.limit(limit))).all()
    for job_id, token, owner, attempts, skill in rows:
        reason = f"worker {owner} {why}"
        if attempts >= MAX_RUNS:
            error = await fail_lost(sm, job_id, token, reason)
            if error is not None:  # a failure like any other: counted in its incident
                await incidents.note_failure(sm, job_id, skill, "lost", error)
                if failed is not None:
                    failed.append(job_id)
            continue
        new = await requeue(
            sm,
            job_id,
            token,
            reason=reason,
            error_type="transient",
            attempt_outcome=AttemptOutcome.LOST,
        )
        if new is not None:
            out.append((job_id, new))
    return out


async def fail_lost(sm: Sessions, job_id: str, token: int, reason: str) -> str | None:
    """End a job whose last allowed run was lost: ``failed``, never run again. The error
    recorded, or None when the attempt no longer held the lease."""
    now = time.time()
    async with sm() as s:
        lost = await s.scalar(
            select(func.count())
            .select_from(JobAttempt)
            .where(JobAttempt.job_id == job_id, JobAttempt.outcome == AttemptOutcome.LOST)
        )
        n = int(lost or 0) + 1
        error = (
            LOST_CAP_REASON.format(n=n)
            if n >= MAX_RUNS
            else (
                f"{MAX_RUNS} runs used, the last one lost (the worker running it died or stalled)"
            )
        )
        ended = LEASES.release(
            job_id,
            token,
            status=FAILED,
            error=error,
            error_type="lost",
            lease_token=token + 1,
            finished_at=now,
            duration_ms=(now - Job.started_at) * 1000.0,
            updated_at=now,
        )
        if not await write_fenced(s, ended):
            return None
        await close_attempt(s, job_id, token, AttemptOutcome.LOST, reason, "lost", now)
        await s.commit()
        return error


async def stale_owners(sm: Sessions, before: float, *, exclude: str) -> list[str]:
    """Workers other than ``exclude`` holding a running job whose lease expires before
    ``before`` (renewed longer ago than a live worker would let it be)."""
    return await LEASES.stale_owners(sm, before, exclude=exclude)


async def live_peers(sm: Sessions, *, exclude: str, since: float) -> list[str]:
    """Workers other than ``exclude`` that have not stopped and wrote their row after
    ``since`` (the ones whose death a peer must notice)."""
    async with sm() as s:
        rows = await s.scalars(
            select(Worker.id).where(
                Worker.stopped_at.is_(None), Worker.last_heartbeat > since, Worker.id != exclude
            )
        )
        return sorted(rows)


async def worker_heartbeat(
    sm: Sessions,
    worker_id: str,
    host: str,
    pid: int,
    running: list[str],
    *,
    stopped: bool = False,
    stalls: tuple[int, float] | None = None,
) -> None:
    """The worker's row: its heartbeat, what it runs, and (``stalls``) the stall
    detector's count and longest block in seconds."""
    now = time.time()
    async with sm() as s:
        w = await s.get(Worker, worker_id)
        if w is None:
            w = Worker(
                id=worker_id,
                host=host,
                pid=pid,
                started_at=now,
                last_heartbeat=now,
                running=running,
            )
            s.add(w)
        else:
            w.last_heartbeat = now
            w.running = running
            if stopped:
                w.stopped_at = now
        if stalls is not None:
            w.stalls, w.longest_stall_s = stalls
        await s.commit()
