"""A running job that prepares its skill environment, in headless Chromium: the jobs list
and the job's detail show "preparing environment" next to its status, and the phase goes
away live (a job event, as the runner publishes it) once the build is over."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dashboard.app import create_app
from jobs.models import Job, new_id
from jobs.queue import broker, store
from jobs.services import Services
from tests.dashboard.test_browser import CHROMIUM, CHROMIUM_ARGS, _need_chromium
from tests.helpers.dashboard import TOKEN, LiveServer
from tests.helpers.settings import make_settings

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


@pytest.fixture
async def svc(tmp_path, redis_server_url: str, redis_prefix: str, sqlite_url: str):  # type: ignore[no-untyped-def]
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=sqlite_url,
        api_token=TOKEN,
    )
    services = await Services.open(settings)
    yield services
    await services.close()


@pytest.fixture
async def live(svc: Services) -> AsyncIterator[LiveServer]:
    async with LiveServer(create_app(svc.settings, services=svc)) as server:
        yield server


async def _running_job(svc: Services) -> tuple[str, int]:
    now = time.time()
    job = Job(
        id=new_id(),
        skill="pep723_media",
        status="queued",
        channel="web",
        role_id="r1",
        session_id="s1",
        created_at=now - 5,
        queued_at=now - 5,
    )
    async with svc.sessionmaker() as s:
        s.add(job)
        await s.commit()
    claimed = await store.claim(svc.sessionmaker, job.id, 0, "worker-a1", 60.0)
    assert claimed is not None
    return job.id, claimed.token


async def test_phase_in_the_jobs_list_and_detail(svc: Services, live: LiveServer) -> None:
    _need_chromium()
    from playwright.async_api import async_playwright

    job_id, token = await _running_job(svc)
    assert await store.set_phase(
        svc.sessionmaker, job_id, token, "preparing environment", "PEP 723 block in generate.py"
    )
    row = f'#jobs tbody tr[data-job-id="{job_id}"]'
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            errors: list[Any] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{live.url}/?token={TOKEN}#/jobs?status=running")
            await page.wait_for_selector(f"{row} td.status .phase")
            cell = await page.text_content(f"{row} td.status") or ""
            assert "running" in cell and "preparing environment" in cell
            title = await page.get_attribute(f"{row} td.status .phase", "title")
            assert title == "PEP 723 block in generate.py"
            await page.goto(f"{live.url}/#/jobs/{job_id}")
            await page.wait_for_selector(f'#detail[data-job-id="{job_id}"] #detail-title .phase')
            assert "preparing environment" in (await page.text_content("#detail-title") or "")

            # the build is over: the runner clears the phase and publishes a job event
            await page.goto(f"{live.url}/#/jobs?status=running")
            await page.wait_for_selector(f"{row} td.status .phase")
            await page.wait_for_function("() => document.querySelector('#live.on') !== null")
            assert await store.set_phase(svc.sessionmaker, job_id, token, None)
            await broker.publish_events(svc, [(job_id, "running", "pep723_media")])
            await page.wait_for_function(
                f"() => !document.querySelector('{row} td.status .phase')", timeout=15000
            )
            assert "running" in (await page.text_content(f"{row} td.status") or "")
            assert errors == []
        finally:
            await browser.close()
