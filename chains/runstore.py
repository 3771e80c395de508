"""Fenced state changes of a chain run: the lease, step records, the final outcome.

A worker takes the run's lease with a conditional UPDATE that bumps ``lease_token``; every
later write on behalf of that attempt checks the token, so an attempt whose lease was taken
over (worker paused, partitioned or presumed dead) can never record anything.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, case, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from chains.graph import ITEM_BASE
from jobs import storable
from jobs.db import Sessions, rowcount
from jobs.models import ChainRun, ChainRunStatus, ChainStep, StepStatus

# Run and step statuses share these names (jobs.models: ChainRunStatus, StepStatus).
PENDING, RUNNING, SUCCEEDED, FAILED = (
    StepStatus.PENDING,
    StepStatus.RUNNING,
    StepStatus.SUCCEEDED,
    StepStatus.FAILED,
)
STOPPED_EMPTY, SKIPPED = StepStatus.STOPPED_EMPTY, StepStatus.SKIPPED
RUN_FINAL = frozenset({SUCCEEDED, FAILED, STOPPED_EMPTY})
OUTPUT_CAP = 200_000  # characters of a stored step output


def arq_job_id(run_id: str, n: int) -> str:
    """The arq id of the n-th enqueue of a run (never reused: arq refuses a known id)."""
    return f"chain:{run_id}:{n}"


def enqueue_number(arq_id: str | None) -> int:
    """``n`` of an id made by :func:`arq_job_id` (-1 when never enqueued)."""
    if not arq_id:
        return -1
    try:
        return int(arq_id.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 0


class LeaseLost(RuntimeError):
    """Another worker holds this run now; this attempt must stop without writing."""


@dataclass
class Lease:
    run_id: str
    token: int
    owner: str
    #: earlier attempts of the run whose lease was taken from them (worker died or stalled)
    lost: int = 0


async def take_lease(
    sm: Sessions, run_id: str, owner: str, lease_sec: float, *, arq_id: str | None = None
) -> Lease | None:
    """Lease a queued run, a run whose lease expired, or one this worker already holds.
    Taking a ``running`` run's lease means its attempt was lost: counted in ``lost_runs``.
    ``arq_id``: the queue entry asking; only the run's latest enqueue may take it (an older
    entry, redelivered after a take-over or a hand-back, is superseded)."""
    now = time.time()
    latest = [] if arq_id is None else [ChainRun.arq_job_id == arq_id]
    async with sm() as s:
        res = await s.execute(
            update(ChainRun)
            .where(
                ChainRun.id == run_id,
                ChainRun.status.in_((ChainRunStatus.QUEUED, ChainRunStatus.RUNNING)),
                or_(
                    ChainRun.lease_expires_at.is_(None),
                    ChainRun.lease_expires_at < now,
                    ChainRun.lease_owner == owner,
                ),
                *latest,
            )
            .values(
                status=ChainRunStatus.RUNNING,
                lease_owner=owner,
                lease_token=ChainRun.lease_token + 1,
                lease_expires_at=now + lease_sec,
                lost_runs=ChainRun.lost_runs
                + case((ChainRun.status == ChainRunStatus.RUNNING, 1), else_=0),
            )
        )
        if rowcount(res) != 1:
            await s.rollback()
            return None
        token, lost = (
            await s.execute(
                select(ChainRun.lease_token, ChainRun.lost_runs).where(ChainRun.id == run_id)
            )
        ).one()
        await s.execute(
            update(ChainRun)
            .where(ChainRun.id == run_id, ChainRun.started_at.is_(None))
            .values(started_at=now)
        )
        await s.commit()
    return Lease(run_id, token, owner, lost)


async def hand_back(sm: Sessions, lease: Lease) -> int | None:
    """Give a run this attempt holds back to the queue (the worker is stopping): ``queued``
    again, not counted as lost. The number of its next enqueue, or None when the lease was
    no longer this attempt's."""
    async with sm() as s:
        old = await s.scalar(select(ChainRun.arq_job_id).where(ChainRun.id == lease.run_id))
        n = enqueue_number(old) + 1
        res = await s.execute(
            update(ChainRun)
            .where(
                ChainRun.id == lease.run_id,
                ChainRun.lease_token == lease.token,
                ChainRun.status == ChainRunStatus.RUNNING,
            )
            .values(
                status=ChainRunStatus.QUEUED,
                lease_owner=None,
                lease_expires_at=None,
                arq_job_id=arq_job_id(lease.run_id, n),
            )
        )
        await s.commit()
    return n if rowcount(res) == 1 else None


