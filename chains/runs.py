"""Chain runs: manual triggers, enqueues (the arq ids are ``runstore.arq_job_id``), the
take-over of runs whose worker died, the chain run JSON."""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from chains import runstore as rs
from chains.graph import ITEM_BASE, item_of
from chains.runstore import arq_job_id, enqueue_number
from jobs import audit
from jobs.constants import FN_RUN_CHAIN
from jobs.crypto import redact
from jobs.db import HasSessions, Sessions, sessions_of
from jobs.models import ChainRun, ChainRunStatus, ChainStep, Schedule
from jobs.queue.broker import enqueue
from jobs.queue.lease import presumed_dead

if TYPE_CHECKING:
    from jobs.services import Services

log = logging.getLogger("skilljobs.chains")

QUEUED = ChainRunStatus.QUEUED


async def _require(sm: Sessions, id_or_name: str) -> Schedule:
    async with sm() as s:
        row: Schedule | None = await s.get(Schedule, id_or_name)
        if row is None:
            q = select(Schedule).where(Schedule.name == id_or_name)
            row = (await s.execute(q)).scalar_one_or_none()
    if row is None:
        raise LookupError(f"no schedule {id_or_name!r}")
    return row


async def enqueue_run(services: Services, run_id: str, n: int) -> None:
    await enqueue(services, FN_RUN_CHAIN, run_id, job_id=arq_job_id(run_id, n))


async def take_over_runs(services: Services, me: str, missing_after: float) -> list[str]:
    """Re-run the chain runs of peers presumed dead, without waiting for their leases (as
    ``JobRunner.take_over_once`` does for jobs): the peer's heartbeat key is gone *and* its
    leases went unrenewed for ``missing_after`` seconds. The new attempt takes the lease
    with a new token, so the old one (should it only have been paused) can record nothing;
    its steps that succeeded are not run again. The ids of the runs re-enqueued."""
    before, dead = await presumed_dead(services, rs.LEASES, me=me, missing_after=missing_after)
    out: list[str] = []
    for run_id, n in await rs.take_over(services.sessionmaker, dead, before):
        log.warning("chain run %s: its worker missed 3 heartbeats, re-run", run_id)
        await enqueue_run(services, run_id, n)
        out.append(run_id)
    return out


async def trigger_manual(
    services: Services, schedule_id: str, *, actor: str | None = None, enqueue: bool = True
) -> str:
    """Start an on-demand run now (its own run, fire key ``manual:<uuid>``); the run id.
    ``enqueue=False`` only records it (the caller runs it in-process)."""
    row = await _require(services.sessionmaker, schedule_id)
    now = time.time()
    run = ChainRun(
        id=uuid.uuid4().hex,
        schedule_id=row.id,
        fire_key=f"manual:{uuid.uuid4().hex}",
        trigger="manual",
        fire_at=now,
        status=QUEUED,
        created_at=now,
    )
    run.arq_job_id = arq_job_id(run.id, 0)
    async with services.sessionmaker() as s:
        s.add(run)
        await s.commit()
    async with services.sessionmaker() as s:
        audit.record(
            s, action="schedule.run", target=row.id, actor=actor or "", details={"run_id": run.id}
        )
        await s.commit()
    if enqueue:
        await enqueue_run(services, run.id, 0)
    return run.id


def _step_dict(step: ChainStep) -> dict[str, Any]:
    return {
        "id": step.step_id,
        "index": step.idx,
        "skill": step.skill,
        "status": step.status,
        "input": redact(step.input) if step.input is not None else None,
        "output": step.output,  # results are data: scrubbed by value when they ran (C12)
        "error": step.error,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
        "duration_ms": step.duration_ms,
    }


