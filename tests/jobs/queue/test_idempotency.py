"""Idempotent dispatch on SQLite and PostgreSQL: a retried dispatch never starts the work twice."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import httpx
import pytest
from sqlalchemy import func, select

from dashboard.app import create_app
from jobs.models import DispatchKey, Job
from jobs.queue import idempotency
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.prune import prune
from tests.helpers.jobs import TG
from tests.helpers.settings import ADMIN_AUTH, ROOT


async def _jobs(services) -> int:  # type: ignore[no-untyped-def]
    async with services.sessionmaker() as s:
        return int(await s.scalar(select(func.count()).select_from(Job)) or 0)


@pytest.mark.slow
async def test_same_key_same_receipt(services) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(services)
    first = await d.dispatch("bg_sleep", {"seconds": 0.01}, TG, idempotency_key="k-1")
    again = await d.dispatch("bg_sleep", {"seconds": 0.01}, TG, idempotency_key="k-1")
    assert first.status_code == again.status_code == 202
    assert first.body["job_id"] == again.body["job_id"]
    assert await _jobs(services) == 1
    other = await d.dispatch("bg_sleep", {"seconds": 0.01}, TG, idempotency_key="k-2")
    assert other.body["job_id"] != first.body["job_id"]
    no_key = await d.dispatch("bg_sleep", {"seconds": 0.01}, TG)
    assert no_key.status_code == 202 and await _jobs(services) == 3


@pytest.mark.slow
async def test_same_key_other_request_is_a_conflict(services) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(services)
    first = await d.dispatch("bg_sleep", {"seconds": 0.01}, TG, idempotency_key="k-c")
    clash = await d.dispatch("bg_sleep", {"seconds": 9}, TG, idempotency_key="k-c")
    assert clash.status_code == 409
    assert "k-c" in clash.body["error"] and clash.body["job_id"] == first.body["job_id"]
    bad = await d.dispatch("bg_sleep", {}, TG, idempotency_key="")
    assert bad.status_code == 400 and "idempotency_key" in bad.body["error"]
    assert await _jobs(services) == 1


@pytest.mark.slow
async def test_concurrent_duplicates_make_one_job(services) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(services)
    answers = await asyncio.gather(
        *(d.dispatch("bg_sleep", {"seconds": 0.01}, TG, idempotency_key="k-race") for _ in range(8))
    )
    assert {a.status_code for a in answers} == {202}
    assert len({a.body["job_id"] for a in answers}) == 1
    assert await _jobs(services) == 1


@pytest.mark.slow
async def test_key_past_its_window_makes_a_new_job(services) -> None:  # type: ignore[no-untyped-def]
    d = Dispatcher(services)
    first = await d.dispatch("bg_sleep", {"seconds": 0.01}, TG, idempotency_key="k-old")
    async with services.sessionmaker() as s:
        row = await s.get(DispatchKey, idempotency.scoped("k-old", TG))
        row.created_at -= idempotency.WINDOW_SEC + 60
        await s.commit()
    later = await d.dispatch("bg_sleep", {"seconds": 0.01}, TG, idempotency_key="k-old")
    assert later.status_code == 202 and later.body["job_id"] != first.body["job_id"]
    # the pruner forgets keys past their window
    async with services.sessionmaker() as s:
        row = await s.get(DispatchKey, idempotency.scoped("k-old", TG))
        row.created_at -= idempotency.WINDOW_SEC + 60
        await s.commit()
    await prune(services.sessionmaker, services.settings)
    async with services.sessionmaker() as s:
        assert await s.get(DispatchKey, idempotency.scoped("k-old", TG)) is None


@pytest.mark.slow
async def test_http_header_and_body_key(services) -> None:  # type: ignore[no-untyped-def]
    app = create_app(services.settings, services=services)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers=ADMIN_AUTH,
    ) as c:
        body = {"skill": "bg_sleep", "input": {"seconds": 0.01}, "context": TG}
        a = await c.post("/api/v1/dispatch", json=body, headers={"Idempotency-Key": "h-1"})
        b = await c.post("/api/v1/dispatch", json=body, headers={"Idempotency-Key": "h-1"})
        c2 = await c.post("/api/v1/dispatch", json={**body, "idempotency_key": "h-1"})
    assert a.status_code == b.status_code == c2.status_code == 202, a.text
    assert a.json()["job_id"] == b.json()["job_id"] == c2.json()["job_id"]
    assert await _jobs(services) == 1


@pytest.mark.slow
async def test_two_processes_one_job(services, job_settings) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
    env.update(
        SKILLJOBS_DATABASE_URL=job_settings.database_url,
        SKILLJOBS_REDIS_URL=job_settings.redis_url,
        SKILLJOBS_REDIS_PREFIX=job_settings.redis_prefix,
        SKILLJOBS_QUEUE_NAME=job_settings.queue_name,
        SKILLJOBS_SKILLS_PATH=job_settings.skills_path,
        SKILLJOBS_DATA_DIR=str(job_settings.data_dir),
        SKILLJOBS_SECRET_KEY=job_settings.secret_key.get_secret_value(),
    )
    args = [
        sys.executable, "-m", "jobs.cli.app", "dispatch", "bg_sleep",
        "--input", json.dumps({"seconds": 0.01}), "--channel", "telegram",
        "--actor-key", "tg-1", "--role", "r1", "--idempotency-key", f"p-{time.time_ns()}",
    ]  # fmt: skip
    procs = [
        await asyncio.create_subprocess_exec(
            *args, env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE
        )
        for _ in range(2)
    ]
    outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 60)
    assert all(p.returncode == 0 for p in procs), outs
    ids = {json.loads(out)["job_id"] for out, _ in outs}
    assert len(ids) == 1
    assert await _jobs(services) == 1
