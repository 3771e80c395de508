"""A chain survives its worker being killed with SIGKILL mid-step: real worker processes,
PostgreSQL and Redis. The next worker's scheduler finds the abandoned run, re-enqueues it,
and the resumed run does not repeat the step that already succeeded."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from arq.constants import in_progress_key_prefix, job_key_prefix
from sqlalchemy import select

from chains import schedules
from chains.schedules import validate
from jobs.models import ChainRun
from jobs.settings import BUNDLED_SKILLS
from tests.helpers.chains import (
    COUNTER,
    SLEEP_ONCE,
    chain_workspace,
    close_services,
    make_services,
    write_skill,
)
from tests.helpers.settings import make_settings

pytestmark = [pytest.mark.postgres, pytest.mark.redis_server, pytest.mark.slow]


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli.app", "worker"],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: killed as a whole
    )


async def _wait_for(cond, limit: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if await cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(120)
@pytest.mark.slow
async def test_kill_9_mid_chain_resumes_without_repeating_steps(
    tmp_path: Path,
    pg_url: str,
    redis_server_url: str,
    redis_prefix: str,
    redis,  # type: ignore[no-untyped-def]
) -> None:
    skills = tmp_path / "skills"
    write_skill(skills, "counter", COUNTER)
    write_skill(skills, "sleep_once", SLEEP_ONCE)
    settings = make_settings(
        tmp_path, redis_url=redis_server_url, prefix=redis_prefix, database_url=pg_url
    )
    env = {
        **os.environ,
        "SKILLJOBS_DATABASE_URL": pg_url,
        "SKILLJOBS_REDIS_URL": redis_server_url,
        "SKILLJOBS_REDIS_PREFIX": redis_prefix,
        "SKILLJOBS_QUEUE_NAME": settings.queue_name,
        "SKILLJOBS_DATA_DIR": str(settings.data_dir),
        "SKILLJOBS_SECRET_KEY": settings.secret_key.get_secret_value(),  # type: ignore[union-attr]
        "SKILLJOBS_SKILLS_PATH": os.pathsep.join([str(BUNDLED_SKILLS), f"trusted={skills}"]),
        "SKILLJOBS_WORKER_LEASE_SEC": "2",
        "SKILLJOBS_WORKER_HEARTBEAT_SEC": "0.5",
        "SKILLJOBS_RECONCILE_INTERVAL_SEC": "0.5",
        "SKILLJOBS_SCHEDULER_INTERVAL_SEC": "0.2",
    }
    svc = make_services(settings, redis, extra_skills=skills)
    counter, marker = chain_workspace(settings) / "step0.count", tmp_path / "slept"
    spec = {
        "name": "killed",
        "cron": "0 0 1 1 *",
        "identity": {"role_id": "r1", "session_id": "s1"},
        "steps": [
            {
                "id": "first",
                "skill": "counter",
                "input": {"counter_file": str(counter), "value": 7},
            },
            {"id": "slow", "skill": "sleep_once", "input": {"marker": str(marker), "sec": 60}},
            {"id": "last", "skill": "echo", "input": {"v": "$steps.first.value"}},
        ],
    }
    procs: list[subprocess.Popen[bytes]] = []
    run_id = ""
    try:
        row = await schedules.create(svc, validate(spec, svc.registry))
        run_id = await schedules.trigger_manual(svc, row.id)
        first = _worker(env, tmp_path / "worker1.log")
        procs.append(first)

        async def sleeping() -> bool:
            return marker.exists()

        await _wait_for(sleeping, 30, "step 1 to start in the first worker")
        assert int(counter.read_text()) == 1
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)

        async with svc.sessionmaker() as s:
            run = await s.get(ChainRun, run_id)
            assert run is not None and run.status == "running"

        second = _worker(env, tmp_path / "worker2.log")
        procs.append(second)

        async def finished() -> bool:
            async with svc.sessionmaker() as s:
                r = (
                    await s.execute(select(ChainRun.status).where(ChainRun.id == run_id))
                ).scalar_one()
            return r in ("succeeded", "failed", "stopped_empty")

        await _wait_for(finished, 60, "the resumed run to finish")
        got = await schedules.get_run(svc, run_id)
        assert got is not None
        logs = (tmp_path / "worker2.log").read_text(errors="replace")[-3000:]
        assert got["status"] == "succeeded", (got, logs)
        assert int(counter.read_text()) == 1  # the succeeded step was not repeated
        assert got["steps"][2]["output"]["v"] == 7
        async with svc.sessionmaker() as s:
            final = await s.get(ChainRun, run_id)
        assert final is not None and final.lease_token >= 2  # taken over by the second worker
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(5)
        if run_id:
            keys = [
                pre + f"chain:{run_id}:{n}"
                for n in range(4)
                for pre in (job_key_prefix, in_progress_key_prefix)
            ]
            await redis.delete(*keys)
        await close_services(svc)


@pytest.mark.timeout(90)
@pytest.mark.slow
async def test_worker_scheduler_fires_a_due_schedule(
    tmp_path: Path,
    pg_url: str,
    redis_server_url: str,
    redis_prefix: str,
    redis,  # type: ignore[no-untyped-def]
) -> None:
    """The scheduler inside ``skilljobs worker`` claims a due fire time, enqueues it, and
    the worker runs the chain (the batch enqueue writes jobs the arq worker accepts)."""
    from sqlalchemy import update

    from jobs.models import Schedule

    settings = make_settings(
        tmp_path, redis_url=redis_server_url, prefix=redis_prefix, database_url=pg_url
    )
    env = {
        **os.environ,
        "SKILLJOBS_DATABASE_URL": pg_url,
        "SKILLJOBS_REDIS_URL": redis_server_url,
        "SKILLJOBS_REDIS_PREFIX": redis_prefix,
        "SKILLJOBS_QUEUE_NAME": settings.queue_name,
        "SKILLJOBS_DATA_DIR": str(settings.data_dir),
        "SKILLJOBS_SECRET_KEY": settings.secret_key.get_secret_value(),  # type: ignore[union-attr]
        "SKILLJOBS_SKILLS_PATH": str(BUNDLED_SKILLS),
        "SKILLJOBS_SCHEDULER_INTERVAL_SEC": "0.2",
    }
    svc = make_services(settings, redis)
    proc = None
    run_ids: list[str] = []
    try:
        spec = {
            "name": "every-minute",
            "cron": "* * * * *",
            "steps": [{"skill": "echo", "input": {"message": "tick"}}],
        }
        row = await schedules.create(svc, validate(spec, svc.registry))
        due = time.time() + 1.0
        async with svc.sessionmaker() as s:
            await s.execute(update(Schedule).where(Schedule.id == row.id).values(next_fire_at=due))
            await s.commit()
        proc = _worker(env, tmp_path / "worker.log")

        async def done() -> bool:
            async with svc.sessionmaker() as s:
                runs = list((await s.execute(select(ChainRun))).scalars())
            run_ids[:] = [r.id for r in runs]
            return any(r.status == "succeeded" for r in runs)

        await _wait_for(done, 45, "the fired run to succeed")
        async with svc.sessionmaker() as s:
            runs = list((await s.execute(select(ChainRun))).scalars())
            fresh = await s.get(Schedule, row.id)
        first = min(runs, key=lambda r: r.fire_at)
        assert due <= first.fire_at < due + 60  # the due time (or a minute boundary just after)
        assert first.fire_key == f"cron:{row.id}:{round(first.fire_at)}"
        assert len({r.fire_key for r in runs}) == len(runs)
        assert fresh is not None and fresh.next_fire_at is not None and fresh.next_fire_at > due
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        keys = [
            pre + f"chain:{r}:{n}"
            for r in run_ids
            for n in range(3)
            for pre in (job_key_prefix, in_progress_key_prefix)
        ]
        if keys:
            await redis.delete(*keys)
        await close_services(svc)
