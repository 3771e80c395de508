"""The arq worker end to end on SQLite and PostgreSQL with real Redis: outcomes, transient
re-runs and the breaker, cancellation, manual retry, fencing and Redis loss."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest
from sqlalchemy import update

from delivery import notices
from jobs.cli.embedded import EmbeddedRedis
from jobs.models import Job
from jobs.queue import control, store
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.worker import build_worker
from tests.helpers.jobs import TG, dispatch, drain, job_and_attempts, wait_status


@pytest.mark.slow
async def test_job_runs_once_and_is_recorded(services):
    job_id = await dispatch(services, "bg_sleep", {"seconds": 0.05})
    await drain(services)
    job, attempts = await job_and_attempts(services, job_id)
    assert job.status == "succeeded" and job.attempts == 1
    assert services.box.unseal(job.result)["message"] == "slept 0.05s"
    assert job.started_at and job.finished_at and job.duration_ms > 0
    assert [a.outcome for a in attempts] == ["succeeded"] and attempts[0].worker_id
    assert job.lease_owner is None


@pytest.mark.slow
async def test_transient_failure_is_rerun_until_it_works(services, tmp_path):
    job_id = await dispatch(services, "bg_flaky", {"counter": str(tmp_path / "n"), "fail_times": 2})
    await drain(services)
    job, attempts = await job_and_attempts(services, job_id)
    assert job.status == "succeeded" and job.attempts == 3
    assert [a.outcome for a in attempts] == ["failed", "failed", "succeeded"]
    assert "ConnectionError" in (attempts[0].error or "") or "refused" in (attempts[0].error or "")


@pytest.mark.slow
async def test_transient_failure_stops_after_three_runs(services, tmp_path):
    counter = tmp_path / "n"
    job_id = await dispatch(services, "bg_flaky", {"counter": str(counter), "fail_times": 99})
    await drain(services)
    job, attempts = await job_and_attempts(services, job_id)
    assert job.status == "failed" and job.attempts == 3 and len(attempts) == 3
    assert counter.read_text() == "3"
    assert "refused the connection" in job.error


@pytest.mark.slow
async def test_envelope_failure_is_not_rerun(services):
    job_id = await dispatch(services, "bg_envfail")
    await drain(services)
    job, attempts = await job_and_attempts(services, job_id)
    assert job.status == "failed" and job.attempts == 1 and len(attempts) == 1
    assert "no data for that day" in job.error


@pytest.mark.slow
async def test_circuit_breaker_runs_once_after_two_recent_failures(services, tmp_path):
    first = await dispatch(services, "bg_flaky", {"counter": str(tmp_path / "a"), "fail_times": 99})
    await drain(services)
    assert (await store.get_job(services.sessionmaker, first)).attempts == 3
    second = await dispatch(
        services, "bg_flaky", {"counter": str(tmp_path / "b"), "fail_times": 99}
    )
    await drain(services)
    job, _ = await job_and_attempts(services, second)
    assert job.status == "failed" and job.attempts == 1
    # another role is not affected by this role's breaker
    other = await dispatch(
        services,
        "bg_flaky",
        {"counter": str(tmp_path / "c"), "fail_times": 1},
        {**TG, "role_id": "r2"},
    )
    await drain(services)
    assert (await store.get_job(services.sessionmaker, other)).status == "succeeded"


@pytest.mark.slow
async def test_cancel_queued_job_never_starts(services, tmp_path):
    marker = tmp_path / "ran"
    job_id = await dispatch(services, "bg_sleep", {"marker": str(marker)})
    res = await control.cancel_job(services, job_id, notices=notices, actor="test")
    assert res.ok and res.status == "cancelled"
    await drain(services)
    job, attempts = await job_and_attempts(services, job_id)
    assert job.status == "cancelled" and job.attempts == 0 and attempts == []
    assert not marker.exists()
    again = await control.cancel_job(services, job_id, notices=notices)
    assert not again.ok and again.status_code == 409


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _working_in(folder: Path) -> list[int]:
    """Host processes whose working directory is ``folder``."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.readlink(f"/proc/{pid}/cwd") == str(folder):
                    found.append(int(pid))
            except OSError:
                continue
    return found


