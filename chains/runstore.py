"""Fenced state changes of a chain run: the lease, step records, the final outcome.

A worker takes the run's lease with a conditional UPDATE that bumps ``lease_token``; every
later write on behalf of that attempt checks the token, so an attempt whose lease was taken
over (worker paused, partitioned or presumed dead) can never record anything. The lease is
the one jobs have (:mod:`jobs.queue.lease`), on the ``chain_runs`` table.
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
from jobs.db import Sessions
from jobs.models import ChainRun, ChainRunStatus, ChainStep, StepStatus
from jobs.queue.lease import Leases, table_of, write_fenced

#: the leases of chain runs (``jobs.queue.lease``, as for jobs)
LEASES = Leases(table_of(ChainRun), ChainRunStatus.RUNNING)
# the run statuses its delivery tells apart (``chains.deliver``)
FAILED, STOPPED_EMPTY = ChainRunStatus.FAILED, ChainRunStatus.STOPPED_EMPTY
RUN_FINAL = frozenset(
    {ChainRunStatus.SUCCEEDED, ChainRunStatus.FAILED, ChainRunStatus.STOPPED_EMPTY}
)
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
    c = LEASES.table.c
    latest = [] if arq_id is None else [c.arq_job_id == arq_id]
    claim = LEASES.claim(
        c.id == run_id,
        c.status.in_((ChainRunStatus.QUEUED, ChainRunStatus.RUNNING)),
        or_(c.lease_expires_at.is_(None), c.lease_expires_at < now, c.lease_owner == owner),
        *latest,
        owner=owner,
        expires=now + lease_sec,
        lost_runs=c.lost_runs + case((c.status == ChainRunStatus.RUNNING, 1), else_=0),
    )
    async with sm() as s:
        if not await write_fenced(s, claim):
            return None
        token, lost = (
            await s.execute(select(c.lease_token, c.lost_runs).where(c.id == run_id))
        ).one()
        await s.execute(
            update(ChainRun)
            .where(ChainRun.id == run_id, ChainRun.started_at.is_(None))
            .values(started_at=now)
        )
        await s.commit()
    return Lease(run_id, token, owner, lost)


async def hand_back(sm: Sessions, held: Lease) -> int | None:
    """Give a run this attempt holds back to the queue (the worker is stopping): ``queued``
    again, not counted as lost. The number of its next enqueue, or None when the lease was
    no longer this attempt's."""
    async with sm() as s:
        old = await s.scalar(select(ChainRun.arq_job_id).where(ChainRun.id == held.run_id))
        n = enqueue_number(old) + 1
        release = LEASES.release(
            held.run_id,
            held.token,
            status=ChainRunStatus.QUEUED,
            arq_job_id=arq_job_id(held.run_id, n),
        )
        if not await write_fenced(s, release):
            return None
        await s.commit()
    return n


async def stale_owners(sm: Sessions, before: float, *, exclude: str) -> list[str]:
    """Workers other than ``exclude`` holding a running chain run whose lease expires before
    ``before`` (renewed longer ago than a live worker would let it be)."""
    return await LEASES.stale_owners(sm, before, exclude=exclude)


async def take_over(sm: Sessions, owners: set[str], before: float) -> list[tuple[str, int]]:
    """End the leases of ``owners``' running runs last renewed before ``before - lease``
    (their worker is presumed dead), each with a new enqueue number: (run id, number). A
    run whose lease or enqueue changed meanwhile is left alone (fenced)."""
    if not owners:
        return []
    c = LEASES.table.c
    expired = LEASES.expired(before, owners)
    async with sm() as s:
        rows = (await s.execute(select(c.id, c.lease_token, c.arq_job_id).where(*expired))).all()
    out: list[tuple[str, int]] = []
    for run_id, token, old in rows:
        n = enqueue_number(old) + 1
        same_enqueue = c.arq_job_id.is_(None) if old is None else (c.arq_job_id == old)
        # no owner: found once (stale_owners), free for the next attempt
        ended = (
            LEASES.fenced(run_id, token)
            .where(*expired, same_enqueue)
            .values(lease_owner=None, lease_expires_at=0.0, arq_job_id=arq_job_id(run_id, n))
        )
        async with sm() as s:
            if await write_fenced(s, ended):
                await s.commit()
                out.append((run_id, n))
    return out


async def _fence(s: AsyncSession, held: Lease, lease_sec: float | None = None) -> None:
    """Every write of the attempt: checks (and renews, with ``lease_sec``) its lease in the
    write's own transaction, whatever the run's status."""
    values: dict[str, object] = {"lease_owner": held.owner}
    if lease_sec is not None:
        values["lease_expires_at"] = time.time() + lease_sec
    if not await write_fenced(
        s, LEASES.fenced(held.run_id, held.token, running=False).values(values)
    ):
        raise LeaseLost(f"chain run {held.run_id}: lease taken over")


async def renew(sm: Sessions, held: Lease, lease_sec: float) -> None:
    async with sm() as s:
        await _fence(s, held, lease_sec)
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
                ChainStep.status.in_((StepStatus.PENDING, StepStatus.RUNNING)),
            )
            .values(status=StepStatus.SKIPPED)
        )
        await s.commit()


async def finish(
    sm: Sessions,
    lease: Lease,
    status: ChainRunStatus,
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


def cap_output(value: object) -> object:
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
