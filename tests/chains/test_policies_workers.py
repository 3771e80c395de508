"""Fire policies in real time, with two real worker processes each running the scheduler."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select, update

from chains import schedules
from jobs.models import ChainRun, Schedule
from jobs.settings import BUNDLED_SKILLS
from tests.helpers.chains import SLOW, close_services, make_services, write_skill
from tests.helpers.settings import make_settings

pytestmark = [pytest.mark.postgres, pytest.mark.redis_server, pytest.mark.slow]


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli.app", "worker"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def _runs(svc, schedule_id: str) -> list[ChainRun]:  # type: ignore[no-untyped-def]
    async with svc.sessionmaker() as s:
        q = select(ChainRun).where(ChainRun.schedule_id == schedule_id).order_by(ChainRun.fire_at)
        return list((await s.execute(q)).scalars())


async def _until(cond, limit: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if await cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(120)
@pytest.mark.slow
async def test_missed_and_skipped_fires_with_two_workers(
    tmp_path: Path,
    pg_url: str,
    redis_server_url: str,
    redis_prefix: str,
    redis,  # type: ignore[no-untyped-def]
) -> None:
    skills = tmp_path / "skills"
    write_skill(skills, "slow_step", SLOW)
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
        "SKILLJOBS_SKILLS_PATH": os.pathsep.join([str(BUNDLED_SKILLS), str(skills)]),
        "SKILLJOBS_WORKER_LEASE_SEC": "3",
        "SKILLJOBS_WORKER_HEARTBEAT_SEC": "0.5",
        "SKILLJOBS_SCHEDULER_INTERVAL_SEC": "0.2",
    }
    svc = make_services(settings, redis, extra_skills=skills)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        minutely = await schedules.create(
            svc,
            {
                "name": "minutely",
                "cron": "* * * * *",
                "steps": [{"skill": "echo", "input": {"message": "tick"}}],
            },
        )
        slow = await schedules.create(
            svc,
            {
                "name": "slow",
                "cron": "0 0 1 1 *",
                "steps": [{"skill": "slow_step", "input": {"sec": 6}}],
            },
        )
        # the schedulers were down for ten minutes: the minutely schedule is that overdue
        down_since = (time.time() // 60) * 60 - 600
        async with svc.sessionmaker() as s:
            await s.execute(
                update(Schedule).where(Schedule.id == minutely.id).values(next_fire_at=down_since)
            )
            await s.commit()
        manual = await schedules.trigger_manual(svc, slow.id)
        procs = [_worker(env, tmp_path / f"worker{i}.log") for i in (1, 2)]

        async def slow_running() -> bool:
            return any(r.id == manual and r.status == "running" for r in await _runs(svc, slow.id))

        await _until(slow_running, 60, "the slow manual run to start")
        fired_at = time.time() - 1  # a fire time comes while that run is going
        async with svc.sessionmaker() as s:
            await s.execute(
                update(Schedule).where(Schedule.id == slow.id).values(next_fire_at=fired_at)
            )
            await s.commit()

        async def minutely_ran() -> bool:
            return any(r.status == "succeeded" for r in await _runs(svc, minutely.id))

        async def slow_done() -> bool:
            runs = await _runs(svc, slow.id)
            return any(r.status == "skipped" for r in runs) and any(
                r.id == manual and r.status == "succeeded" for r in runs
            )

        await _until(minutely_ran, 60, "the latest overdue fire to run")
        await _until(slow_done, 60, "the skipped fire and the slow run to finish")

        runs = await _runs(svc, minutely.id)
        assert len({r.fire_at for r in runs}) == len(runs)  # each fire time decided once
        ran = [r for r in runs if r.status != "missed"]
        missed = [r for r in runs if r.status == "missed"]
        assert len(missed) >= 9
        assert missed[0].fire_at == down_since
        # only fire times within the grace (2 min) ran: the latest, and any that came since
        assert all(r.fire_at >= down_since + 480 for r in ran)
        assert len([r for r in ran if r.fire_at < missed[-1].fire_at]) == 0

        [skipped] = [r for r in await _runs(svc, slow.id) if r.status == "skipped"]
        assert abs(skipped.fire_at - fired_at) < 1
        assert "still going" in (skipped.error or "")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        await close_services(svc)
