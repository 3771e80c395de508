"""The chain scheduler: turns due cron fire times into queued chain runs, exactly once.

Every worker runs one; exactly-once comes from the database, never from there being a
single scheduler. Claiming a fire time is one transaction:

1. ``UPDATE schedules SET next_fire_at = :new WHERE id = :id AND next_fire_at = :old`` —
   of several schedulers that saw the same due row, one changes it; the rest match nothing;
2. ``INSERT`` the run with the unique fire key ``cron:<schedule_id>:<epoch>`` — a second
   line of defence should a fire time ever be claimed twice.

Missed fires after downtime are coalesced: the run is for the latest due fire time and
the next fire time is computed from now. The arq job is enqueued after the commit; a run
whose enqueue was lost (Redis flushed, process killed in between) is re-enqueued by the
reconciliation pass, as is a running run whose worker stopped renewing its lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sqlalchemy import Float, String, and_, bindparam, or_, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from chains.cron import CronError, latest_fire, next_fire
from chains.runs import QUEUED, arq_job_id, enqueue_number, enqueue_run
from jobs.constants import FN_RUN_CHAIN
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
           (id, schedule_id, fire_key, trigger, fire_at, status, arq_job_id, lease_token, created_at)
    SELECT r.id, r.sid, r.key, 'cron', r.fire, :status, r.arq, 0, :now
      FROM unnest(:ids, :sids, :keys, :fires, :arqs) AS r(id, sid, key, fire, arq)
    ON CONFLICT (fire_key) DO NOTHING
    RETURNING id
    """
).bindparams(
    bindparam("ids", type_=ARRAY(String)),
    bindparam("sids", type_=ARRAY(String)),
    bindparam("keys", type_=ARRAY(String)),
    bindparam("fires", type_=ARRAY(Float)),
    bindparam("arqs", type_=ARRAY(String)),
    bindparam("status", type_=String),
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
            select(Schedule.id, Schedule.cron, Schedule.timezone, Schedule.next_fire_at)
            .where(Schedule.enabled.is_(True), Schedule.next_fire_at <= now)
            .order_by(Schedule.next_fire_at)
            .limit(_BATCH)
        )

    @staticmethod
    def _plan(cron: str, tz_name: str, old: float, now: float) -> tuple[float, float]:
        """(fire time to run — the latest due one, next fire time after now)."""
        tz = ZoneInfo(tz_name)
        return latest_fire(cron, tz, old, now) or old, next_fire(cron, tz, now)

    async def _claim_batch(self, now: float) -> list[str]:
        """PostgreSQL: one transaction claims the whole due batch. ``FOR UPDATE SKIP
        LOCKED`` lets concurrent schedulers split the batch without waiting on each other;
        the conditional UPDATE and the unique fire key still guard every fire time."""
        async with self.sm() as s:
            due = (await s.execute(self._due(now).with_for_update(skip_locked=True))).all()
            if not due:
                await s.rollback()
                return []
            plans: list[tuple[str, float, float, float]] = []
            for row in due:
                try:
                    fire_at, new_next = self._plan(row.cron, row.timezone, row.next_fire_at, now)
                except (CronError, ValueError, KeyError) as exc:
                    await self._park(s, row.id, row.next_fire_at, exc)
                    continue
                plans.append((row.id, row.next_fire_at, new_next, fire_at))
            won: set[str] = set()
            if plans:
                sids, olds, news, fires = (list(col) for col in zip(*plans, strict=True))
                res = await s.execute(
                    _ADVANCE, {"ids": sids, "olds": olds, "news": news, "fires": fires, "now": now}
                )
                won = set(res.scalars())
            runs = [
                self._run_values(sid, fire_at, now)
                for sid, _old, _new, fire_at in plans
                if sid in won
            ]
            created: list[str] = []
            if runs:
                res = await s.execute(
                    _INSERT_RUNS,
                    {
                        "ids": [r["id"] for r in runs],
                        "sids": [r["schedule_id"] for r in runs],
                        "keys": [r["fire_key"] for r in runs],
                        "fires": [r["fire_at"] for r in runs],
                        "arqs": [r["arq_job_id"] for r in runs],
                        "status": QUEUED,
                        "now": now,
                    },
                )
                created = list(res.scalars())
            await s.commit()
        if len(created) < len(runs):
            log.warning("%s fire time(s) already had a run", len(runs) - len(created))
        return created

    async def _claim_each(self, now: float) -> list[str]:
        """Other backends: claim schedule by schedule with the conditional UPDATE."""
        async with self.sm() as s:
            due = (await s.execute(self._due(now))).all()
        out = []
        for row in due:
            run_id = await self._claim(row.id, row.cron, row.timezone, row.next_fire_at, now)
            if run_id:
                out.append(run_id)
        return out

    @staticmethod
    def _run_values(schedule_id: str, fire_at: float, now: float) -> dict[str, Any]:
        run_id = uuid.uuid4().hex
        return {
            "id": run_id,
            "schedule_id": schedule_id,
            "fire_key": fire_key(schedule_id, fire_at),
            "trigger": "cron",
            "fire_at": fire_at,
            "status": QUEUED,
            "arq_job_id": arq_job_id(run_id, 0),
            "created_at": now,
        }

    async def _park(self, s: Any, schedule_id: str, old: float, exc: Exception) -> None:
        # A stored schedule that can no longer be evaluated (e.g. its timezone vanished
        # from the tz database): park it instead of failing every tick.
        log.error("schedule %s cannot be evaluated (%s); parked until edited", schedule_id, exc)
        await s.execute(
            update(Schedule)
            .where(Schedule.id == schedule_id, Schedule.next_fire_at == old)
            .values(next_fire_at=None)
        )

    async def _claim(
        self, schedule_id: str, cron: str, tz_name: str, old: float, now: float
    ) -> str | None:
        async with self.sm() as s:
            try:
                fire_at, new_next = self._plan(cron, tz_name, old, now)
            except (CronError, ValueError, KeyError) as exc:
                await self._park(s, schedule_id, old, exc)
                await s.commit()
                return None
            res = await s.execute(
                update(Schedule)
                .where(
                    Schedule.id == schedule_id,
                    Schedule.next_fire_at == old,
                    Schedule.enabled.is_(True),
                )
                .values(next_fire_at=new_next, last_fire_at=fire_at, updated_at=now)
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]
                await s.rollback()
                return None  # another scheduler claimed it (or it was edited meanwhile)
            run = self._run_values(schedule_id, fire_at, now)
            ins = (
                sqlite_insert(ChainRun)
                .values(run)
                .on_conflict_do_nothing(index_elements=["fire_key"])
            )
            inserted = await s.execute(ins)
            await s.commit()
        if inserted.rowcount != 1:  # type: ignore[attr-defined]
            log.warning("fire time %s of schedule %s already had a run", fire_at, schedule_id)
            return None
        if fire_at > old:
            log.info("schedule %s: missed fires since %s coalesced into one run", schedule_id, old)
        return str(run["id"])

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
            if res.rowcount != 1:  # type: ignore[attr-defined]
                continue  # another scheduler re-enqueued it, or it moved on
            await enqueue_run(self.svc, row.id, n)
            log.info("chain run %s re-enqueued (%s, attempt %s)", row.id, row.status, n)
            out.append(row.id)
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
