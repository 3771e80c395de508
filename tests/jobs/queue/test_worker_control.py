"""Pausing, resuming and draining a real arq worker (SQLite and PostgreSQL, real Redis),
from the control functions the dashboard uses and from ``skilljobs workers``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from jobs.cli.app import app
from jobs.models import OpsAction, Worker
from jobs.queue import store, worker_control
from jobs.queue.worker import build_worker
from tests.helpers.jobs import dispatch, wait_status


async def _registered(services: Any, worker_id: str) -> None:
    for _ in range(200):
        async with services.sessionmaker() as s:
            if await s.get(Worker, worker_id) is not None:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"worker {worker_id} never registered")


@pytest.mark.slow
async def test_drain_finishes_the_running_job_takes_no_other_and_exits(services: Any) -> None:
    w = build_worker(services, handle_signals=False, scheduler=False, max_jobs=1)
    task = asyncio.create_task(w.async_run())
    try:
        wid = w.runner.worker_id if w.runner is not None else ""
        await _registered(services, wid)
        running = await dispatch(services, "bg_sleep", {"seconds": 2.5})
        await wait_status(services, running, {"running"})
        state = await worker_control.act(services, "drain", wid, actor="ops")
        assert state == {"ok": True, "id": wid, "paused": False, "draining": True}
        waiting = await dispatch(services, "bg_sleep", {"seconds": 0.05})
        # the worker returns on its own once its job is done
        await asyncio.wait_for(asyncio.shield(task), 30)
        assert (await store.get_job(services.sessionmaker, running)).status == "succeeded"
        assert (await store.get_job(services.sessionmaker, waiting)).status == "queued"
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await w.close()
    async with services.sessionmaker() as s:
        worker = await s.get(Worker, wid)
        assert worker is not None and worker.stopped_at is not None
        acts = (await s.scalars(select(OpsAction).where(OpsAction.target == wid))).all()
    assert [(a.action, a.actor) for a in acts] == [("worker.drain", "ops")]
    # a stopped worker has nothing to drain or pause
    with pytest.raises(worker_control.WorkerControlError, match="has stopped") as err:
        await worker_control.act(services, "drain", wid, actor="ops")
    assert err.value.status_code == 409


@pytest.mark.slow
async def test_pause_holds_new_jobs_until_resume(services: Any) -> None:
    w = build_worker(services, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    try:
        wid = w.runner.worker_id if w.runner is not None else ""
        await _registered(services, wid)
        await worker_control.act(services, "pause", wid, actor="ops")
        # the worker reads its flags once a second (later on a loaded host): until it has
        deadline = time.monotonic() + 15
        while not w._paused:
            assert time.monotonic() < deadline, "the worker never saw its pause flag"
            await asyncio.sleep(0.05)
        job_id = await dispatch(services, "bg_sleep", {"seconds": 0.05})
        await asyncio.sleep(2.0)
        assert (await store.get_job(services.sessionmaker, job_id)).status == "queued"
        [listed] = [x for x in await worker_control.list_workers(services) if x["id"] == wid]
        assert listed["state"] == "alive" and listed["paused"] and not listed["draining"]
        assert await worker_control.act(services, "resume", wid, actor="ops") == {
            "ok": True,
            "id": wid,
            "paused": False,
            "draining": False,
        }
        await wait_status(services, job_id, {"succeeded"})
        assert not task.done()  # paused and resumed, never exited
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await w.close()


async def test_unknown_worker_and_action(services: Any) -> None:
    with pytest.raises(worker_control.WorkerControlError, match="no worker nope") as err:
        await worker_control.act(services, "drain", "nope", actor="ops")
    assert err.value.status_code == 404
    with pytest.raises(worker_control.WorkerControlError, match="unknown action") as err:
        await worker_control.act(services, "explode", "nope", actor="ops")
    assert err.value.status_code == 422


def _cli_env(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    for key, value in {
        "SKILLJOBS_DATA_DIR": str(settings.data_dir),
        "SKILLJOBS_DATABASE_URL": settings.resolved_database_url,
        "SKILLJOBS_REDIS_URL": str(settings.redis_url),
        "SKILLJOBS_REDIS_PREFIX": settings.redis_prefix,
        "SKILLJOBS_QUEUE_NAME": settings.queue_name,
        "SKILLJOBS_SKILLS_PATH": str(settings.skills_path),
        "COLUMNS": "220",
    }.items():
        monkeypatch.setenv(key, value)


@pytest.mark.slow
async def test_cli_lists_and_drains_a_worker(
    services: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with services.sessionmaker() as s:
        s.add(Worker(id="node-7:99:abc", host="node-7", pid=99, running=["j1"]))
        await s.commit()
    _cli_env(monkeypatch, services.settings)
    runner = CliRunner()

    async def cli(*args: str) -> Any:
        return await asyncio.to_thread(runner.invoke, app, ["workers", *args])

    res = await cli("drain", "node-7:99:abc")
    assert res.exit_code == 0, res.output
    assert "draining: it takes no new jobs, finishes what it runs, then exits" in res.output
    res = await cli("list")
    assert res.exit_code == 0, res.output
    assert "node-7:99:abc" in res.output and "draining" in res.output and "alive" in res.output
    res = await cli("resume", "node-7:99:abc")
    assert res.exit_code == 0 and "resumed" in res.output
    assert (await worker_control.states(services, ["node-7:99:abc"]))["node-7:99:abc"] == {
        "paused": False,
        "draining": False,
    }
    res = await cli("pause", "ghost")
    assert res.exit_code == 1 and "no worker ghost" in res.output
    async with services.sessionmaker() as s:
        acts = (
            await s.scalars(
                select(OpsAction).where(OpsAction.target == "node-7:99:abc").order_by(OpsAction.id)
            )
        ).all()
    assert [(a.action, a.actor) for a in acts] == [
        ("worker.drain", "cli"),
        ("worker.resume", "cli"),
    ]
