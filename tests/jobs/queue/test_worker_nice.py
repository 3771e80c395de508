"""A worker process can run at a lower CPU priority than the front door
(SKILLJOBS_WORKER_NICE), never a higher one than it was started with. Real `skilljobs
worker` processes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from jobs.constants import WORKER_HEARTBEAT
from jobs.services import Services
from tests.helpers.workers import WorkerProcess


def _nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


async def _started(settings, proc: WorkerProcess, limit: float = 30.0) -> None:
    """Until the worker's heartbeat key is in Redis (it is past its start-up)."""
    svc = await Services.open(settings)
    try:
        assert svc.redis is not None
        deadline = time.monotonic() + limit
        while not [
            k
            async for k in svc.redis.scan_iter(
                count=1000, match=settings.key(WORKER_HEARTBEAT, "*")
            )
        ]:
            assert proc.proc.poll() is None, proc.log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the worker did not start"
            await asyncio.sleep(0.1)
    finally:
        await svc.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, 0), ({"SKILLJOBS_WORKER_NICE": "10"}, 10)],
    ids=["default", "niced"],
)
@pytest.mark.slow
async def test_the_worker_lowers_its_priority(
    job_settings, tmp_path: Path, env: dict[str, str], expected: int
) -> None:
    proc = WorkerProcess(job_settings, tmp_path / "worker.log", **env)
    try:
        await _started(job_settings, proc)
        assert _nice(proc.pid) == expected
    finally:
        proc.stop()


@pytest.mark.slow
async def test_a_higher_niceness_it_was_given_is_kept(job_settings, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give this test process its priority back")
    before = _nice(0)
    os.setpriority(os.PRIO_PROCESS, 0, 15)  # the child starts at 15 (as under `nice -n 15`)
    try:
        proc = WorkerProcess(job_settings, tmp_path / "worker.log", SKILLJOBS_WORKER_NICE="10")
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
    try:
        await _started(job_settings, proc)
        assert _nice(proc.pid) == 15
    finally:
        proc.stop()
