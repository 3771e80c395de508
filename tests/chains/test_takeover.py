"""Chain runs of a dead worker are taken over as jobs are: real worker processes on
PostgreSQL and Redis with the shipped heartbeat (2.5 s) and lease (30 s). A run of a worker
killed with -9 runs again within 10 s without repeating a succeeded step; a worker paused
5 s is not taken over (one run of the step, one attempt); a run lost 3 times fails instead
of running for ever; a stopping worker hands its run back without it counting as lost."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from chains import schedules
from chains.schedules import validate
from jobs.models import ChainRun
from jobs.queue.store import LOST_CAP_REASON
from jobs.settings import BUNDLED_SKILLS
from tests.helpers.chains import (
    COUNTER,
    chain_workspace,
    close_services,
    make_services,
    write_skill,
)
from tests.helpers.settings import make_settings
from tests.helpers.workers import WorkerProcess, pid_of

pytestmark = [pytest.mark.postgres, pytest.mark.redis_server, pytest.mark.slow]

# Appends "<run> start" / "<run> done" lines to its log around a sleep: how many times the
# step ran, and whether a run completed.
LOGGED_SLEEP = """
import pathlib, time, uuid
def execute(input_data, ctx):
    log = pathlib.Path(input_data["log"])
    me = uuid.uuid4().hex[:8]
    with log.open("a") as f:
        f.write(f"{me} start {time.time()}\\n")
    time.sleep(float(input_data["sec"]))
    with log.open("a") as f:
        f.write(f"{me} done {time.time()}\\n")
    return {"message": "slept"}
