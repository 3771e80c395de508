"""Fire policies of a schedule: misfires, overlap, auto-pause and failure alerts.

* **Misfire** (``misfire: {grace_sec, catch_up}``): a fire time later than the grace when
  the scheduler sees it is recorded ``missed`` and not run. Of the fire times within the
  grace, ``one`` runs the latest once, ``all`` replays each (the newest 100, one after
  another), ``none`` runs a fire time only when no earlier one was overtaken. The default
  grace is half the period, bounded to 2 min … 2 h (``all``: no bound unless given).
* **Overlap** (``overlap``): a fire time that comes while an earlier run of the schedule is
  still queued or running is recorded ``skipped`` (``skip``, the default), held until that
  run finishes (``queue_one``: at most one held), or run alongside it (``allow``).
* **Auto-pause and alerts**: after a run finishes, the trailing streak of failed runs is
  counted; ``policy.pause_after_failures`` disables the schedule (the reason recorded) and
  ``alert: {target, after, cooldown_sec}`` notifies an alias, at most once per cooldown.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sqlalchemy import func, or_, select, update

from chains.cron import fires_between, next_fire
from chains.runs import arq_job_id, enqueue_run
from delivery.notify import notify
from jobs import audit
from jobs.db import rowcount
from jobs.models import ChainRun, ChainRunStatus, Schedule

if TYPE_CHECKING:
    from jobs.db import Sessions
    from jobs.services import Services

log = logging.getLogger("skilljobs.scheduler")

QUEUED, RUNNING, FAILED = ChainRunStatus.QUEUED, ChainRunStatus.RUNNING, ChainRunStatus.FAILED
MISSED, SKIPPED = ChainRunStatus.MISSED, ChainRunStatus.SKIPPED
FINISHED = (ChainRunStatus.SUCCEEDED, ChainRunStatus.FAILED, ChainRunStatus.STOPPED_EMPTY)
ACTIVE = (QUEUED, RUNNING)

CATCH_UP_CAP = 100  # fire times replayed by ``catch_up: all``
MISSED_ROWS_CAP = 100  # ``missed`` rows recorded per claim (the newest)
GRACE_MIN, GRACE_MAX = 120.0, 7200.0
STREAK_SHOWN = 100  # failed runs in a row counted for an alert's text
OVERLAPS = ("skip", "queue_one", "allow")
CATCH_UPS = ("one", "none", "all")


@dataclass(frozen=True)
class Fire:
    """What one claimed fire time becomes: a run to enqueue now (``queued``), a run held
    behind the running one (``queued``, ``hold``), or a ``missed`` / ``skipped`` record."""

    at: float
    status: str
    hold: bool = False
    note: str | None = None


@dataclass(frozen=True)
class Busy:
    """The schedule's unfinished runs when a fire time is claimed."""

    active: int = 0  # queued or running
    held: int = 0  # of those, queued behind another (never enqueued yet)


def default_grace(cron: str, tz: ZoneInfo, at: float) -> float:
    """Half the period around ``at``, bounded to 2 min … 2 h."""
    first = next_fire(cron, tz, at)
    period = next_fire(cron, tz, first) - first
    if not math.isfinite(period):  # a one-shot schedule: no period to take half of
        return GRACE_MAX
    return min(max(period / 2, GRACE_MIN), GRACE_MAX)


def grace_of(misfire: dict[str, Any] | None, cron: str, tz: ZoneInfo, at: float) -> float | None:
    """The grace in seconds (None: unbounded)."""
    misfire = misfire or {}
    if misfire.get("grace_sec") is not None:
        return float(misfire["grace_sec"])
    if misfire.get("catch_up") == "all":
        return None
    return default_grace(cron, tz, at)


def due_fires(cron: str, tz: ZoneInfo, first: float, now: float, cap: int) -> list[float]:
    """The newest ``cap`` fire instants in ``[first, now]``, oldest first, found without
    walking every fire time of a long downtime."""
    window = 3600.0
    while True:
        start = max(first - 1e-6, now - window)
        fires = fires_between(cron, tz, start, now, limit=1_000_000)
        if len(fires) >= cap or start <= first - 1e-6:
            return fires[-cap:]
        window *= 4


