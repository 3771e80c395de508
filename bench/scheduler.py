"""The chain scheduler with 10,000 enabled schedules on PostgreSQL.

Run: ``.venv/bin/python -m bench.scheduler``. Needs PostgreSQL and Redis
(``SKILLJOBS_BENCH_DATABASE_URL`` / ``SKILLJOBS_BENCH_REDIS_URL``, defaults on localhost);
a throw-away database and a unique Redis prefix are used and removed afterwards.

Budgets: one ``Scheduler.tick()`` median ≤ 100 ms; fire time → first step started p50 ≤ 1 s.

1. **tick**: 10,000 schedules ``"<m> * * * *"`` (m = i mod 60, so ~167 are due each
   minute). Simulated time walks 30 minutes: at each minute one tick claims and enqueues
   the ~167 due fire times, then five ticks find nothing due.
2. **latency**: a real ``skilljobs worker`` process (with its scheduler, default
   ``SKILLJOBS_SCHEDULER_INTERVAL_SEC=1``) runs while 60 schedules are made due at staggered
   moments; latency = ``chain_steps.started_at`` of step 0 − ``chain_runs.fire_at``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, insert, select, text, update

from bench.common import REDIS, drop_db, make_db, pct
from chains.cron import next_fire
from chains.scheduler import Scheduler
from jobs.catalog.loader import load_registry
from jobs.crypto import SecretBox, load_or_create_key
from jobs.db import create_engine, create_sessionmaker
from jobs.models import ChainRun, ChainStep, Schedule
from jobs.services import Services, connect_redis
from jobs.settings import BUNDLED_SKILLS, Settings

N_SCHEDULES = 10_000
MINUTES = 30
IDLE_TICKS = 5
LATENCY_RUNS = 60
STEPS = [{"id": "echo", "skill": "echo", "input": {"message": "tick"}}]


async def seed(svc: Services, now: float) -> None:
    rows: list[dict[str, Any]] = []
    for i in range(N_SCHEDULES):
        cron = f"{i % 60} * * * *"
        rows.append(
            {
                "id": uuid.uuid4().hex,
                "name": f"bench-{i:05d}",
                "cron": cron,
                "timezone": "UTC",
                "identity": {"role_id": "bench", "session_id": f"s{i}"},
                "steps": STEPS,
                "policy": {},
                "deliver": None,
                "enabled": True,
                "next_fire_at": next_fire(cron, _utc(), now),
                "created_at": now,
                "updated_at": now,
            }
        )
    async with svc.sessionmaker() as s:
        for start in range(0, len(rows), 1000):
            await s.execute(insert(Schedule), rows[start : start + 1000])
        await s.commit()
        await s.execute(select(func.count()).select_from(Schedule))
    async with svc.engine.begin() as conn:
        await conn.execute(text("ANALYZE schedules"))


def _utc() -> Any:
    from zoneinfo import ZoneInfo

    return ZoneInfo("UTC")


async def bench_ticks(svc: Services, start: float) -> dict[str, Any]:
    sched = Scheduler(svc)
    busy: list[float] = []
    idle: list[float] = []
    claimed: list[int] = []
    run_ids: list[str] = []
    minute0 = (start // 60 + 1) * 60
    for m in range(MINUTES):
        at = minute0 + 60 * m
        t0 = time.perf_counter()
        runs = await sched.tick(at + 0.05)
        busy.append((time.perf_counter() - t0) * 1000)
        claimed.append(len(runs))
        run_ids += runs
        for k in range(IDLE_TICKS):
            t0 = time.perf_counter()
            extra = await sched.tick(at + 1 + k)
            idle.append((time.perf_counter() - t0) * 1000)
            assert not extra, "an idle tick claimed something"
    all_ticks = busy + idle
    return {
        "run_ids": run_ids,
        "ticks": len(all_ticks),
        "median_all": statistics.median(all_ticks),
        "p95_all": pct(all_ticks, 95),
        "median_busy": statistics.median(busy),
        "p95_busy": pct(busy, 95),
        "median_idle": statistics.median(idle),
        "p95_idle": pct(idle, 95),
        "claimed_per_busy_tick": statistics.mean(claimed),
        "runs": sum(claimed),
    }


def _start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli.app", "worker"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, stopped as a whole
    )


async def bench_latency(svc: Services, settings: Settings, data: Path) -> dict[str, Any]:
    # Park the bulk schedules a day ahead so only the measured fires happen (they stay
    # enabled: the due-query still runs against all 10,000 rows).
    now = time.time()
    async with svc.sessionmaker() as s:
        await s.execute(update(Schedule).values(next_fire_at=now + 86400))
        ids = list(
            (
                await s.execute(select(Schedule.id).order_by(Schedule.name).limit(LATENCY_RUNS))
            ).scalars()
        )
        await s.commit()
    env = {
        **os.environ,
        "SKILLJOBS_DATABASE_URL": settings.database_url or "",
        "SKILLJOBS_REDIS_URL": REDIS,
        "SKILLJOBS_REDIS_PREFIX": settings.redis_prefix,
        "SKILLJOBS_QUEUE_NAME": settings.queue_name,
        "SKILLJOBS_DATA_DIR": str(data),
        "SKILLJOBS_SECRET_KEY": settings.secret_key.get_secret_value()
        if settings.secret_key
        else "",
        "SKILLJOBS_SKILLS_PATH": str(BUNDLED_SKILLS),
        "SKILLJOBS_LOG_LEVEL": "WARNING",
    }
    proc = _start_worker(env, data / "worker.log")
    try:
        await asyncio.sleep(3.0)  # worker start-up
        base = time.time() + 1.0
        async with svc.sessionmaker() as s:
            for i, sid in enumerate(ids):
                # staggered over ~12 s so fire times land at every phase of the tick interval
                await s.execute(
                    update(Schedule).where(Schedule.id == sid).values(next_fire_at=base + i * 0.2)
                )
            await s.commit()
        deadline = time.time() + 60
        lat: list[float] = []
        while time.time() < deadline:
            async with svc.sessionmaker() as s:
                q = (
                    select(ChainRun.fire_at, ChainStep.started_at)
                    .join(ChainStep, ChainStep.run_id == ChainRun.id)
                    .where(ChainStep.idx == 0, ChainStep.started_at.is_not(None))
                )
                got = (await s.execute(q)).all()
            if len(got) >= LATENCY_RUNS:
                lat = [(b - a) * 1000 for a, b in got]
                break
            await asyncio.sleep(0.5)
        if not lat:
            raise RuntimeError("the worker did not start every measured run in 60 s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        for _ in range(200):
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    return {
        "runs": len(lat),
        "p50": pct(lat, 50),
        "p95": pct(lat, 95),
        "max": max(lat),
        "interval": settings.scheduler_interval_sec,
    }


async def main() -> None:
    from arq.constants import in_progress_key_prefix, job_key_prefix
    from cryptography.fernet import Fernet

    url, name = await make_db()
    data = Path(tempfile.mkdtemp(prefix="skilljobs-bench-"))
    prefix = f"sjbench{uuid.uuid4().hex[:8]}"
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=url,
        redis_url=REDIS,
        data_dir=data,
        redis_prefix=prefix,
        queue_name=f"{prefix}:queue",
        secret_key=Fernet.generate_key().decode(),
    )
    engine = create_engine(url)
    svc = Services(
        settings=settings,
        engine=engine,
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(load_or_create_key(data, settings.secret_key.get_secret_value())),  # type: ignore[union-attr]
        registry=load_registry([BUNDLED_SKILLS]),
        redis=await connect_redis(settings),
    )
    run_ids: list[str] = []
    try:
        t0 = time.perf_counter()
        await seed(svc, time.time())
        print(f"seeded {N_SCHEDULES} schedules in {time.perf_counter() - t0:.1f} s", flush=True)
        ticks = await bench_ticks(svc, time.time())
        run_ids += ticks.pop("run_ids")
        print(
            f"tick: {ticks['ticks']} ticks, median {ticks['median_all']:.1f} ms "
            f"(p95 {ticks['p95_all']:.1f}); claiming ~{ticks['claimed_per_busy_tick']:.0f} due: "
            f"median {ticks['median_busy']:.1f} ms (p95 {ticks['p95_busy']:.1f}); "
            f"nothing due: median {ticks['median_idle']:.2f} ms (p95 {ticks['p95_idle']:.2f})",
            flush=True,
        )
        assert svc.redis is not None
        await svc.redis.delete(settings.queue_name)  # the tick phase's runs are not executed
        async with svc.sessionmaker() as s:
            await s.execute(delete(ChainRun))
            await s.commit()
        lat = await bench_latency(svc, settings, data)
        async with svc.sessionmaker() as s:
            run_ids += list((await s.execute(select(ChainRun.id))).scalars())
        print(
            f"fire → first step started: {lat['runs']} runs, p50 {lat['p50']:.0f} ms, "
            f"p95 {lat['p95']:.0f} ms, max {lat['max']:.0f} ms "
            f"(scheduler interval {lat['interval']:.1f} s)",
            flush=True,
        )
        ok = ticks["median_all"] <= 100 and lat["p50"] <= 1000
        print("budget:", "met" if ok else "NOT met")
    finally:
        redis = svc.redis
        if redis is not None:
            keys = [k async for k in redis.scan_iter(match=f"{prefix}*")]
            for rid in run_ids:
                for n in range(3):
                    keys += [
                        p + f"chain:{rid}:{n}" for p in (job_key_prefix, in_progress_key_prefix)
                    ]
            for start in range(0, len(keys), 5000):
                await redis.delete(*keys[start : start + 5000])
        await svc.close()
        await drop_db(name)


if __name__ == "__main__":
    asyncio.run(main())
