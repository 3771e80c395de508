"""Claim ahead (jobs.queue.prefetch): a worker leases a few jobs beyond its free slots.
A job claimed ahead is an ordinary leased job that has not started: it waits for a slot,
runs once, can be cancelled, goes back to the queue unstarted when the worker stops or it
waits too long, is re-run by a peer when its worker is killed, and counts against the
concurrency limits; a second worker gets work while the first holds a full prefetch."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from delivery import notices
from jobs.models import Job
from jobs.queue import broker, control, prefetch, store
from jobs.queue.prefetch import StartGate
from jobs.queue.worker import SkillJobsWorker, build_worker
from jobs.services import Services
from tests.helpers.jobs import dispatch, drain, job_and_attempts, wait_status
from tests.helpers.workers import WorkerProcess, pid_of

# --- the gate alone ------------------------------------------------------------------------


async def test_slots_go_to_the_lowest_priority_number_then_in_order():
    gate = StartGate(1, ahead_sec=0.1, hold_sec=60)
    assert await gate.enter("running", 5) == prefetch.START
    order: list[str] = []

    async def wait(key: str, prio: int) -> None:
        assert await gate.enter(key, prio) == prefetch.START
        order.append(key)
        gate.leave()

    tasks = [asyncio.create_task(wait(k, p)) for k, p in (("b", 5), ("c", 5), ("a", 0))]
    await asyncio.sleep(0.01)
    assert gate.waiting == 3 and order == []
    gate.leave()
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "c"]
    assert gate.free == 1


async def test_a_refused_waiter_does_not_take_a_slot_and_a_cancelled_one_passes_it_on():
    gate = StartGate(1, ahead_sec=0.1, hold_sec=60)
    assert await gate.enter("running", 5) == prefetch.START
    refused = asyncio.create_task(gate.enter("x", 5))
    cancelled = asyncio.create_task(gate.enter("y", 5))
    last = asyncio.create_task(gate.enter("z", 5))
    await asyncio.sleep(0.01)
    assert gate.refuse("x", prefetch.CANCEL) and await refused == prefetch.CANCEL
    gate.leave()  # the slot goes to y ...
    cancelled.cancel()  # ... cancelled before it could resume: z gets it
    with contextlib.suppress(asyncio.CancelledError):
        await cancelled
    assert await last == prefetch.START
    assert gate.free == 0 and gate.waiting == 0


async def test_depth_follows_the_rate_slots_free_at_and_an_expiry_resets_it():
    gate = StartGate(10, ahead_sec=0.5, hold_sec=0.05)
    assert gate.depth() == 0  # nothing has finished yet: nothing claimed ahead
    for _ in range(10):
        assert await gate.enter("j", 5) == prefetch.START
    for _ in range(10):
        gate.leave()
    assert gate.depth() == 4  # ~10 slots freed within the last second × 0.5 s
    for _ in range(10):
        assert await gate.enter("j", 5) == prefetch.START
    waiter = asyncio.create_task(gate.enter("k", 5))
    await asyncio.sleep(0.1)
    assert gate.expire() == 1 and await waiter == prefetch.HOLD
    assert gate.depth() == 0  # slots free slower than measured: nothing ahead for now
    gate.close()
    assert await gate.enter("late", 5) == prefetch.STOP and gate.depth() == 0


# --- a worker in this process --------------------------------------------------------------


async def _worker_with_prefetch(svc: Services, max_jobs: int, **kw: Any) -> SkillJobsWorker:
    """A worker that has run one job, so it measures slots freeing and claims ahead (a long
    ``ahead_sec``: as many as it has slots, for the next seconds)."""
    svc.settings.worker_prefetch_sec = 1000.0
    w = build_worker(svc, handle_signals=False, scheduler=False, max_jobs=max_jobs, **kw)
    warm = await dispatch(svc, "bg_sleep", {"seconds": 0})
    w.main_task = asyncio.create_task(w.async_run())
    await wait_status(svc, warm, {"succeeded"})
    assert w.runner is not None and w.runner.gate is not None
    deadline = time.monotonic() + 10
    while w.runner.gate.depth() < max_jobs:
        assert time.monotonic() < deadline, "no slot freed"
        await asyncio.sleep(0.02)
    return w


async def _stop(w: SkillJobsWorker) -> None:
    await w.close()
    if w.main_task is not None:
        w.main_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await w.main_task


async def _claimed_ahead(w: SkillJobsWorker, job_id: str, limit: float = 20.0) -> None:
    assert w.runner is not None and w.runner.gate is not None
    deadline = time.monotonic() + limit
    while not w.runner.gate.holds(job_id):
        assert time.monotonic() < deadline, "never claimed ahead"
        await asyncio.sleep(0.02)


async def _running(w: SkillJobsWorker, job_id: str, limit: float = 20.0) -> None:
    """Wait until ``job_id``'s skill runs on ``w`` (so a job dispatched next waits for the
    slot: entries enqueued within one millisecond are claimed in no set order)."""
    assert w.runner is not None
    deadline = time.monotonic() + limit
    while job_id not in w.runner.inner:
        assert time.monotonic() < deadline, "never started"
        await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_a_job_claimed_ahead_is_leased_waits_for_the_slot_and_runs_once(services, tmp_path):
    w = await _worker_with_prefetch(services, 1)
    try:
        marks = tmp_path / "ran"
        first = await dispatch(services, "bg_sleep", {"seconds": 1.0, "marker": str(marks)})
        await _running(w, first)
        ahead = await dispatch(services, "bg_sleep", {"seconds": 0, "marker": str(marks)})
        await _claimed_ahead(w, ahead)
        job = await store.get_job(services.sessionmaker, ahead)
        assert job.status == "running" and job.lease_owner == w.runner.worker_id  # leased
        assert (await store.get_job(services.sessionmaker, first)).status == "running"
        assert not marks.exists()  # ... but not started: the one slot is busy
        for job_id in (first, ahead):
            done = await wait_status(services, job_id, {"succeeded", "failed"})
            assert done.status == "succeeded" and done.attempts == 1
        assert len(marks.read_text().split()) == 2  # each ran once
    finally:
        await _stop(w)


@pytest.mark.slow
async def test_cancelling_a_job_claimed_ahead_ends_it_cancelled_without_running(services, tmp_path):
    w = await _worker_with_prefetch(services, 1)
    try:
        marker = tmp_path / "ran"
        first = await dispatch(services, "bg_sleep", {"seconds": 1.5})
        await _running(w, first)
        ahead = await dispatch(services, "bg_sleep", {"seconds": 0, "marker": str(marker)})
        await _claimed_ahead(w, ahead)
        res = await control.cancel_job(services, ahead, notices=notices)
        assert res.ok and res.status == "running"  # leased: its worker is asked to stop it
        job = await wait_status(services, ahead, {"cancelled", "succeeded"}, limit=10)
        assert job.status == "cancelled"
        assert (await store.get_job(services.sessionmaker, first)).status == "running"
        _, attempts = await job_and_attempts(services, ahead)
        assert [a.outcome for a in attempts] == ["cancelled"]
        assert (await wait_status(services, first, {"succeeded"})).attempts == 1
        assert not marker.exists()  # never ran
    finally:
        await _stop(w)


@pytest.mark.slow
async def test_stopping_gives_jobs_claimed_ahead_back_unstarted(services, tmp_path):
    w = await _worker_with_prefetch(services, 1)
    marker = tmp_path / "ran"
    try:
        await _running(w, await dispatch(services, "bg_sleep", {"seconds": 0.5}))
        ahead = await dispatch(services, "bg_sleep", {"seconds": 0, "marker": str(marker)})
        await _claimed_ahead(w, ahead)
    finally:
        await _stop(w)
    job, attempts = await job_and_attempts(services, ahead)
    # queued again as if never claimed: no attempt, no start, its entry back in Redis
    assert job.status == "queued" and job.attempts == 0 and job.started_at is None
    assert attempts == [] and not marker.exists()
    assert await broker.waiting(services, [job.arq_job_id]) == [True]
    await drain(services)
    job, attempts = await job_and_attempts(services, ahead)
    assert job.status == "succeeded" and [a.outcome for a in attempts] == ["succeeded"]
    assert marker.read_text().split()  # ran once, by the next worker


@pytest.mark.slow
async def test_a_job_kept_waiting_too_long_goes_back_to_the_queue(services):
    w = await _worker_with_prefetch(services, 1)
    assert w.runner is not None and w.runner.gate is not None
    w.runner.gate.hold_sec = 0.5
    try:
        first = await dispatch(services, "bg_sleep", {"seconds": 3.0})
        await _running(w, first)
        ahead = await dispatch(services, "bg_sleep", {"seconds": 0})
        await _claimed_ahead(w, ahead)
        job = await wait_status(services, ahead, {"queued"}, limit=5)
        assert job.attempts == 0 and (await job_and_attempts(services, ahead))[1] == []
        assert (await store.get_job(services.sessionmaker, first)).status == "running"
        for job_id in (first, ahead):
            assert (await wait_status(services, job_id, {"succeeded"})).attempts == 1
    finally:
        await _stop(w)


@pytest.mark.slow
async def test_a_second_worker_gets_work_while_the_first_holds_a_full_prefetch(services):
    a = await _worker_with_prefetch(services, 2, worker_id="worker-a")
    b: SkillJobsWorker | None = None
    try:
        ids = [await dispatch(services, "bg_sleep", {"seconds": 2.0}) for _ in range(6)]
        assert a.runner is not None and a.runner.gate is not None
        deadline = time.monotonic() + 20
        while a.runner.gate.waiting < 2:  # 2 running, 2 claimed ahead
            assert time.monotonic() < deadline, "the first worker never filled its prefetch"
            await asyncio.sleep(0.02)
        assert a.job_counter == 4  # bounded: 2 slots + at most 2 ahead
        b = build_worker(services, handle_signals=False, scheduler=False, max_jobs=2)
        b.main_task = asyncio.create_task(b.async_run())
        assert b.runner is not None
        jobs: list[Any] = []
        deadline = time.monotonic() + 20
        while True:
            jobs = [await store.get_job(services.sessionmaker, j) for j in ids]
            on_b = [j for j in jobs if j.lease_owner == b.runner.worker_id]
            if len(on_b) == 2:
                break
            assert time.monotonic() < deadline, "the second worker got nothing"
            await asyncio.sleep(0.02)
        assert all(j.status != "succeeded" for j in jobs)  # before the first's jobs ended
        for job_id in ids:
            assert (await wait_status(services, job_id, {"succeeded"})).attempts == 1
    finally:
        await _stop(a)
        if b is not None:
            await _stop(b)


@pytest.mark.slow
async def test_limits_count_jobs_claimed_ahead(services):
    """``skill:bg_sleep`` 2 with 5 slots and a deep prefetch: jobs leased (running or
    claimed ahead) never exceed the limit."""
    services.settings.limits = {"skill:bg_sleep": 2}
    w = await _worker_with_prefetch(services, 5)
    assert w.runner is not None and w.runner.gate is not None
    try:
        ids = [await dispatch(services, "bg_sleep", {"seconds": 0.3}) for _ in range(8)]
        peak = 0
        deadline = time.monotonic() + 60
        while True:
            async with services.sessionmaker() as s:
                running = await s.scalar(
                    select(func.count()).where(Job.id.in_(ids), Job.status == "running")
                )
                left = await s.scalar(
                    select(func.count()).where(Job.id.in_(ids), Job.status != "succeeded")
                )
            held = w.job_counter  # entries this worker holds: running and claimed ahead
            peak = max(peak, running or 0, held)
            assert (running or 0) <= 2 and held <= 2, (running, held)
            if not left:
                break
            assert time.monotonic() < deadline, f"{left} jobs never finished"
            await asyncio.sleep(0.01)
        assert peak == 2
    finally:
        await _stop(w)


# --- a real worker process, killed ---------------------------------------------------------


async def _all_running(services: Services, ids: list[str]) -> list[Any]:
    deadline = time.monotonic() + 30
    while True:
        jobs = [await store.get_job(services.sessionmaker, j) for j in ids]
        if all(j is not None and j.status == "running" for j in jobs):
            return jobs
        assert time.monotonic() < deadline, [j.status for j in jobs if j is not None]
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_killed_workers_jobs_claimed_ahead_are_rerun_by_a_peer(
    services, job_settings, tmp_path
):
    # depth = rate x ahead_sec, the rate decaying with a 1 s time constant from the warm
    # job's end: 1e15 s keeps two jobs leased ahead for ~34 s, however slowly a loaded
    # host gets the next four dispatched
    env = {"SKILLJOBS_WORKER_PREFETCH_SEC": "1e15"}
    args = ("--no-scheduler", "--max-jobs", "2")
    victim = WorkerProcess(job_settings, tmp_path / "victim.log", *args, **env)
    survivor: WorkerProcess | None = None
    try:
        warm = await dispatch(services, "bg_sleep", {"seconds": 0})
        await wait_status(services, warm, {"succeeded"}, limit=60)
        marker = Path(tmp_path / "ran")
        # two long ones fill the victim's slots, two more are claimed ahead
        # (running before the next two are dispatched: entries queued within the same
        # millisecond are claimed in no particular order)
        busy = [await dispatch(services, "bg_sleep", {"seconds": 3}) for _ in range(2)]
        await _all_running(services, busy)
        ahead = [
            await dispatch(services, "bg_sleep", {"seconds": 0, "marker": str(marker)})
            for _ in range(2)
        ]
        jobs = await _all_running(services, ahead)
        assert {pid_of(j.lease_owner) for j in jobs} == {victim.pid}
        assert not marker.exists()  # leased, not started
        victim.signal(signal.SIGKILL)
        survivor = WorkerProcess(job_settings, tmp_path / "survivor.log", *args)
        for job_id in ahead + busy:
            job = await wait_status(services, job_id, {"succeeded", "failed"}, limit=90)
            assert job.status == "succeeded"
            _, attempts = await job_and_attempts(services, job_id)
            assert [a.outcome for a in attempts] == ["lost", "succeeded"]
        assert marker.read_text().split() == [str(survivor.pid)] * 2  # run once, by the peer
    finally:
        victim.stop()
        if survivor is not None:
            survivor.stop()