"""

ASYNC_LOGGED_SLEEP = (
    LOGGED_SLEEP.replace("def execute", "async def execute")
    .replace("import pathlib, time, uuid", "import asyncio, pathlib, time, uuid")
    .replace("time.sleep(", "await asyncio.sleep(")
)


@pytest.fixture
async def chain_env(tmp_path: Path, pg_url: str, redis_server_url: str, redis_prefix: str, redis):  # type: ignore[no-untyped-def]
    skills = tmp_path / "skills"
    write_skill(skills, "counter", COUNTER)
    write_skill(skills, "logged_sleep", LOGGED_SLEEP)
    write_skill(skills, "async_logged_sleep", ASYNC_LOGGED_SLEEP)
    started: list[WorkerProcess] = []
    services: list[Any] = []

    def setup(**kw: Any) -> tuple[Any, Any]:
        settings = make_settings(
            tmp_path,
            redis_url=redis_server_url,
            prefix=redis_prefix,
            database_url=pg_url,
            skills_path=os.pathsep.join([str(BUNDLED_SKILLS), f"trusted={skills}"]),
            worker_grace_sec=2.0,
            **kw,
        )
        svc = make_services(settings, redis, extra_skills=skills)
        services.append(svc)
        return settings, svc

    def start(settings: Any) -> WorkerProcess:
        w = WorkerProcess(settings, tmp_path / f"worker{len(started)}.log")
        started.append(w)
        return w

    yield setup, start
    for w in started:
        w.stop()
    for svc in services:
        await close_services(svc)


async def _chain(
    svc: Any, settings: Any, log: Path, sec: float, skill: str = "logged_sleep"
) -> tuple[str, str, Path]:
    """A schedule counter → logged_sleep → echo, triggered once: (schedule id, run id, the
    counter file)."""
    counter = chain_workspace(settings) / "first.count"
    spec = {
        "name": f"takeover-{time.monotonic_ns()}",
        "cron": "0 0 1 1 *",
        "identity": {"role_id": "r1", "session_id": "s1"},
        "steps": [
            {
                "id": "first",
                "skill": "counter",
                "input": {"counter_file": str(counter), "value": 7},
            },
            {"id": "slow", "skill": skill, "input": {"log": str(log), "sec": sec}},
            {"id": "last", "skill": "echo", "input": {"v": "$steps.first.value"}},
        ],
    }
    row = await schedules.create(svc, validate(spec, svc.registry))
    return row.id, await schedules.trigger_manual(svc, row.id), counter


async def _run(svc: Any, run_id: str) -> ChainRun:
    async with svc.sessionmaker() as s:
        run = await s.get(ChainRun, run_id)
    assert run is not None
    return run


async def _until(what: str, limit: float, cond: Any) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = await cond()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _lines(log: Path, word: str) -> list[list[str]]:
    if not log.exists():
        return []
    return [ln.split() for ln in log.read_text().splitlines() if ln.split()[1] == word]


async def _sleeping_holder(svc: Any, run_id: str, log: Path, workers: list[WorkerProcess], n: int):  # type: ignore[no-untyped-def]
    """The worker whose attempt is in the sleeping step (its n-th start)."""

    async def started() -> bool:
        return len(_lines(log, "start")) >= n

    await _until(f"start {n} of the slow step", 60, started)
    owner = (await _run(svc, run_id)).lease_owner
    assert owner is not None
    return next(w for w in workers if w.pid == pid_of(owner))


async def _finished(svc: Any, run_id: str, limit: float = 60) -> ChainRun:
    async def final() -> ChainRun | None:
        run = await _run(svc, run_id)
        return run if run.status in ("succeeded", "failed", "stopped_empty") else None

    result: ChainRun = await _until("the run to finish", limit, final)
    return result


@pytest.mark.slow
async def test_a_killed_workers_chain_run_is_rerun_within_10_seconds(chain_env, tmp_path):
    setup, start = chain_env
    settings, svc = setup()
    assert settings.worker_heartbeat_sec == 2.5 and settings.worker_lease_sec == 30.0
    workers = [start(settings), start(settings)]
    log = tmp_path / "slow.log"
    schedule_id, run_id, counter = await _chain(svc, settings, log, 4)
    victim = await _sleeping_holder(svc, run_id, log, workers, 1)
    await asyncio.sleep(0.5)
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    run = await _finished(svc, run_id)
    got = await schedules.get_run(svc, run_id)
    assert run.status == "succeeded", got
    starts, dones = _lines(log, "start"), _lines(log, "done")
    assert len(starts) == 2 and len(dones) == 1  # the killed attempt never completed
    rerun_after = float(starts[1][2]) - killed_at
    assert rerun_after < 10.0, rerun_after
    assert run.lost_runs == 1 and pid_of(run.lease_owner or "") != victim.pid
    assert int(counter.read_text()) == 1  # the succeeded step was not run again
    assert got is not None and got["steps"][2]["output"]["v"] == 7
    assert [s["status"] for s in got["steps"]] == ["succeeded"] * 3
    async with svc.sessionmaker() as s:
        runs = await s.scalar(
            select(func.count()).select_from(ChainRun).where(ChainRun.schedule_id == schedule_id)
        )
    assert runs == 1  # one run of the fire, taken over (not a second run)
    text = "".join(p.read_text(errors="replace") for p in tmp_path.glob("worker*.log"))
    assert "missed 3 heartbeats" in text


@pytest.mark.slow
async def test_a_worker_paused_for_5_seconds_keeps_its_chain_run(chain_env, tmp_path):
    setup, start = chain_env
    settings, svc = setup()
    workers = [start(settings), start(settings)]
    log = tmp_path / "slow.log"
    _, run_id, _ = await _chain(svc, settings, log, 7)
    paused = await _sleeping_holder(svc, run_id, log, workers, 1)
    await asyncio.sleep(1.0)
    paused.signal(signal.SIGSTOP)
    await asyncio.sleep(5.0)
    paused.signal(signal.SIGCONT)
    run = await _finished(svc, run_id)
    await asyncio.sleep(1.0)
    assert run.status == "succeeded"
    assert len(_lines(log, "start")) == 1 and len(_lines(log, "done")) == 1
    run = await _run(svc, run_id)
    assert run.lease_token == 1 and run.lost_runs == 0  # one attempt, never taken over
    assert pid_of(run.lease_owner or "") == paused.pid


@pytest.mark.slow
async def test_a_chain_run_lost_three_times_fails_and_is_not_rerun(chain_env, tmp_path):
    setup, start = chain_env
    settings, svc = setup(
        worker_lease_sec=3.0,
        worker_heartbeat_sec=0.5,
        reconcile_interval_sec=0.5,
        reconcile_stale_sec=2.0,
    )
    workers = [start(settings)]
    log = tmp_path / "slow.log"
    _, run_id, counter = await _chain(svc, settings, log, 60)
    for n in range(1, 4):
        workers.append(start(settings))  # the one that takes over
        victim = await _sleeping_holder(svc, run_id, log, workers, n)
        victim.signal(signal.SIGKILL)
        workers.remove(victim)
    await _finished(svc, run_id, limit=60)
    await asyncio.sleep(2.0)  # nobody runs it again
    got = await schedules.get_run(svc, run_id)
    assert got is not None and got["status"] == "failed", got
    assert got["error"] == LOST_CAP_REASON.format(n=3)
    assert [s["status"] for s in got["steps"]] == ["succeeded", "failed", "skipped"]
    assert got["steps"][1]["error"] == LOST_CAP_REASON.format(n=3)
    assert len(_lines(log, "start")) == 3 and _lines(log, "done") == []
    assert int(counter.read_text()) == 1
    assert (await _run(svc, run_id)).lost_runs == 3


@pytest.mark.slow
async def test_a_stopping_worker_hands_its_chain_run_back(chain_env, tmp_path):
    setup, start = chain_env
    settings, svc = setup()
    workers = [start(settings), start(settings)]
    log = tmp_path / "slow.log"
    _, run_id, counter = await _chain(svc, settings, log, 8)
    stopping = await _sleeping_holder(svc, run_id, log, workers, 1)
    stopping.signal(signal.SIGTERM)  # grace 2 s, then its run is handed back
    run = await _finished(svc, run_id)
    assert run.status == "succeeded"
    assert run.lost_runs == 0 and run.lease_token == 2
    assert pid_of(run.lease_owner or "") != stopping.pid
    assert len(_lines(log, "start")) == 2 and len(_lines(log, "done")) == 1
    assert int(counter.read_text()) == 1


@pytest.mark.slow
async def test_a_worker_paused_past_its_heartbeat_stops_its_chain_step(chain_env, tmp_path):
    """Paused 11 s (presumed dead after 8.5 s): a peer re-runs the step; continued, the
    paused worker's step stops before it completes, and the run has one outcome."""
    setup, start = chain_env
    settings, svc = setup()
    workers = [start(settings), start(settings)]
    log = tmp_path / "slow.log"
    _, run_id, counter = await _chain(svc, settings, log, 16, skill="async_logged_sleep")
    paused = await _sleeping_holder(svc, run_id, log, workers, 1)
    paused.signal(signal.SIGSTOP)

    async def taken_over() -> bool:
        return len(_lines(log, "start")) >= 2

    await _until("a peer to re-run the step", 30, taken_over)  # (~9.5 s; later when loaded)
    await asyncio.sleep(1.0)
    paused.signal(signal.SIGCONT)
    run = await _finished(svc, run_id, limit=60)
    await asyncio.sleep(2.0)
    assert run.status == "succeeded" and run.lost_runs == 1
    assert pid_of(run.lease_owner or "") != paused.pid
    starts, dones = _lines(log, "start"), _lines(log, "done")
    assert len(starts) == 2 and len(dones) == 1 and dones[0][0] == starts[1][0]
    assert int(counter.read_text()) == 1