async def stale_owners(sm: Sessions, before: float, *, exclude: str) -> list[str]:
    """Workers other than ``exclude`` holding a running chain run whose lease expires before
    ``before`` (renewed longer ago than a live worker would let it be)."""
    async with sm() as s:
        rows = await s.scalars(
            select(ChainRun.lease_owner)
            .where(
                ChainRun.status == ChainRunStatus.RUNNING,
                ChainRun.lease_expires_at < before,
                ChainRun.lease_owner.is_not(None),
                ChainRun.lease_owner != exclude,
            )
            .distinct()
        )
        return sorted(o for o in rows if o)


async def take_over(sm: Sessions, owners: set[str], before: float) -> list[tuple[str, int]]:
    """End the leases of ``owners``' running runs last renewed before ``before - lease``
    (their worker is presumed dead), each with a new enqueue number: (run id, number). A
    run whose lease or enqueue changed meanwhile is left alone (fenced)."""
    if not owners:
        return []
    async with sm() as s:
        rows = (
            await s.execute(
                select(ChainRun.id, ChainRun.lease_token, ChainRun.arq_job_id).where(
                    ChainRun.status == ChainRunStatus.RUNNING,
                    ChainRun.lease_owner.in_(sorted(owners)),
                    ChainRun.lease_expires_at < before,
                )
            )
        ).all()
    out: list[tuple[str, int]] = []
    for run_id, token, old in rows:
        n = enqueue_number(old) + 1
        same_enqueue = (
            ChainRun.arq_job_id.is_(None) if old is None else (ChainRun.arq_job_id == old)
        )
        async with sm() as s:
            res = await s.execute(
                update(ChainRun)
                .where(
                    ChainRun.id == run_id,
                    ChainRun.lease_token == token,
                    ChainRun.status == ChainRunStatus.RUNNING,
                    ChainRun.lease_owner.in_(sorted(owners)),
                    ChainRun.lease_expires_at < before,
                    same_enqueue,
                )
                # no owner: found once (stale_owners), free for the next attempt
                .values(lease_owner=None, lease_expires_at=0.0, arq_job_id=arq_job_id(run_id, n))
            )
            await s.commit()
        if rowcount(res) == 1:
            out.append((run_id, n))
    return out


async def _fence(s: AsyncSession, lease: Lease, lease_sec: float | None = None) -> None:
    values: dict[str, Any] = {"lease_owner": lease.owner}
    if lease_sec is not None:
        values["lease_expires_at"] = time.time() + lease_sec
    res = await s.execute(
        update(ChainRun)
        .where(ChainRun.id == lease.run_id, ChainRun.lease_token == lease.token)
        .values(**values)
    )
    if rowcount(res) != 1:
        await s.rollback()
        raise LeaseLost(f"chain run {lease.run_id}: lease taken over")


async def renew(sm: Sessions, lease: Lease, lease_sec: float) -> None:
    async with sm() as s:
        await _fence(s, lease, lease_sec)
        await s.commit()


async def ensure_steps(sm: Sessions, lease: Lease, steps: list[tuple[str, str]]) -> list[ChainStep]:
    """The run's step records, creating the missing ones as ``pending``."""
    async with sm() as s:
        await _fence(s, lease)
        have = {
            st.idx: st
            for st in (
                await s.execute(select(ChainStep).where(ChainStep.run_id == lease.run_id))
            ).scalars()
        }
        for i, (step_id, skill) in enumerate(steps):
            if i not in have:
                row = ChainStep(run_id=lease.run_id, idx=i, step_id=step_id, skill=skill)
                s.add(row)
                have[i] = row
        await s.commit()
    return [have[i] for i in sorted(have)]


