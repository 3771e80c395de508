"""The chain scheduler: turns due cron fire times into queued chain runs, exactly once.

Every worker runs one; exactly-once comes from the database, never from there being a
single scheduler. Claiming a fire time is one transaction:

1. ``UPDATE schedules SET next_fire_at = :new WHERE id = :id AND next_fire_at = :old`` —
   of several schedulers that saw the same due row, one changes it; the rest match nothing;
2. ``INSERT`` the run with the unique fire key ``cron:<schedule_id>:<epoch>`` — a second
   line of defence should a fire time ever be claimed twice.

What the due fire times become follows the schedule's misfire and overlap policies
(``chains.policies``): runs, ``missed`` or ``skipped`` rows (each with its fire key, so a
fire time is decided once), or runs held until the previous run finishes. The next fire
time is computed from now. The arq job is enqueued after the commit; a run
whose enqueue was lost (Redis flushed, process killed in between) is re-enqueued by the
reconciliation pass, as is a running run whose worker stopped renewing its lease (sooner,
a peer takes it over once that worker's heartbeat is missing: ``chains.runs.take_over_runs``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sqlalchemy import Float, String, and_, bindparam, or_, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from chains import policies
from chains.cron import CronError, next_fire
from chains.policies import Busy, Fire
from chains.runs import QUEUED, arq_job_id, enqueue_number, enqueue_run
from chains.timing import expr_of
from jobs.constants import FN_RUN_CHAIN
from jobs.db import rowcount
from jobs.models import ChainRun, ChainRunStatus, Schedule
from jobs.queue import broker

if TYPE_CHECKING:
    from jobs.services import Services

log = logging.getLogger("skilljobs.scheduler")

RUNNING = ChainRunStatus.RUNNING
_BATCH = 500


# PostgreSQL batch statements with array parameters: compiled once, whatever the batch size.
_ADVANCE = text(
    """
    UPDATE schedules AS s
       SET next_fire_at = d.new, last_fire_at = d.fire, updated_at = :now
      FROM unnest(:ids, :olds, :news, :fires) AS d(sid, old, new, fire)
     WHERE s.id = d.sid AND s.next_fire_at = d.old AND s.enabled
    RETURNING s.id
    """
).bindparams(
    bindparam("ids", type_=ARRAY(String)),
    bindparam("olds", type_=ARRAY(Float)),
    bindparam("news", type_=ARRAY(Float)),
    bindparam("fires", type_=ARRAY(Float)),
    bindparam("now", type_=Float),
)
_INSERT_RUNS = text(
    """
    INSERT INTO chain_runs
           (id, schedule_id, fire_key, trigger, fire_at, status, error, arq_job_id,
            lease_token, created_at, finished_at)
    SELECT r.id, r.sid, r.key, 'cron', r.fire, r.status, r.error, r.arq, 0, :now, r.fin
      FROM unnest(:ids, :sids, :keys, :fires, :arqs, :statuses, :errors, :fins)
           AS r(id, sid, key, fire, arq, status, error, fin)
    ON CONFLICT (fire_key) DO NOTHING
    RETURNING id, status, arq_job_id
    """
).bindparams(
    bindparam("ids", type_=ARRAY(String)),
    bindparam("sids", type_=ARRAY(String)),
    bindparam("keys", type_=ARRAY(String)),
    bindparam("fires", type_=ARRAY(Float)),
    bindparam("arqs", type_=ARRAY(String)),
    bindparam("statuses", type_=ARRAY(String)),
    bindparam("errors", type_=ARRAY(String)),
    bindparam("fins", type_=ARRAY(Float)),
    bindparam("now", type_=Float),
)


def fire_key(schedule_id: str, fire_at: float) -> str:
    return f"cron:{schedule_id}:{round(fire_at)}"


class Scheduler:
    """``tick()`` claims due fire times; ``run_forever()`` ticks and reconciles."""

    def __init__(self, services: Services) -> None:
        self.svc = services
        self.sm = services.sessionmaker
        self._pg = services.engine.dialect.name == "postgresql"

    async def tick(self, now: float | None = None) -> list[str]:
        """Claim every due fire time; returns the ids of the runs this call created."""
        now = time.time() if now is None else now
        if self._pg:
            claimed = await self._claim_batch(now)
        else:
            claimed = await self._claim_each(now)
        if claimed:
            await self._enqueue_all(claimed)
        return claimed

    async def _enqueue_all(self, run_ids: list[str]) -> None:
        """Enqueue the first arq job of each new run and wake idle workers, in one round
        trip: the same job and queue entries ``ArqRedis.enqueue_job`` writes (the ids are
        new, so its duplicate check is replaced by ``NX``)."""
        if self.svc.redis is None:
            log.warning("no Redis connection: %s run(s) stay queued for reconcile", len(run_ids))
            return
        try:
            await broker.enqueue_many(
                self.svc, [(arq_job_id(run_id, 0), FN_RUN_CHAIN, (run_id,)) for run_id in run_ids]
            )
        except Exception as exc:  # the runs stay queued; reconcile() re-enqueues them
            log.warning("enqueue of %s chain run(s) failed: %s", len(run_ids), exc)

    def _due(self, now: float) -> Any:
        return (
            select(
                Schedule.id,
                Schedule.cron,
                Schedule.timezone,
                Schedule.next_fire_at,
                Schedule.misfire,
                Schedule.overlap,
                Schedule.options,
            )
            .where(Schedule.enabled.is_(True), Schedule.next_fire_at <= now)
            .order_by(Schedule.next_fire_at)
            .limit(_BATCH)
        )

    @staticmethod
    def _plan(row: Any, now: float, busy: Busy) -> tuple[list[Fire], float | None]:
        """(what each due fire time becomes, next fire time after now: None when a one-shot
        schedule has fired)."""
        tz = ZoneInfo(row.timezone)
        old = row.next_fire_at
        expr = expr_of(row.cron, row.options)  # its cron moved by its jitter, or its `at`
        grace = policies.grace_of(row.misfire, expr, tz, old)
        cap = policies.MISSED_ROWS_CAP + policies.CATCH_UP_CAP
        fires = policies.due_fires(expr, tz, old, now, cap) or [old]
        plan = policies.plan_fires(
            fires, now, misfire=row.misfire, overlap=row.overlap, grace=grace, busy=busy
        )
        if fires[0] > old:
            log.info("schedule %s: fire times before %s not recorded (downtime)", row.id, fires[0])
        nxt = next_fire(expr, tz, now)
        return plan, nxt if math.isfinite(nxt) else None

    async def _claim_batch(self, now: float) -> list[str]:
        """PostgreSQL: one transaction claims the whole due batch. ``FOR UPDATE SKIP
        LOCKED`` lets concurrent schedulers split the batch without waiting on each other;
        the conditional UPDATE and the unique fire key still guard every fire time."""
        async with self.sm() as s:
            due = (await s.execute(self._due(now).with_for_update(skip_locked=True))).all()
            if not due:
                await s.rollback()
                return []
            busy = await policies.busy_of(self.sm, [row.id for row in due])
            plans: dict[str, list[Fire]] = {}
            advance: list[tuple[str, float, float | None, float]] = []
            for row in due:
                try:
                    plan, new_next = self._plan(row, now, busy.get(row.id, Busy()))
                except (CronError, ValueError, KeyError) as exc:
                    await self._park(s, row.id, row.next_fire_at, exc)
                    continue
                plans[row.id] = plan
                advance.append((row.id, row.next_fire_at, new_next, plan[-1].at))
            won: set[str] = set()
            if advance:
                sids, olds, news, fires = (list(col) for col in zip(*advance, strict=True))
                res = await s.execute(
                    _ADVANCE, {"ids": sids, "olds": olds, "news": news, "fires": fires, "now": now}
                )
                won = set(res.scalars())
            runs = [self._run_values(sid, f, now) for sid in won for f in plans[sid]]
            created: list[Any] = []
            if runs:
                res = await s.execute(_INSERT_RUNS, {**self._columns(runs), "now": now})
                created = list(res.all())
            await s.commit()
        if len(created) < len(runs):
            log.warning("%s fire time(s) already had a run", len(runs) - len(created))
        return [r.id for r in created if r.status == QUEUED and r.arq_job_id]

    @staticmethod
    def _columns(runs: list[dict[str, Any]]) -> dict[str, list[Any]]:
        names = {
            "ids": "id",
            "sids": "schedule_id",
            "keys": "fire_key",
            "fires": "fire_at",
            "arqs": "arq_job_id",
            "statuses": "status",
            "errors": "error",
            "fins": "finished_at",
        }
        return {param: [r[col] for r in runs] for param, col in names.items()}

    async def _claim_each(self, now: float) -> list[str]:
        """Other backends: claim schedule by schedule with the conditional UPDATE."""
        async with self.sm() as s:
            due = (await s.execute(self._due(now))).all()
        out: list[str] = []
        for row in due:
            out.extend(await self._claim(row, now))
        return out

    @staticmethod
    def _run_values(schedule_id: str, fire: Fire, now: float) -> dict[str, Any]:
        run_id = uuid.uuid4().hex
        enqueue = fire.status == QUEUED and not fire.hold
        return {
            "id": run_id,
            "schedule_id": schedule_id,
            "fire_key": fire_key(schedule_id, fire.at),
            "trigger": "cron",
            "fire_at": fire.at,
            "status": fire.status,
            "error": fire.note,
            "arq_job_id": arq_job_id(run_id, 0) if enqueue else None,
            "created_at": now,
            "finished_at": None if fire.status == QUEUED else now,
        }

    async def _park(self, s: AsyncSession, schedule_id: str, old: float, exc: Exception) -> None:
        # A stored schedule that can no longer be evaluated (e.g. its timezone vanished
        # from the tz database): park it instead of failing every tick.
        log.error("schedule %s cannot be evaluated (%s); parked until edited", schedule_id, exc)
        await s.execute(
            update(Schedule)
            .where(Schedule.id == schedule_id, Schedule.next_fire_at == old)
            .values(next_fire_at=None)
        )

    async def _claim(self, row: Any, now: float) -> list[str]:
        """Claim one schedule's due fire times; the ids of the runs to enqueue now."""
        busy = (await policies.busy_of(self.sm, [row.id])).get(row.id, Busy())
        async with self.sm() as s:
            try:
                plan, new_next = self._plan(row, now, busy)
            except (CronError, ValueError, KeyError) as exc:
                await self._park(s, row.id, row.next_fire_at, exc)
                await s.commit()
                return []
            res = await s.execute(
                update(Schedule)
                .where(
                    Schedule.id == row.id,
                    Schedule.next_fire_at == row.next_fire_at,
                    Schedule.enabled.is_(True),
                )
                .values(next_fire_at=new_next, last_fire_at=plan[-1].at, updated_at=now)
            )
            if rowcount(res) != 1:
                await s.rollback()
                return []  # another scheduler claimed it (or it was edited meanwhile)
            out: list[str] = []
            for fire in plan:
                run = self._run_values(row.id, fire, now)
                ins = (
                    sqlite_insert(ChainRun)
                    .values(run)
                    .on_conflict_do_nothing(index_elements=["fire_key"])
                )
                if rowcount(await s.execute(ins)) != 1:
                    log.warning("fire time %s of schedule %s already had a run", fire.at, row.id)
                elif run["arq_job_id"]:
                    out.append(str(run["id"]))
            await s.commit()
        return out

    async def reconcile(self, now: float | None = None) -> list[str]:
        """Re-enqueue runs whose arq job was lost or whose worker died; returns their ids."""
        now = time.time() if now is None else now
        grace = self.svc.settings.worker_lease_sec
        async with self.sm() as s:
            q = (
                select(ChainRun.id, ChainRun.status, ChainRun.arq_job_id)
                .where(
                    or_(
                        and_(
                            ChainRun.status == QUEUED,
                            ChainRun.arq_job_id.is_not(None),  # held runs wait their turn
                            ChainRun.created_at < now - grace,
                            or_(
                                ChainRun.lease_expires_at.is_(None),
                                ChainRun.lease_expires_at < now,
                            ),
                        ),
                        and_(ChainRun.status == RUNNING, ChainRun.lease_expires_at < now),
                    )
                )
                .limit(_BATCH)
            )
            stale = (await s.execute(q)).all()
        out: list[str] = []
        for row in stale:
            if await self._waiting_in_queue(row.arq_job_id):
                continue
            n = enqueue_number(row.arq_job_id) + 1
            async with self.sm() as s:
                old_id = (
                    ChainRun.arq_job_id.is_(None)
                    if row.arq_job_id is None
                    else (ChainRun.arq_job_id == row.arq_job_id)
                )
                res = await s.execute(
                    update(ChainRun)
                    .where(ChainRun.id == row.id, old_id, ChainRun.status == row.status)
                    .values(arq_job_id=arq_job_id(row.id, n))
                )
                await s.commit()
            if rowcount(res) != 1:
                continue  # another scheduler re-enqueued it, or it moved on
            await enqueue_run(self.svc, row.id, n)
            log.info("chain run %s re-enqueued (%s, attempt %s)", row.id, row.status, n)
            out.append(row.id)
        out.extend(await self._release_held())
        return out

    async def _release_held(self) -> list[str]:
        """Held runs whose turn came while the release after the previous run was lost."""
        async with self.sm() as s:
            q = (
                select(ChainRun.schedule_id)
                .where(ChainRun.status == QUEUED, ChainRun.arq_job_id.is_(None))
                .distinct()
                .limit(_BATCH)
            )
            held = list((await s.execute(q)).scalars())
        out = []
        for schedule_id in held:
            run_id = await policies.release_held(self.svc, schedule_id)
            if run_id:
                out.append(run_id)
        return out

    async def _waiting_in_queue(self, job_id: str | None) -> bool:
        """The run's latest arq job exists and no worker has started it."""
        if not job_id:
            return False
        return (await broker.waiting(self.svc, [job_id]))[0]

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Tick every ``scheduler_interval_sec`` and reconcile every
        ``reconcile_interval_sec`` until ``stop`` is set; database and Redis errors are
        logged and retried, never fatal."""
        settings = self.svc.settings
        last_reconcile = 0.0
        failures = 0
        while not stop.is_set():
            try:
                await self.tick()
                if time.monotonic() - last_reconcile >= settings.reconcile_interval_sec:
                    await self.reconcile()
                    last_reconcile = time.monotonic()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.warning("scheduler tick failed (%s in a row): %s", failures, exc)
            delay = (
                settings.scheduler_interval_sec * min(2**failures, 30)
                if failures
                else (settings.scheduler_interval_sec)
            )
            try:  # asyncio.timeout: wait_for (3.11) can swallow a concurrent cancellation
                async with asyncio.timeout(delay):
                    await stop.wait()
            except TimeoutError:
                pass