def run_dict(
    run: ChainRun, steps: list[ChainStep], spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Chain run JSON (SPEC §10). The item runs of ``for_each`` steps are counted in their
    step's ``items`` (``?items`` of the API lists them); ``spec``: the schedule's steps, for
    each step's ``needs`` and ``for_each`` (the graph the dashboard draws)."""
    own = [s for s in steps if s.idx < ITEM_BASE]
    counts: dict[int, dict[str, int]] = {}
    for s in steps:
        found = item_of(s.idx)
        if found is not None:
            per = counts.setdefault(found[0], {"total": 0})
            per["total"] += 1
            per[s.status] = per.get(s.status, 0) + 1
    shape = {st.get("id"): st for st in (spec or {}).get("steps") or [] if isinstance(st, dict)}
    out_steps = []
    for s in sorted(own, key=lambda x: x.idx):
        d = _step_dict(s)
        declared = shape.get(s.step_id) or {}
        d["needs"] = declared.get("needs")
        d["for_each"] = declared.get("for_each")
        if s.idx in counts:
            d["items"] = counts[s.idx]
        out_steps.append(d)
    return {
        "id": run.id,
        "schedule_id": run.schedule_id,
        "status": run.status,
        "trigger": run.trigger,
        "fire_key": run.fire_key,
        "fire_at": run.fire_at,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "error": run.error,
        "result": run.result,
        "steps": out_steps,
    }


async def list_runs(
    target: HasSessions | Sessions, schedule_id: str, *, limit: int = 50
) -> list[dict[str, Any]]:
    """Runs of a schedule, newest first."""
    sm = sessions_of(target)
    row = await _require(sm, schedule_id)
    async with sm() as s:
        runs = list(
            (
                await s.execute(
                    select(ChainRun)
                    .where(ChainRun.schedule_id == row.id)
                    .order_by(ChainRun.created_at.desc())
                    .limit(limit)
                )
            ).scalars()
        )
        steps: dict[str, list[ChainStep]] = {r.id: [] for r in runs}
        if runs:
            q = select(ChainStep).where(ChainStep.run_id.in_(list(steps)))
            for st in (await s.execute(q)).scalars():
                steps[st.run_id].append(st)
    return [run_dict(r, steps[r.id]) for r in runs]


async def get_run(
    target: HasSessions | Sessions, run_id: str, *, items: bool = False
) -> dict[str, Any] | None:
    """Chain run JSON, or None. ``items``: also ``"items"``, every item run of its
    ``for_each`` steps (``{"id", "step", "item", "status", "input", "output", "error"…}``)."""
    async with sessions_of(target)() as s:
        run = await s.get(ChainRun, run_id)
        if run is None:
            return None
        q = select(ChainStep).where(ChainStep.run_id == run_id)
        steps = list((await s.execute(q)).scalars())
        schedule = await s.get(Schedule, run.schedule_id)
    spec = {"steps": schedule.steps} if schedule is not None else None
    out = run_dict(run, steps, spec)
    if items:
        rows = sorted((st for st in steps if st.idx >= ITEM_BASE), key=lambda x: x.idx)
        out["items"] = [
            {**_step_dict(st), "step": (item_of(st.idx) or (0, 0))[0], "item": st.idx % ITEM_BASE}
            for st in rows
        ]
    return out


async def last_runs(target: HasSessions | Sessions) -> dict[str, ChainRun]:
    """The newest run of every schedule that has one."""
    async with sessions_of(target)() as s:
        newest = (
            select(ChainRun.schedule_id, func.max(ChainRun.created_at).label("at"))
            .group_by(ChainRun.schedule_id)
            .subquery()
        )
        q = select(ChainRun).join(
            newest,
            (ChainRun.schedule_id == newest.c.schedule_id) & (ChainRun.created_at == newest.c.at),
        )
        return {r.schedule_id: r for r in (await s.execute(q)).scalars()}


__all__ = [
    "QUEUED",
    "arq_job_id",
    "enqueue_number",
    "enqueue_run",
    "get_run",
    "last_runs",
    "list_runs",
    "run_dict",
    "take_over_runs",
    "trigger_manual",
]
