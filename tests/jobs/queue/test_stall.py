"""The stall detector. In a real worker process: an event loop blocked past the threshold
(here: the whole process stopped with SIGSTOP) is logged, counted, written with the
worker's heartbeat and shown by ``/metrics``, on PostgreSQL and SQLite. On a loop: the end
of a block is handled before the code it held up runs."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from dashboard.app import create_app
from jobs.execution.inprocess import RUN_TASKS, with_wall
from jobs.models import Worker
from jobs.queue.stall import StallWatch
from jobs.services import Services
from tests.helpers.settings import ADMIN_AUTH, JOB_SKILLS, make_settings
from tests.helpers.workers import WorkerProcess

pytestmark = pytest.mark.slow


async def _worker_row(svc: Services, pid: int, limit: float, want_stalls: int = 0) -> Worker:
    """The worker's row once a heartbeat (not only its registration) wrote it: by then its
    stall detector is watching."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        async with svc.sessionmaker() as s:
            rows = (await s.scalars(select(Worker).where(Worker.pid == pid))).all()
        for w in rows:
            if w.last_heartbeat > w.started_at + 0.2 and w.stalls >= want_stalls:
                return w
        await asyncio.sleep(0.1)
    raise AssertionError(f"no worker row of pid {pid} with {want_stalls} stall(s)")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.slow
async def test_a_stalled_worker_is_counted_and_shown_in_metrics(
    tmp_path, database_url, redis_server_url, redis_prefix
):
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=str(JOB_SKILLS),
        worker_heartbeat_sec=0.5,
    )
    svc = await Services.open(settings)
    log = tmp_path / "worker.log"
    worker = WorkerProcess(settings, log, SKILLJOBS_WORKER_STALL_SEC="1.0")
    try:
        row = await _worker_row(svc, worker.pid, limit=60)
        assert row.stalls == 0
        worker.signal(signal.SIGSTOP)
        await asyncio.sleep(2.5)
        worker.signal(signal.SIGCONT)
        row = await _worker_row(svc, worker.pid, limit=30, want_stalls=1)
        assert row.stalls == 1, log.read_text(errors="replace")[-3000:]
        assert 2.0 <= row.longest_stall_s < 30.0
        text = log.read_text(errors="replace")
        assert "event loop blocked for" in text  # (with the stack when the watcher saw it)

        app = create_app(settings, services=svc)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://127.0.0.1",
            headers=ADMIN_AUTH,
        ) as client:
            resp = await client.get("/metrics")
        assert resp.status_code == 200
        s = _samples(resp.text)
        assert s[("skilljobs_worker_stalls_total", (("worker", row.id),))] == 1
        longest = s[("skilljobs_worker_longest_stall_seconds", (("worker", row.id),))]
        assert longest == pytest.approx(row.longest_stall_s, abs=1.0)
    finally:
        worker.stop()
        await svc.close()


@pytest.mark.slow
async def test_the_end_of_a_block_is_handled_before_the_code_it_held_up_runs() -> None:
    """``on_block`` runs in the loop's first pass after the block: a task whose sleep ran
    out during the block is stopped before it takes another step (as a worker stops its
    skills after a pause long enough for peers to have taken its jobs over)."""
    steps: list[str] = []

    # (the skill's sleep is well past the first sleep here: a loaded host may wake this
    # test late, and the skill must still be sleeping when the block begins)
    async def skill() -> None:
        await asyncio.sleep(0.6)
        steps.append("skill went on")

    task = asyncio.create_task(skill())

    def on_block(lag: float) -> None:
        steps.append(f"block of {lag:.1f}s handled")
        task.cancel()

    watch = StallWatch(threshold=0.4, interval=0.05, on_block=on_block)
    watch.start()
    try:
        await asyncio.sleep(0.1)
        time.sleep(1.0)  # the whole loop blocked (as in a SIGSTOP) past the skill's sleep
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        watch.stop()
    assert task.cancelled()
    assert len(steps) == 1 and steps[0].startswith("block of") and watch.stalls == 1


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.slow
async def test_a_paused_runs_skill_is_stopped_before_it_goes_on(direct: bool) -> None:
    """After a block, cancelling the run reaches an in-process skill one loop pass too late
    (its own wake-up runs first); cancelling the run's skill tasks (``RUN_TASKS``) too
    stops it in time. ``direct=False`` shows the late way, for contrast."""
    steps: list[str] = []

    async def skill() -> None:
        await asyncio.sleep(0.5)  # (still asleep when this test wakes, even late)
        steps.append("skill went on")

    tasks: set[asyncio.Task[object]] = set()

    async def run() -> object:
        RUN_TASKS.set(tasks)
        return await with_wall(skill(), 30)

    outer = asyncio.create_task(run())
    await asyncio.sleep(0.01)

    def stop() -> None:  # what the worker does at the end of a pause
        outer.cancel()
        for task in tasks if direct else ():
            task.cancel()

    asyncio.get_running_loop().call_later(0.55, stop)  # expires after the skill's sleep...
    time.sleep(0.8)  # ...both during this block, so they run in the same pass
    with contextlib.suppress(asyncio.CancelledError):
        await outer
    assert steps == ([] if direct else ["skill went on"])
