"""A job whose skill environment is being built shows ``preparing environment``: on its row,
in the dashboard's JSON API, in ``skilljobs jobs show`` — and no longer once the skill runs.

The build is held up the way a second worker holds it up: another process owns the
environment's build lock; the worker waits for it (and the test watches), then builds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dashboard.app import create_app
from jobs.execution.envs import PREPARING, EnvManager, spec_for
from jobs.queue import store
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.worker import build_worker
from jobs.services import Services
from tests.helpers.jobs import wait_status
from tests.helpers.settings import ADMIN_AUTH, MARKET_SKILLS, make_settings

MARKET = MARKET_SKILLS
CTX = {"channel": "web", "role_id": "r1", "org_id": "o1", "session_id": "sess-1"}
pytestmark = pytest.mark.network


@pytest.fixture
async def svc(  # type: ignore[no-untyped-def]
    tmp_path: Path, database_url: str, redis_server_url: str, redis_prefix: str
):
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=str(MARKET),
    )
    services = await Services.open(settings)
    yield services
    await services.close()


@contextlib.contextmanager
def build_lock_held(path: Path) -> Iterator[None]:
    """The environment's build lock, held by another process (as a peer worker would)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the holder exits, the lock is released
        holder.wait(10)


def cli(svc: Services, *args: str) -> str:
    env = {
        **os.environ,
        "SKILLJOBS_DATABASE_URL": svc.settings.database_url or "",
        "SKILLJOBS_DATA_DIR": str(svc.settings.data_dir),
        "SKILLJOBS_SKILLS_PATH": str(MARKET),
        "COLUMNS": "200",
    }
    res = subprocess.run(
        [sys.executable, "-m", "jobs.cli.app", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


async def wait_phase(svc: Services, job_id: str, want: str | None, limit: float = 30.0) -> Any:
    for _ in range(int(limit / 0.05)):
        job = await store.get_job(svc.sessionmaker, job_id)
        assert job is not None
        phase = job.current_phase()
        if (phase and phase["name"]) == want:
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} never showed phase {want!r}")


@pytest.mark.slow
async def test_job_shows_preparing_environment(svc: Services) -> None:
    skill = svc.registry.get("pep723_media")
    assert skill is not None
    spec = spec_for(skill)
    assert spec is not None
    envs = EnvManager.from_settings(svc.settings)
    app = create_app(svc.settings, services=svc)
    api = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", headers=ADMIN_AUTH
    )
    answer = await Dispatcher(svc).dispatch(
        "pep723_media", {"prompt": "A Red Fox"}, CTX, "orgdeleg:acme"
    )
    assert answer.status_code == 202, answer.body
    job_id = answer.body["job_id"]
    worker = build_worker(svc, burst=True, handle_signals=False, scheduler=False)
    try:
        with build_lock_held(envs.root / f"{spec.dirname}.lock"):
            run = asyncio.create_task(worker.async_run())
            await wait_phase(svc, job_id, PREPARING)
            shown = (await api.get(f"/api/v1/jobs/{job_id}")).json()
            assert shown["status"] == "running" and shown["phase"] == "preparing environment"
            assert shown["phase_detail"] == "PEP 723 block in generate.py" and shown["phase_since"]
            listed = (await api.get("/api/v1/jobs?status=running")).json()["items"]
            assert [j["phase"] for j in listed] == ["preparing environment"]
            out = await asyncio.to_thread(cli, svc, "jobs", "show", job_id)
            assert "phase: preparing environment (PEP 723 block in generate.py)" in out
            out = await asyncio.to_thread(cli, svc, "jobs", "list", "--status", "running")
            assert "running (preparing environment)" in out
        await asyncio.wait_for(run, 120)
    finally:
        await worker.close()
        await api.aclose()
    job = await wait_status(svc, job_id, {"succeeded", "failed"})
    assert job.status == "succeeded", job.error
    assert job.current_phase() is None
    shown = (await api_get(svc, f"/api/v1/jobs/{job_id}")).json()
    assert shown["phase"] is None
    assert "phase:" not in await asyncio.to_thread(cli, svc, "jobs", "show", job_id)


async def test_phase_is_fenced_and_not_carried_to_a_later_attempt(svc: Services) -> None:
    """A phase written by an attempt that lost its lease is refused; one left behind by a
    dead attempt is not shown for the next attempt."""
    answer = await Dispatcher(svc).dispatch(
        "pep723_media", {"prompt": "A Red Fox"}, CTX, "orgdeleg:acme"
    )
    job_id = answer.body["job_id"]
    job = await store.get_job(svc.sessionmaker, job_id)
    assert job is not None
    claimed = await store.claim(svc.sessionmaker, job_id, job.lease_token, "w1", 30.0)
    assert claimed is not None
    assert not await store.set_phase(svc.sessionmaker, job_id, claimed.token - 1, PREPARING)
    assert await store.set_phase(svc.sessionmaker, job_id, claimed.token, PREPARING, "x")
    job = await store.get_job(svc.sessionmaker, job_id)
    assert job is not None and job.current_phase() == {
        "name": PREPARING,
        "detail": "x",
        "since": job.phase["since"],  # type: ignore[index]
    }
    # the attempt dies; the job is handed back and claimed again
    new = await store.requeue(
        svc.sessionmaker, job_id, claimed.token, reason="lost", error_type="lost", delay=0
    )
    assert new is not None
    again = await store.claim(svc.sessionmaker, job_id, new, "w2", 30.0)
    assert again is not None
    job = await store.get_job(svc.sessionmaker, job_id)
    assert job is not None and job.status == "running" and job.phase is not None
    assert job.current_phase() is None


async def api_get(svc: Services, path: str) -> httpx.Response:
    app = create_app(svc.settings, services=svc)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers=ADMIN_AUTH,
    ) as api:
        return await api.get(path)
