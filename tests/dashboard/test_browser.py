"""The dashboard in a real browser (headless Chromium) against a real app, Redis, database
and ``skilljobs worker``: a dispatched job appears and finishes live, retry adds an attempt,
skill output stays text. Saves the README's screenshot into the ``screenshots`` folder
(a temporary one unless ``make screenshots`` asks for ``docs/``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dashboard.app import create_app
from jobs.db import create_engine, create_sessionmaker
from jobs.models import Job, new_id
from tests.helpers.dashboard import TOKEN, LiveServer
from tests.helpers.settings import IN_CI, make_settings

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]


def _need_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    reason = f"Chromium not found at {CHROMIUM} (install it: apt-get install -y chromium)"
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def env_settings(tmp_path: Path, redis_server_url: str, redis_prefix: str, sqlite_url: str):  # type: ignore[no-untyped-def]
    return make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=sqlite_url,
        api_token=TOKEN,
        worker_heartbeat_sec=1.0,
    )


@pytest.fixture
def worker(env_settings: Any, tmp_path: Path, redis: Any) -> Any:
    """A real ``skilljobs worker`` process on the test's Redis prefix and database."""
    s = env_settings
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SKILLJOBS_") and k not in ("HTTP_PROXY", "HTTPS_PROXY")
    }
    env.update(
        SKILLJOBS_REDIS_URL=s.redis_url,
        SKILLJOBS_DATABASE_URL=s.resolved_database_url,
        SKILLJOBS_DATA_DIR=str(s.data_dir),
        SKILLJOBS_SECRET_KEY=s.secret_key.get_secret_value(),
        SKILLJOBS_REDIS_PREFIX=s.redis_prefix,
        SKILLJOBS_QUEUE_NAME=s.queue_name,
        SKILLJOBS_WORKER_HEARTBEAT_SEC="1",
        SKILLJOBS_LOG_LEVEL="WARNING",
    )
    exe = shutil.which("skilljobs", path=str(Path(sys.executable).parent)) or "skilljobs"
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [exe, "worker"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    log.close()


@pytest.fixture
async def live(env_settings: Any) -> AsyncIterator[LiveServer]:
    async with LiveServer(create_app(env_settings)) as server:
        yield server


async def _wait_for_worker(http: httpx.AsyncClient, url: str, proc: Any, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (await asyncio.to_thread(log.read_text))[-2000:]
            pytest.fail(f"worker exited ({proc.returncode}): {tail}")
        items = (await http.get(f"{url}/api/v1/workers")).json()["items"]
        if any(w["alive"] for w in items):
            return
        await asyncio.sleep(0.3)
    pytest.fail("no worker heartbeat within 60 s")


async def test_dashboard_live_in_chromium(
    live: LiveServer, worker: Any, env_settings: Any, tmp_path: Path, screenshots: Path
) -> None:
    _need_chromium()
    from playwright.async_api import async_playwright

    auth = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(headers=auth, timeout=30) as http:
        await _wait_for_worker(http, live.url, worker, tmp_path / "worker.log")

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                await _scenario(browser, http, live.url, env_settings, screenshots)
            finally:
                await browser.close()


async def _scenario(
    browser: Any, http: httpx.AsyncClient, url: str, settings: Any, screenshots: Path
) -> None:
    # Without a token the page asks for one; the form unlocks it.
    ctx = await browser.new_context(viewport={"width": 1440, "height": 960})
    page = await ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{url}/")
    await page.wait_for_selector("#login", state="visible")
    await page.fill("#login-token", "wrong-token")
    await page.click("#login-form button[type=submit]")
    await page.wait_for_function(
        "() => document.querySelector('#login-error').textContent.includes('not accepted')"
    )
    await page.fill("#login-token", TOKEN)
    await page.click("#login-form button[type=submit]")
    await page.wait_for_selector("#app", state="visible")
    await ctx.close()

    # ?token= once: used, then dropped from the address bar; the browser session is an
    # HttpOnly cookie no page script can read, and nothing is kept in page storage.
    ctx = await browser.new_context(viewport={"width": 1440, "height": 960})
    page = await ctx.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{url}/?token={TOKEN}")
    await page.wait_for_selector("#app", state="visible")
    assert "token" not in page.url
    assert await page.evaluate("sessionStorage.length + localStorage.length") in (0, 1)
    assert "skilljobs_session" not in await page.evaluate("document.cookie")
    [cookie] = [c for c in await ctx.cookies() if c["name"] == "skilljobs_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] == -1
    await page.wait_for_selector("#live.on")
    await page.evaluate("window.__sameDocument = true")
    await page.click("#tabs button[data-tab=jobs]")

    ctx_origin = {"channel": "web", "session_id": "browser-s1", "role_id": "r1", "org_id": "o1"}
    resp = await http.post(
        f"{url}/api/v1/dispatch",
        json={
            "skill": "sales_report",
            "input": {"region": "north", "days": 5, "seconds": 1.5},
            "context": ctx_origin,
            "external_id": "orgdeleg:browser-test",
        },
    )
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["job_id"]
    row = f'#jobs tbody tr[data-job-id="{job_id}"]'
    # appears and finishes without a reload
    await page.wait_for_selector(row, timeout=15000)
    await page.wait_for_selector(f"{row} .st-succeeded", timeout=90000)

    await page.click(row)
    await page.wait_for_selector(f'#detail[data-job-id="{job_id}"]')
    await page.wait_for_function(
        "() => document.querySelectorAll('#detail-attempts li[data-outcome]').length === 1"
    )
    dialogs: list[str] = []

    async def _accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        await dialog.accept()

    page.on("dialog", _accept)
    await page.click("#act-retry")
    await page.wait_for_function(
        "() => document.querySelectorAll('#detail-attempts li[data-outcome]').length === 2 && "
        "document.querySelector('#detail').dataset.status === 'succeeded'",
        timeout=90000,
    )
    assert dialogs and job_id in dialogs[0]
    assert await page.evaluate("window.__sameDocument") is True
    artifacts = await page.locator("#detail-artifacts li").count()
    assert artifacts >= 1
    # the PNG the skill drew is shown inline, from its downloaded bytes
    await page.wait_for_selector("#detail-artifacts img.preview")
    assert (
        await page.evaluate(
            "() => document.querySelector('#detail-artifacts img.preview').naturalWidth"
        )
        > 0
    )
    # (cropped above the result, whose local paths point into the test's temp dir)
    await page.set_viewport_size({"width": 1440, "height": 840})
    await page.screenshot(path=str(screenshots / "dashboard.png"), full_page=False)

    # (functions, not expression strings: the page's CSP forbids eval, as it should)
    # The retry is in the audit trail with the dashboard as actor.
    engine = create_engine(settings.resolved_database_url)
    try:
        evil = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
        evil_id = new_id()
        async with create_sessionmaker(engine)() as s:
            from sqlalchemy import select

            from jobs.models import OpsAction

            acts = (await s.execute(select(OpsAction.action, OpsAction.target))).all()
            assert ("retry", job_id) in [tuple(a) for a in acts]
            now = time.time()
            s.add(
                Job(
                    id=evil_id,
                    skill="echo",
                    status="failed",
                    result={"message": evil},
                    error=evil,
                    created_at=now,
                    queued_at=now,
                    finished_at=now,
                )
            )
            await s.commit()
    finally:
        await engine.dispose()
    await page.click("#filters button[type=submit]")
    await page.click(f'#jobs tbody tr[data-job-id="{evil_id}"]')
    await page.wait_for_selector(f'#detail[data-job-id="{evil_id}"]')
    shown = await page.text_content("#detail-outcome")
    assert shown is not None and "<script>window.__pwned=2</script>" in shown
    assert await page.evaluate("window.__pwned") is None
    assert await page.locator("#detail img").count() == 0

    # Schedules: a run stopped by the empty-result guard, and disabling behind a confirm.
    await _seed_schedule(settings)
    await page.click("#tabs button[data-tab=schedules]")
    await page.click("#schedules tbody tr a")
    await page.wait_for_selector("#runs-list .run")
    runs_text = await page.text_content("#runs-list") or ""
    assert "stopped by the empty-result guard" in runs_text and "skipped" in runs_text
    await page.click("#schedules tbody tr button:has-text('Disable')")
    await page.wait_for_selector("#schedules tbody tr button:has-text('Enable')")
    assert any("Disable schedule browser-daily" in d for d in dialogs)

    # Workers: a paused worker takes no new job; resumed, it runs it.
    await page.click("#tabs button[data-tab=workers]")
    await page.click("#workers tbody tr[data-paused=no] button:has-text('Pause')")
    await page.wait_for_selector("#workers tbody tr[data-paused=yes]")
    await asyncio.sleep(1.2)  # the worker reads its pause key at most once a second
    resp = await http.post(
        f"{url}/api/v1/dispatch",
        json={
            "skill": "sales_report",
            "input": {"seconds": 0.1},
            "context": ctx_origin,
            "external_id": "orgdeleg:browser-paused",
        },
    )
    assert resp.status_code == 202, resp.text
    held = resp.json()["job_id"]
    await asyncio.sleep(3)
    assert (await http.get(f"{url}/api/v1/jobs/{held}")).json()["status"] == "queued"
    await page.click("#workers tbody tr[data-paused=yes] button:has-text('Resume')")
    await page.wait_for_selector("#workers tbody tr[data-paused=no]")
    deadline = time.monotonic() + 60
    while (await http.get(f"{url}/api/v1/jobs/{held}")).json()["status"] != "succeeded":
        assert time.monotonic() < deadline, "the resumed worker did not run the job"
        await asyncio.sleep(0.3)
    assert errors == []
    await ctx.close()


async def _seed_schedule(settings: Any) -> None:
    from jobs.models import ChainRun, ChainStep, Schedule

    now = time.time()
    engine = create_engine(settings.resolved_database_url)
    try:
        async with create_sessionmaker(engine)() as s:
            sched = Schedule(name="browser-daily", cron="0 9 * * *", steps=[], next_fire_at=now)
            s.add(sched)
            await s.flush()
            run = ChainRun(
                schedule_id=sched.id,
                fire_key="cron:1",
                fire_at=now,
                status="stopped_empty",
                finished_at=now,
            )
            s.add(run)
            await s.flush()
            s.add_all(
                [
                    ChainStep(
                        run_id=run.id,
                        idx=0,
                        step_id="fetch",
                        skill="echo",
                        status="stopped_empty",
                        output={"rows": []},
                    ),
                    ChainStep(
                        run_id=run.id, idx=1, step_id="report", skill="echo", status="skipped"
                    ),
                ]
            )
            await s.commit()
    finally:
        await engine.dispose()