def _misfire(
    fires: list[float], now: float, catch_up: str, grace: float | None
) -> tuple[list[float], list[float]]:
    """(fire times to run, fire times missed) per the misfire policy."""
    on_time = [f for f in fires if grace is None or now - f <= grace]
    if catch_up == "all":
        run = on_time[-CATCH_UP_CAP:]
    elif catch_up == "none":
        run = on_time if len(fires) == 1 else []
    else:
        run = on_time[-1:]
    taken = set(run)
    return run, [f for f in fires if f not in taken]


def plan_fires(
    fires: list[float],
    now: float,
    *,
    misfire: dict[str, Any] | None,
    overlap: str | None,
    grace: float | None,
    busy: Busy,
) -> list[Fire]:
    """Decide every due fire time of one schedule (pure; oldest first)."""
    catch_up = (misfire or {}).get("catch_up") or "one"
    overlap = overlap or "skip"
    run, missed = _misfire(fires, now, catch_up, grace)
    late = f"later than the misfire grace ({grace:g} s)" if grace is not None else "overtaken"
    out = [Fire(f, MISSED, note=f"fire time {late}; not run") for f in missed[-MISSED_ROWS_CAP:]]
    if run:
        out.extend(_overlap(run, overlap, busy))
    return sorted(out, key=lambda f: f.at)


def _overlap(run: list[float], overlap: str, busy: Busy) -> list[Fire]:
    if overlap == "allow":
        return [Fire(f, QUEUED) for f in run]
    if busy.active and (overlap == "skip" or busy.held):
        note = "the previous run was still going"
        return [Fire(f, SKIPPED, note=note) for f in run]
    # the first runs now when nothing else is going; later replays wait their turn
    return [Fire(f, QUEUED, hold=bool(busy.active) or i > 0) for i, f in enumerate(run)]


async def busy_of(sm: Sessions, schedule_ids: list[str]) -> dict[str, Busy]:
    """Unfinished runs per schedule."""
    if not schedule_ids:
        return {}
    async with sm() as s:
        q = (
            select(
                ChainRun.schedule_id,
                func.count(),
                func.count(ChainRun.id).filter(
                    ChainRun.status == QUEUED, ChainRun.arq_job_id.is_(None)
                ),
            )
            .where(ChainRun.schedule_id.in_(schedule_ids), ChainRun.status.in_(ACTIVE))
            .group_by(ChainRun.schedule_id)
        )
        rows = (await s.execute(q)).all()
    return {sid: Busy(int(n), int(h)) for sid, n, h in rows}


# --- after a run ----------------------------------------------------------------------------


async def next_held(sm: Sessions, schedule_id: str) -> str | None:
    """Release the oldest held run of a schedule when none of its runs is going; its id."""

    async with sm() as s:
        going = (
            await s.execute(
                select(func.count())
                .select_from(ChainRun)
                .where(
                    ChainRun.schedule_id == schedule_id,
                    or_(
                        ChainRun.status == RUNNING,
                        (ChainRun.status == QUEUED) & ChainRun.arq_job_id.is_not(None),
                    ),
                )
            )
        ).scalar_one()
        if going:
            return None
        run_id = (
            await s.execute(
                select(ChainRun.id)
                .where(
                    ChainRun.schedule_id == schedule_id,
                    ChainRun.status == QUEUED,
                    ChainRun.arq_job_id.is_(None),
                )
                .order_by(ChainRun.fire_at)
                .limit(1)
            )
        ).scalar_one_or_none()
        if run_id is None:
            return None
        res = await s.execute(
            update(ChainRun)
            .where(ChainRun.id == run_id, ChainRun.arq_job_id.is_(None))
            .values(arq_job_id=arq_job_id(run_id, 0))
        )
        await s.commit()
    return run_id if rowcount(res) == 1 else None


