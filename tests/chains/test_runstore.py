"""Fenced state changes of chain runs on PostgreSQL and SQLite: a take-over ends a dead
owner's lease and gives the run a new enqueue, the next attempt counts the lost one and
fences the old attempt out; a hand-back is not a loss; only the run's latest queue entry
may take its lease."""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import update

from chains import runstore as rs
from jobs.models import ChainRun, ChainRunStatus, Schedule, StepStatus


@pytest.fixture
async def run_id(sessionmaker) -> str:  # type: ignore[no-untyped-def]
    sched = Schedule(name=f"s-{uuid.uuid4().hex[:6]}", cron="0 9 * * *", steps=[{"skill": "echo"}])
    async with sessionmaker() as s:
        s.add(sched)
        await s.flush()
        run = ChainRun(
            schedule_id=sched.id,
            fire_key=f"manual:{uuid.uuid4().hex}",
            fire_at=time.time(),
            status="queued",
            arq_job_id=rs.arq_job_id("x", 0),
        )
        s.add(run)
        await s.commit()
        run.arq_job_id = rs.arq_job_id(run.id, 0)
        await s.commit()
        return run.id


async def _row(sm, run_id: str) -> ChainRun:  # type: ignore[no-untyped-def]
    async with sm() as s:
        row = await s.get(ChainRun, run_id)
    assert row is not None
    return row


async def test_take_over_of_a_dead_owner(sessionmaker, run_id) -> None:  # type: ignore[no-untyped-def]
    sm = sessionmaker
    first = await rs.take_lease(sm, run_id, "w1", 30, arq_id=rs.arq_job_id(run_id, 0))
    assert first is not None and first.token == 1 and first.lost == 0
    await rs.ensure_steps(sm, first, [("a", "echo")])
    # w1 renewed 20 s ago (lease until now + 10): a peer presuming it dead after 8.5 s
    # takes over leases expiring before now + 30 - 8.5.
    async with sm() as s:
        await s.execute(
            update(ChainRun).where(ChainRun.id == run_id).values(lease_expires_at=time.time() + 10)
        )
        await s.commit()
    before = time.time() + 30 - 8.5
    assert await rs.stale_owners(sm, before, exclude="w2") == ["w1"]
    assert await rs.stale_owners(sm, before, exclude="w1") == []
    assert await rs.take_over(sm, {"w1"}, time.time()) == []  # renewed too recently for that
    assert await rs.take_over(sm, {"w1"}, before) == [(run_id, 1)]
    assert await rs.take_over(sm, {"w1"}, before) == []  # once
    # the dead owner's old queue entry is superseded; the new one takes it, counting the loss
    assert await rs.take_lease(sm, run_id, "w2", 30, arq_id=rs.arq_job_id(run_id, 0)) is None
    second = await rs.take_lease(sm, run_id, "w2", 30, arq_id=rs.arq_job_id(run_id, 1))
    assert second is not None and second.token == 2 and second.lost == 1
    with pytest.raises(rs.LeaseLost):  # the old attempt can record nothing
        await rs.set_step(sm, first, 0, status=StepStatus.SUCCEEDED)
    with pytest.raises(rs.LeaseLost):
        await rs.finish(sm, first, ChainRunStatus.SUCCEEDED)
    await rs.set_step(sm, second, 0, status=StepStatus.SUCCEEDED)
    await rs.finish(sm, second, ChainRunStatus.SUCCEEDED)
    row = await _row(sm, run_id)
    assert row.status == "succeeded" and row.lost_runs == 1


async def test_a_hand_back_is_not_a_loss(sessionmaker, run_id) -> None:  # type: ignore[no-untyped-def]
    sm = sessionmaker
    first = await rs.take_lease(sm, run_id, "w1", 30)
    assert first is not None
    assert await rs.hand_back(sm, first) == 1
    assert await rs.hand_back(sm, first) is None  # no longer this attempt's
    row = await _row(sm, run_id)
    assert row.status == "queued" and row.lease_owner is None
    assert row.arq_job_id == rs.arq_job_id(run_id, 1)
    second = await rs.take_lease(sm, run_id, "w2", 30, arq_id=rs.arq_job_id(run_id, 1))
    assert second is not None and second.lost == 0 and second.token == 2
    with pytest.raises(rs.LeaseLost):
        await rs.renew(sm, first, 30)
