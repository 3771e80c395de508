"""A skill's processes and its worker's lease (real worker processes): a worker that wakes
after a pause long enough to lose its lease kills its skills' processes before anything
else, so the run a peer took over is soon the only one."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from jobs.services import Services
from tests.helpers.jobs import TG, dispatch
from tests.helpers.settings import make_settings
from tests.helpers.workers import WorkerProcess, holder, pid_of

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.integration]

SKILLS = Path(__file__).resolve().parents[2] / "sandbox_skills"


def alive_with(token: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if token.encode() in fh.read():
                        found.append(int(pid))
            except OSError:
                continue
    return found


async def until(cond, limit: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_worker_waking_without_its_lease_kills_its_runs_first(
    tmp_path: Path, pg_url: str, redis_server_url: str, redis_prefix: str
) -> None:
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=pg_url,
        skills_path=str(SKILLS),
        worker_lease_sec=3.0,
        worker_heartbeat_sec=0.5,
        worker_grace_sec=2.0,
    )
    svc = await Services.open(settings)
    started = [WorkerProcess(settings, tmp_path / f"w{i}.log") for i in range(2)]
    token = str(int(time.time() * 1000) % 10**8)
    try:
        job_id = await dispatch(svc, "long_sleeper", {"token": token}, TG)
        first = await holder(svc, job_id, limit=60)
        victim = next(w for w in started if w.pid == pid_of(first.worker_id))
        assert await until(lambda: len(alive_with(f".{token}")) >= 2, 20)
        victim.signal(signal.SIGSTOP)
        # the peer presumes it dead and runs the job again: both runs alive for now
        assert await until(lambda: len(alive_with(f".{token}")) >= 4, 30), alive_with(token)
        victim.signal(signal.SIGCONT)
        # on waking, the victim kills its run (setsid child included) before anything else
        assert await until(lambda: len(alive_with(f".{token}")) == 2, 3), alive_with(token)
        again = await holder(svc, job_id, limit=10)
        assert again.number == 2 and pid_of(again.worker_id) != victim.pid
    finally:
        for w in started:
            w.stop()
        for pid in alive_with(f".{token}"):
            os.kill(pid, signal.SIGKILL)
        await svc.close()