async def ensure_items(
    sm: Sessions, lease: Lease, idx: list[int], step_id: str, skill: str
) -> dict[int, ChainStep]:
    """The item rows ``idx`` of a for_each step (``chains.graph.item_idx``), creating the
    missing ones as ``pending`` (``<step_id>[<item>]``): row index → row."""
    async with sm() as s:
        await _fence(s, lease)
        have = {
            st.idx: st
            for st in (
                await s.execute(
                    select(ChainStep).where(
                        ChainStep.run_id == lease.run_id,
                        ChainStep.idx >= min(idx, default=0),
                        ChainStep.idx <= max(idx, default=0),
                    )
                )
            ).scalars()
        }
        new = [
            ChainStep(
                run_id=lease.run_id,
                idx=i,
                step_id=f"{step_id}[{i % ITEM_BASE}]",
                skill=skill,
            )
            for i in idx
            if i not in have
        ]
        s.add_all(new)
        await s.commit()
        have.update({row.idx: row for row in new})
    return have


def _storable_values(values: dict[str, Any]) -> dict[str, Any]:
    """Step and run values fit for their columns (``jobs.storable``): texts escaped and
    capped, JSON values escaped and JSON-typed."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, str):
            out[key] = storable.text(value)
        elif isinstance(value, dict | list | tuple):
            out[key] = storable.json_value(value)
        else:
            out[key] = value
    return out


async def set_step(sm: Sessions, lease: Lease, idx: int, **values: Any) -> None:
    values = _storable_values(values)
    async with sm() as s:
        await _fence(s, lease)
        await s.execute(
            update(ChainStep)
            .where(ChainStep.run_id == lease.run_id, ChainStep.idx == idx)
            .values(**values)
        )
        await s.commit()


async def set_steps(sm: Sessions, lease: Lease, rows: list[tuple[int, dict[str, Any]]]) -> None:
    """:func:`set_step` for many rows (for_each items) in one fenced transaction; every row
    sets the same columns."""
    if not rows:
        return
    names = sorted(rows[0][1])
    params = [
        {"b_idx": idx, **{f"b_{k}": v for k, v in _storable_values(values).items()}}
        for idx, values in rows
    ]
    table: Any = ChainStep.__table__  # Core: an executemany UPDATE keyed by idx, not by id
    stmt = (
        update(table)
        .where(table.c.run_id == lease.run_id, table.c.idx == bindparam("b_idx"))
        .values({k: bindparam(f"b_{k}", type_=table.c[k].type) for k in names})
    )
    async with sm() as s:
        await _fence(s, lease)
        await s.execute(stmt, params)
        await s.commit()


async def skip_rest(sm: Sessions, lease: Lease, after: int) -> None:
    async with sm() as s:
        await _fence(s, lease)
        await s.execute(
            update(ChainStep)
            .where(
                ChainStep.run_id == lease.run_id,
                ChainStep.idx > after,
                ChainStep.status.in_((PENDING, RUNNING)),
            )
            .values(status=SKIPPED)
        )
        await s.commit()


async def finish(
    sm: Sessions,
    lease: Lease,
    status: str,
    *,
    error: str | None = None,
    result: dict[str, Any] | None = None,
) -> None:
    error, result = storable.text(error), storable.result(result)
    async with sm() as s:
        await _fence(s, lease)
        await s.execute(
            update(ChainRun)
            .where(ChainRun.id == lease.run_id)
            .values(
                status=status,
                error=error,
                result=result,
                finished_at=time.time(),
                lease_expires_at=None,
            )
        )
        await s.commit()


async def set_result(sm: Sessions, lease: Lease, result: dict[str, Any]) -> None:
    result = storable.result(result) or {}
    async with sm() as s:
        await _fence(s, lease)
        await s.execute(update(ChainRun).where(ChainRun.id == lease.run_id).values(result=result))
        await s.commit()


def cap_output(value: Any) -> Any:
    """A step output fit for its record: whole when small, else a marked summary."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= OUTPUT_CAP:
        return value
    return {
        "_truncated": True,
        "chars": len(text),
        "keys": list(value)[:20] if isinstance(value, dict) else None,
        "preview": text[:2000],
    }