@pytest.mark.slow
async def test_cancel_running_job_kills_its_process_group(services):
    job_id = await dispatch(services, "bg_shell_sleep")
    w = build_worker(services, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    try:
        pids_file = services.settings.resolved_workspace_root / "r1" / "s-tg" / "pids"
        deadline = time.monotonic() + 30
        pids: list[int] = []
        while len(pids) < 2 and time.monotonic() < deadline:  # (created before written)
            await asyncio.sleep(0.05)
            if pids_file.exists():
                pids = [int(p) for p in pids_file.read_text().split()]
        # the pids it wrote are those of its own pid namespace (it runs sandboxed): on the
        # host, its processes are the ones working in its workspace
        assert len(pids) == 2, pids
        pids = _working_in(pids_file.parent)
        assert len(pids) >= 2 and all(_alive(p) for p in pids), pids
        res = await control.cancel_job(services, job_id, notices=notices, actor="test")
        assert res.ok and res.status == "running"
        job = await wait_status(services, job_id, {"cancelled"})
        assert job.error == "cancelled by an operator"
        deadline = time.monotonic() + 15  # SIGTERM, SIGKILL 2 s later, then their exit
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not any(_alive(p) for p in pids), "skill or its child survived the cancel"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.close()


@pytest.mark.slow
async def test_manual_retry_is_a_new_attempt_each_time(services):
    job_id = await dispatch(services, "bg_envfail")
    await drain(services)
    for n in (2, 3):
        res = await control.retry_job(services, job_id, actor="test")
        assert res.ok, res.message
        await drain(services)
        job, attempts = await job_and_attempts(services, job_id)
        assert job.status == "failed" and job.attempts == n and len(attempts) == n
    running = await dispatch(services, "bg_sleep")
    res = await control.retry_job(services, running)
    assert not res.ok and res.status_code == 409  # only finished jobs


@pytest.mark.slow
async def test_a_dead_attempt_cannot_record(services):
    """Fencing: once the lease is taken away, the old attempt's writes are refused."""
    job_id = await dispatch(services, "bg_sleep")
    claim = await store.claim(services.sessionmaker, job_id, 0, "worker-a", 30)
    assert claim is not None and claim.token == 1
    assert await store.claim(services.sessionmaker, job_id, 0, "worker-x", 30) is None
    async with services.sessionmaker() as s:
        await s.execute(
            update(Job).where(Job.id == job_id).values(lease_expires_at=time.time() - 1)
        )
        await s.commit()
    [(jid, new_token)] = await store.expire_leases(services.sessionmaker)
    assert jid == job_id and new_token == 2
    second = await store.claim(services.sessionmaker, job_id, new_token, "worker-b", 30)
    assert second is not None and second.token == 3
    # worker-a wakes up: nothing it does sticks
    assert not await store.holds_lease(services.sessionmaker, job_id, claim.token)
    assert not await store.finish(
        services.sessionmaker,
        job_id,
        claim.token,
        status="succeeded",
        result={"ok": True, "who": "a"},
        error=None,
        error_type=None,
    )
    assert await store.requeue(services.sessionmaker, job_id, claim.token, reason="x") is None
    assert await store.finish(
        services.sessionmaker,
        job_id,
        second.token,
        status="succeeded",
        result={"ok": True, "who": "b"},
        error=None,
        error_type=None,
    )
    job, attempts = await job_and_attempts(services, job_id)
    assert job.result == {"ok": True, "who": "b"} and job.attempts == 2
    assert [a.outcome for a in attempts] == ["lost", "succeeded"]


@pytest.mark.slow
async def test_jobs_lost_by_redis_are_reenqueued(job_settings, tmp_path):
    """Redis flushed (or restarted without persistence): the database still knows."""
    from jobs.services import Services

    with EmbeddedRedis(tmp_path / "own-redis", persist=False) as server:
        job_settings.redis_url = server.url
        svc = await Services.open(job_settings)
        try:
            ids = [await dispatch(svc, "bg_sleep", {"seconds": 0}) for _ in range(5)]
            await svc.redis.flushall()
            assert await svc.redis.zcard(job_settings.queue_name) == 0
            w = build_worker(svc, handle_signals=False, scheduler=False)
            task = asyncio.create_task(w.async_run())
            try:
                for job_id in ids:
                    job = await wait_status(svc, job_id, {"succeeded"}, limit=30)
                    assert job.attempts == 1
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await w.close()
        finally:
            await svc.close()


@pytest.mark.slow
async def test_worker_survives_a_redis_restart(job_settings, tmp_path):
    """Redis goes away and comes back empty: the worker keeps running and picks up new work
    (jobs Redis lost are covered by test_jobs_lost_by_redis_are_reenqueued)."""
    from jobs.cli.embedded import free_port
    from jobs.services import Services

    port = free_port()
    server = EmbeddedRedis(tmp_path / "r1", port=port, persist=False)
    job_settings.redis_url = server.start()
    svc = await Services.open(job_settings)
    w = build_worker(svc, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    try:
        first = await dispatch(svc, "bg_sleep", {"seconds": 0})
        await wait_status(svc, first, {"succeeded"})
        server.stop()
        await asyncio.sleep(2.5)  # polls fail meanwhile
        assert not task.done()
        server = EmbeddedRedis(tmp_path / "r2", port=port, persist=False)
        server.start()
        later = await dispatch(svc, "bg_sleep", {"seconds": 0})
        job = await wait_status(svc, later, {"succeeded"}, limit=30)
        assert job.attempts == 1 and not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.close()
        await svc.close()
        server.stop()


@pytest.mark.slow
async def test_unusable_arq_entries_are_dropped_and_tidied(services):
    """arq entries the worker cannot run (record expired, unknown function, undecodable)
    are logged and removed from Redis; the jobs around them run normally."""
    from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix

    redis, queue = services.redis, services.settings.queue_name
    good = await dispatch(services, "bg_sleep", {"seconds": 0.01})
    await redis.enqueue_job("no_such_function", _job_id="unknown-fn", _queue_name=queue)
    await redis.zadd(queue, {"expired": 1})  # in the queue, its record gone
    await redis.set(job_key_prefix + "garbage", b"\x00not a pickle")
    await redis.zadd(queue, {"garbage": 1})
    await drain(services)
    job, _ = await job_and_attempts(services, good)
    assert job.status == "succeeded"
    assert await redis.zcard(queue) == 0
    for arq_id in ("unknown-fn", "expired", "garbage"):
        for prefix in (job_key_prefix, in_progress_key_prefix, retry_key_prefix):
            assert not await redis.exists(prefix + arq_id)


@pytest.mark.slow
async def test_stopping_with_a_full_finishing_stage_hands_every_job_back(job_settings):
    """One slot, a finishing stage of two, deliveries that hang: two jobs wait in delivery
    and a third at the finishing stage's door. Stopping hands all three back (queued, the
    attempt closed as requeued); the fourth was never claimed."""
    from pydantic import SecretStr

    from jobs.services import Services
    from tests.fakes.telegram import FakeTelegram

    class HangingTelegram(FakeTelegram):
        released = False

        async def _handle(self, req):  # type: ignore[no-untyped-def]
            while not self.released:  # hangs until the test is over
                await asyncio.sleep(0.05)
            return await super()._handle(req)

    tg = HangingTelegram().start()
    try:
        job_settings.telegram_bot_token = SecretStr(tg.token)
        job_settings.telegram_api_base = tg.url
        svc = await Services.open(job_settings)
        try:
            # one chat each: a send to a chat that is busy would be parked, not hang here
            origins = [{**TG, "actor_key": f"10{n:02d}"} for n in range(4)]
            ids = [await dispatch(svc, "bg_sleep", {"seconds": 0}, o) for o in origins]
            w = build_worker(svc, handle_signals=False, scheduler=False, max_jobs=1)
            assert w.runner is not None and w.runner.max_finishing == 2
            run = asyncio.create_task(w.async_run())
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                jobs = [await store.get_job(svc.sessionmaker, j) for j in ids]
                if sum(j.status == "running" for j in jobs) == 3:
                    break
                await asyncio.sleep(0.05)
            assert len(w.runner.finishing) == 2
            await w.close()
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
            outcomes = []
            for j in ids:
                job, attempts = await job_and_attempts(svc, j)
                assert job.status == "queued" and job.result is None
                outcomes.append([a.outcome for a in attempts])
            assert sorted(outcomes) == [[], ["requeued"], ["requeued"], ["requeued"]]
            assert tg.sent == []
        finally:
            await svc.close()
    finally:
        tg.released = True
        tg.stop()


@pytest.mark.slow
async def test_an_entry_started_but_not_yet_claimed_is_reenqueued_only_when_still_so(services):
    """The reconciler finds a queued job whose arq entry a worker has started: a live
    worker's claim may be in flight, so the entry is re-enqueued only if the next pass
    finds it so again (its worker died between starting it and claiming it)."""
    from arq.constants import in_progress_key_prefix

    from delivery.pipeline import postprocess
    from jobs.queue.runner import JobRunner

    job_id = await dispatch(services, "bg_sleep", {"seconds": 0})
    async with services.sessionmaker() as s:
        await s.execute(update(Job).where(Job.id == job_id).values(queued_at=time.time() - 60))
        await s.commit()
    job, _ = await job_and_attempts(services, job_id)
    await services.redis.set(in_progress_key_prefix + job.arq_job_id, "1")
    runner = JobRunner(
        services, services.executor, "reconciler-test", finisher=postprocess, notices=notices
    )
    assert await runner.reconcile_once() == 0  # first sight: perhaps being claimed
    assert (await job_and_attempts(services, job_id))[0].lease_token == job.lease_token
    assert await runner.reconcile_once() == 1  # still so: its worker is gone
    again, _ = await job_and_attempts(services, job_id)
    assert again.status == "queued" and again.lease_token == job.lease_token + 1
    await services.redis.delete(in_progress_key_prefix + job.arq_job_id)  # (as it expires)
    await drain(services)  # the old entry is superseded, the new one runs
    assert (await job_and_attempts(services, job_id))[0].status == "succeeded"


@pytest.mark.slow
async def test_live_events_are_published_in_order_in_one_call(services):
    """publish_events: every event reaches a subscriber of the job-events channel, in order."""
    import json

    from jobs.constants import JOB_EVENTS
    from jobs.queue import broker

    pubsub = services.redis.pubsub()
    await pubsub.subscribe(services.settings.key(JOB_EVENTS))
    try:
        events = [(f"j{i}", "running" if i % 2 else "succeeded", "noop") for i in range(5)]
        await broker.publish_events(services, events)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < len(events) and time.monotonic() < deadline:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if msg is not None:
                got.append(json.loads(msg["data"]))
        assert [(e["id"], e["status"], e["skill"]) for e in got] == events
    finally:
        await pubsub.aclose()


@pytest.mark.slow
async def test_a_burst_worker_returns_when_its_last_job_ends_not_at_its_next_idle_poll(services):
    """A burst worker is woken by each job's end and, once nothing runs here, waits for the
    entries of finished jobs to be tidied before it counts the queue: it returns then, not
    after sleeping out its idle poll (30 s here). 150 jobs ending close together, so that
    tidying is still in flight when the last ones end."""
    d = Dispatcher(services)
    sent = await asyncio.gather(*(d.dispatch("bg_sleep", {"seconds": 0.2}, TG) for _ in range(150)))
    ids = [r.body["job_id"] for r in sent]
    w = build_worker(services, burst=True, handle_signals=False, scheduler=False)
    w.poll_delay_s = 30.0
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(w.async_run(), 60)
    finally:
        await w.close()
    assert time.monotonic() - t0 < 15.0  # the idle poll would be 30 s
    for job_id in ids:
        job, _ = await job_and_attempts(services, job_id)
        assert job.status == "succeeded"