async def release_held(services: Services, schedule_id: str) -> str | None:
    """Enqueue the next held run of the schedule, if its turn has come."""

    run_id = await next_held(services.sessionmaker, schedule_id)
    if run_id is not None:
        await enqueue_run(services, run_id, 0)
        log.info("schedule %s: held run %s released", schedule_id, run_id)
    return run_id


async def failure_streak(sm: Sessions, schedule_id: str, limit: int) -> tuple[int, str | None]:
    """(failed runs in a row among the newest finished runs, the newest error)."""
    async with sm() as s:
        q = (
            select(ChainRun.status, ChainRun.error)
            .where(ChainRun.schedule_id == schedule_id, ChainRun.status.in_(FINISHED))
            .order_by(ChainRun.finished_at.desc())
            .limit(limit)
        )
        rows = (await s.execute(q)).all()
    streak = 0
    for status, _error in rows:
        if status != FAILED:
            break
        streak += 1
    return streak, (rows[0].error if rows and streak else None)


async def after_run(services: Services, schedule_id: str, status: str) -> None:
    """Auto-pause and alert after a finished run (never raises: the run is recorded)."""
    if status != FAILED:
        return
    try:
        await _after_failure(services, schedule_id)
    except Exception:
        log.exception("schedule %s: failure policies could not be applied", schedule_id)


async def _after_failure(services: Services, schedule_id: str) -> None:
    sm = services.sessionmaker
    async with sm() as s:
        row = await s.get(Schedule, schedule_id)
    if row is None:
        return
    pause_after = (row.policy or {}).get("pause_after_failures")
    alert = row.alert or {}
    limit = max(int(pause_after or 0), int(alert.get("after") or 0))
    if not limit:
        return
    streak, error = await failure_streak(sm, schedule_id, max(limit, STREAK_SHOWN))
    paused = None
    if pause_after and streak >= pause_after:
        paused = await _pause(sm, row, streak, error)
    if alert.get("target") and streak >= int(alert.get("after") or 1):
        await _alert(services, row, alert, streak, error, paused)


async def _pause(sm: Sessions, row: Schedule, streak: int, error: str | None) -> str | None:
    reason = f"paused after {streak} consecutive failed runs; last error: {error or 'unknown'}"
    now = time.time()
    async with sm() as s:
        res = await s.execute(
            update(Schedule)
            .where(Schedule.id == row.id, Schedule.enabled.is_(True))
            .values(enabled=False, paused_reason=reason[:2000], updated_at=now)
        )
        if rowcount(res) != 1:
            await s.rollback()
            return None  # already disabled
        audit.record(
            s, action="schedule.pause", target=row.id, actor="policy", details={"reason": reason}
        )
        await s.commit()
    log.warning("schedule %s (%s) %s", row.id, row.name, reason)
    return reason


async def _alert(
    services: Services,
    row: Schedule,
    alert: dict[str, Any],
    streak: int,
    error: str | None,
    paused: str | None,
) -> None:
    now = time.time()
    cooldown = float(alert.get("cooldown_sec", 3600))
    async with services.sessionmaker() as s:  # claim the alert: once per cooldown, any worker
        res = await s.execute(
            update(Schedule)
            .where(
                Schedule.id == row.id,
                or_(Schedule.alerted_at.is_(None), Schedule.alerted_at <= now - cooldown),
            )
            .values(alerted_at=now)
        )
        await s.commit()
    if rowcount(res) != 1:
        return

    lines = [f"Schedule {row.name!r}: {streak} consecutive failed runs.", f"Last error: {error}"]
    if paused:
        lines.append("The schedule has been paused; enable it again once fixed.")
    out = await notify(
        services.settings,
        "\n".join(lines),
        target=alert["target"],
        workspace=None,  # an alert carries no files
        title=f"skilljobs: schedule {row.name} failing",
    )
    if not out.get("ok"):
        log.warning("schedule %s: failure alert not delivered: %s", row.id, out.get("failed"))
