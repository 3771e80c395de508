"""Retention: what is old enough to forget, deleted in small batches that never block work.

- Finished jobs (and their attempts, artifacts and deliveries) older than
  ``SKILLJOBS_RETENTION_DAYS``, except a job with an ``unknown`` or ``failed`` delivery
  younger than that (an operator may still have to act on it). Jobs that are not finished
  are never touched.
- Finished chain runs (and their steps) older than the same retention.
- Web-session messages older than ``SKILLJOBS_MESSAGE_RETENTION_DAYS`` (unset: kept).
- Workspace files older than ``SKILLJOBS_WORKSPACE_RETENTION_DAYS`` (unset: kept) that no
  kept job lists as an artifact.
- Skill dependency environments nobody used for ``SKILLJOBS_SKILL_ENV_RETENTION_DAYS``, or
  past ``SKILLJOBS_SKILL_ENV_MAX_MB`` (``jobs.execution.env_store``: never one in use).

This module deletes; it never changes a job's state (that stays ``store``'s). One pruner
runs at a time across all workers (a PostgreSQL advisory lock; SQLite has one writer).
Each pass is written to the audit trail with its counts, which ``/metrics`` reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Select, delete, exists, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from jobs import audit
from jobs.db import Sessions
from jobs.execution.envs import cleanup
from jobs.models import (
    FINAL_STATUSES,
    Artifact,
    ChainRun,
    ChainRunStatus,
    ChainStep,
    Delivery,
    DeliveryStatus,
    DispatchKey,
    Job,
    JobAttempt,
    SessionMessage,
)
from jobs.queue.idempotency import WINDOW_SEC as KEY_WINDOW
from jobs.settings import Settings

#: the id type of a pruned table
K = TypeVar("K", str, int)

log = logging.getLogger("skilljobs.prune")

DAY = 86400.0
BATCH = 500
#: the share of time a pass may keep the database busy: after each batch it sleeps nine
#: times as long as the batch took, so a backlog of millions drains at a few hundred rows
#: per second without slowing the workers' hot path (bench/prune.py)
DUTY = 0.1
_LOCK_KEY = 0x736B6A70  # "skjp": the advisory lock one pruner holds at a time
_RUN_FINAL = (ChainRunStatus.SUCCEEDED, ChainRunStatus.FAILED, ChainRunStatus.STOPPED_EMPTY)
_HELD = (DeliveryStatus.UNKNOWN, DeliveryStatus.FAILED)


@dataclass
class Pruned:
    """What one pass deleted (or, in a dry run, would delete)."""

    jobs: int = 0
    chain_runs: int = 0
    messages: int = 0
    files: int = 0
    envs: int = 0  # skill dependency environments
    env_bytes: int = 0  # what they took on disk
    dry_run: bool = False

    def total(self) -> int:
        return self.jobs + self.chain_runs + self.messages + self.files + self.envs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cutoff(days: float | None, now: float) -> float | None:
    return None if days is None or days <= 0 else now - days * DAY


def _prunable_jobs(cutoff: float) -> Select[str]:
    """Finished jobs older than ``cutoff`` with no delivery an operator may still need."""
    held = exists().where(
        Delivery.job_id == Job.id,
        Delivery.status.in_(_HELD),
        Delivery.created_at >= cutoff,
    )
    return select(Job.id).where(
        Job.status.in_(FINAL_STATUSES),
        Job.finished_at.is_not(None),
        Job.finished_at < cutoff,
        ~held,
    )


async def _delete_jobs(s: AsyncSession, ids: list[str]) -> None:
    for model in (JobAttempt, Artifact, Delivery):
        await s.execute(delete(model).where(model.job_id.in_(ids)))
    await s.execute(delete(Job).where(Job.id.in_(ids), Job.status.in_(FINAL_STATUSES)))


async def _count(sm: Sessions, stmt: Select[str] | Select[int]) -> int:
    async with sm() as s:
        return len((await s.execute(stmt.limit(1_000_000))).all())


async def _batched(
    sm: Sessions,
    pick: Select[K],
    remove: Callable[[AsyncSession, list[K]], Awaitable[None]],
    pause: float,
) -> int:
    """Delete what ``pick`` selects, ``BATCH`` ids per transaction, yielding between."""
    n = 0
    while True:
        started = time.monotonic()
        async with sm() as s:
            ids = list((await s.scalars(pick.limit(BATCH))).all())
            if not ids:
                return n
            await remove(s, ids)
            await s.commit()
        n += len(ids)
        if len(ids) < BATCH:
            return n
        # Let the hot path have the database between batches (at most DUTY of its time).
        busy = time.monotonic() - started
        await asyncio.sleep(max(pause, busy * (1 / DUTY - 1)))


async def _delete_runs(s: AsyncSession, ids: list[str]) -> None:
    await s.execute(delete(ChainStep).where(ChainStep.run_id.in_(ids)))
    await s.execute(delete(Delivery).where(Delivery.chain_run_id.in_(ids)))
    await s.execute(delete(ChainRun).where(ChainRun.id.in_(ids)))


async def _delete_messages(s: AsyncSession, ids: list[int]) -> None:
    await s.execute(delete(SessionMessage).where(SessionMessage.id.in_(ids)))


async def _kept_paths(sm: Sessions) -> set[str]:
    async with sm() as s:
        rows = await s.scalars(select(Artifact.local_path).where(Artifact.local_path.is_not(None)))
        paths = [p for p in rows if p]
    return await asyncio.to_thread(lambda: {os.path.realpath(p) for p in paths})


def _old_files(root: Path, cutoff: float, keep: set[str]) -> list[Path]:
    """Files under ``root`` last changed before ``cutoff`` that no kept job refers to."""
    old: list[Path] = []
    if not root.is_dir():
        return old
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            with contextlib.suppress(OSError):
                st = path.lstat()
                if st.st_mtime < cutoff and os.path.realpath(path) not in keep:
                    old.append(path)
    return old


async def _prune_files(sm: Sessions, settings: Settings, cutoff: float, dry_run: bool) -> int:
    keep = await _kept_paths(sm)
    files = await asyncio.to_thread(_old_files, settings.resolved_workspace_root, cutoff, keep)
    if not dry_run:
        for path in files:
            with contextlib.suppress(OSError):
                path.unlink()
    return len(files)


def _is_pg(s: AsyncSession) -> bool:
    return s.get_bind().dialect.name == "postgresql"


async def _try_lock(s: AsyncSession) -> bool:
    if not _is_pg(s):
        return True
    got = await s.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": _LOCK_KEY})
    return bool(got)


async def _unlock(s: AsyncSession) -> None:
    if _is_pg(s):
        await s.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_KEY})


async def prune(
    sm: Sessions,
    settings: Settings,
    *,
    dry_run: bool = False,
    now: float | None = None,
    pause: float = 0.05,
    actor: str = "pruner",
) -> Pruned | None:
    """One retention pass; None when another pruner holds the lock."""
    now = time.time() if now is None else now
    out = Pruned(dry_run=dry_run)
    async with sm() as lock:
        if not await _try_lock(lock):
            return None
        try:
            await _pass(sm, settings, out, now, pause)
        finally:
            await _unlock(lock)
            await lock.commit()
    if not dry_run and out.total():
        async with sm() as s:
            audit.record(s, action="prune", target="retention", actor=actor, details=out.to_dict())
            await s.commit()
        log.info("pruned %s", out.to_dict())
    return out


async def _pass(sm: Sessions, settings: Settings, out: Pruned, now: float, pause: float) -> None:
    jobs_cut = _cutoff(settings.retention_days, now)
    if jobs_cut is not None:
        jobs = _prunable_jobs(jobs_cut)
        runs = select(ChainRun.id).where(
            ChainRun.status.in_(_RUN_FINAL),
            ChainRun.finished_at.is_not(None),
            ChainRun.finished_at < jobs_cut,
        )
        if out.dry_run:
            out.jobs, out.chain_runs = await _count(sm, jobs), await _count(sm, runs)
        else:
            out.jobs = await _batched(sm, jobs, _delete_jobs, pause)
            out.chain_runs = await _batched(sm, runs, _delete_runs, pause)
    msg_cut = _cutoff(settings.message_retention_days, now)
    if msg_cut is not None:
        msgs = select(SessionMessage.id).where(SessionMessage.created_at < msg_cut)
        out.messages = (
            await _count(sm, msgs)
            if out.dry_run
            else await _batched(sm, msgs, _delete_messages, pause)
        )
    if not out.dry_run:  # idempotency keys past their window name nothing any more
        async with sm() as s:
            await s.execute(delete(DispatchKey).where(DispatchKey.created_at < now - KEY_WINDOW))
            await s.commit()
    files_cut = _cutoff(settings.workspace_retention_days, now)
    if files_cut is not None:
        out.files = await _prune_files(sm, settings, files_cut, out.dry_run)
    try:  # skill environments: by their own last use (real time), never one in use
        envs = await asyncio.to_thread(cleanup, settings, dry_run=out.dry_run)
    except OSError as exc:  # the rows' pass stands; the environments wait for the next one
        log.warning("skill environments cleanup failed: %s", exc)
    else:
        out.envs, out.env_bytes = len(envs.removed), envs.freed


async def run_forever(sm: Sessions, settings: Settings, stop: asyncio.Event) -> None:
    """Prune every ``SKILLJOBS_PRUNE_INTERVAL_SEC`` until ``stop``; errors are logged and
    retried next time, never fatal. The first pass waits a minute: a worker that starts
    and stops at once (a burst, a test) prunes nothing."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), min(60.0, settings.prune_interval_sec))
    while not stop.is_set():
        try:
            await prune(sm, settings)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "retention pass failed (next try in %ss): %s", settings.prune_interval_sec, exc
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.prune_interval_sec)


def pruned_totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Sum of the counts of recorded prune passes, by kind (for ``/metrics``)."""
    totals = {"jobs": 0, "chain_runs": 0, "messages": 0, "files": 0, "envs": 0}
    for details in rows:
        for key in totals:
            value = details.get(key)
            if isinstance(value, int):
                totals[key] += value
    return totals


__all__ = ["Pruned", "prune", "pruned_totals", "run_forever"]
