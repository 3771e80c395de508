"""What the workers page shows of a worker (concurrency, processed/failed counts, RSS,
start time, version, from its heartbeat) and ``forget`` of a stopped one (audited)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from delivery import notices
from delivery.pipeline import postprocess
from jobs.models import OpsAction, Worker
from jobs.queue import worker_control
from tests.helpers.jobs import dispatch, drain

pytestmark = pytest.mark.integration


@pytest.mark.slow
async def test_vitals_then_forget(services):
    await dispatch(services, "bg_sleep", {"seconds": 0})
    await dispatch(services, "bg_envfail")
    await drain(services)
    [w] = await worker_control.list_workers(services)
    assert w["state"] == "stopped"
    assert w["started_at"] <= time.time()
    assert w["concurrency"] in (None, services.settings.worker_max_jobs)

    with pytest.raises(worker_control.WorkerControlError, match="no worker"):
        await worker_control.forget(services, "nope", actor="ops")
    done = await worker_control.forget(services, w["id"], actor="ops")
    assert done["forgotten"] is True
    assert await worker_control.list_workers(services) == []
    async with services.sessionmaker() as s:
        acts = (await s.scalars(select(OpsAction.action))).all()
    assert "worker.forget" in acts


@pytest.mark.slow
async def test_a_live_worker_is_not_forgotten(services):
    async with services.sessionmaker() as s:
        s.add(Worker(id="w-live", host="h", pid=1, last_heartbeat=time.time()))
        await s.commit()
    with pytest.raises(worker_control.WorkerControlError, match="alive"):
        await worker_control.forget(services, "w-live", actor="ops")


@pytest.mark.slow
async def test_heartbeat_carries_the_vitals(services):
    from jobs.queue import broker
    from jobs.queue.runner import JobRunner

    runner = JobRunner(
        services, services.executor, "w-vitals", finisher=postprocess, notices=notices
    )
    runner.concurrency, runner.processed, runner.failed = 4, 7, 2
    await runner.heartbeat_once()
    [beat] = await broker.heartbeats(services, ["w-vitals"])
    assert beat["concurrency"] == 4 and beat["processed"] == 7 and beat["failed"] == 2
    assert beat["rss_bytes"] > 0 and beat["version"] and beat["started_at"] <= time.time()
    [w] = [x for x in await worker_control.list_workers(services) if x["id"] == "w-vitals"]
    assert w["state"] == "alive" and w["processed"] == 7 and w["concurrency"] == 4
