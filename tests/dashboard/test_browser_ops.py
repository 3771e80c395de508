"""The operator controls of the dashboard in headless Chromium (desktop and phone): one
sign-in for every tab (HttpOnly cookie), per-row selection and bulk delete, sortable
columns, the error column, the pause switch per skill, the workers page with its figures
and "forget", schedule create/edit/delete, time zones on times, a deep-linked job first on
a phone, and the page in Chinese (switch, browser language, SKILLJOBS_LANGUAGE)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dashboard.app import create_app
from jobs.constants import WORKER_HEARTBEAT
from jobs.db import create_engine, create_sessionmaker
from jobs.models import Job, Worker, new_id
from tests.dashboard.test_browser import CHROMIUM, CHROMIUM_ARGS, _need_chromium
from tests.helpers.dashboard import TOKEN, LiveServer
from tests.helpers.settings import make_settings

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def env_settings(tmp_path: Path, redis_server_url: str, redis_prefix: str, sqlite_url: str):  # type: ignore[no-untyped-def]
    return make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=sqlite_url,
        api_token=TOKEN,
    )


@pytest.fixture
async def live(env_settings: Any, redis: Any) -> AsyncIterator[LiveServer]:
    async with LiveServer(create_app(env_settings)) as server:
        yield server


def _job(now: float, **kw: Any) -> Job:
    values: dict[str, Any] = {
        "id": new_id(),
        "skill": "sales_report",
        "status": "succeeded",
        "attempts": 1,
        "channel": "telegram",
        "role_id": "r1",
        "actor_key": "4711",
        "input": {},
        "created_at": now,
        "queued_at": now,
    }
    values.update(kw)
    if values["status"] in ("succeeded", "failed"):
        values.setdefault("started_at", values["created_at"] + 1)
        values.setdefault("finished_at", values["created_at"] + 2)
        values.setdefault("duration_ms", 1000.0)
    return Job(**values)


async def _seed(settings: Any, redis: Any) -> dict[str, Any]:
    now = time.time()
    jobs = {
        "done1": _job(now - 50, skill="image_gen"),
        "done2": _job(now - 40, skill="echo"),
        "failed": _job(now - 30, status="failed", error="upstream 503: quota exceeded"),
        "queued": _job(now - 20, status="queued"),
    }
    engine = create_engine(settings.resolved_database_url)
    try:
        async with create_sessionmaker(engine)() as s:
            s.add_all(jobs.values())
            s.add(
                Worker(id="w-live", host="node-1", pid=11, started_at=now - 600, last_heartbeat=now)
            )
            s.add(
                Worker(
                    id="w-gone",
                    host="node-2",
                    pid=12,
                    started_at=now - 9000,
                    last_heartbeat=now - 8000,
                    stopped_at=now - 8000,
                )
            )
            await s.commit()
    finally:
        await engine.dispose()
    beat = {
        "id": "w-live",
        "concurrency": 8,
        "processed": 1234,
        "failed": 5,
        "rss_bytes": 150 * 1024 * 1024,
        "started_at": now - 600,
        "version": "9.9.9",
    }
    await redis.set(settings.key(WORKER_HEARTBEAT, "w-live"), json.dumps(beat), ex=120)
    return {k: j.id for k, j in jobs.items()}


async def _open(browser: Any, url: str, hash_: str = "", **kw: Any) -> tuple[Any, Any, list[str]]:
    kw.setdefault("viewport", {"width": 1440, "height": 960})
    ctx = await browser.new_context(**kw)
    page = await ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda d: d.accept())
    await page.goto(f"{url}/?token={TOKEN}{hash_}")
    await page.wait_for_selector("#app", state="visible")
    return ctx, page, errors


async def test_operator_controls(
    live: LiveServer, env_settings: Any, redis: Any, screenshots: Path
) -> None:
    _need_chromium()
    from playwright.async_api import async_playwright

    ids = await _seed(env_settings, redis)
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with (
        httpx.AsyncClient(base_url=live.url, headers=auth, timeout=30) as http,
        async_playwright() as pw,
    ):
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            await _desktop(browser, http, live.url, ids, screenshots)
            await _phone(browser, live.url, ids, screenshots)
            await _chinese(browser, live.url, screenshots)
        finally:
            await browser.close()


async def _rows(page: Any) -> list[str]:
    return await page.eval_on_selector_all(
        "#jobs tbody tr[data-job-id]", "rows => rows.map(r => r.dataset.jobId)"
    )


async def _desktop(
    browser: Any, http: httpx.AsyncClient, url: str, ids: dict[str, str], shots: Path
) -> None:
    ctx, page, errors = await _open(browser, url, "#/jobs", timezone_id="Asia/Shanghai")
    # a new tab of the same browser is signed in already (the cookie, not the tab)
    other = await ctx.new_page()
    await other.goto(f"{url}/#/workers")
    await other.wait_for_selector("#app", state="visible")
    await other.close()

    await page.wait_for_function(
        "() => document.querySelectorAll('#jobs tbody tr[data-job-id]').length === 4"
    )
    # the error column, and every time with its zone
    failed_row = f'#jobs tbody tr[data-job-id="{ids["failed"]}"]'
    assert "upstream 503: quota exceeded" in (await page.text_content(f"{failed_row} .error-cell"))
    created = await page.text_content(f"{failed_row} td:nth-child(2)")
    assert created and created.strip().endswith("GMT+8"), created
    # sortable columns: by skill, then the other way
    await page.click("#jobs thead th[data-sort=skill]")
    skills = await page.eval_on_selector_all(
        "#jobs tbody tr[data-job-id] td:nth-child(4)", "cells => cells.map(c => c.textContent)"
    )
    assert skills == sorted(skills)
    await page.click("#jobs thead th[data-sort=skill]")
    assert await page.get_attribute("#jobs thead th[data-sort=skill]", "aria-sort") == "descending"

    # per-row selection: delete the two finished jobs picked, not the others
    await page.check(f'#jobs tbody tr[data-job-id="{ids["done1"]}"] input.pick')
    await page.check(f'#jobs tbody tr[data-job-id="{ids["done2"]}"] input.pick')
    assert (await page.text_content("#selection-count")) == "2 selected"
    await _shot(page, shots, "jobs-selection")
    await page.click("#sel-delete")
    await page.wait_for_function(
        "() => document.querySelectorAll('#jobs tbody tr[data-job-id]').length === 2"
    )
    assert set(await _rows(page)) == {ids["failed"], ids["queued"]}
    assert (await http.get(f"/api/v1/jobs/{ids['done1']}")).status_code == 404

    # the pause switch of a skill; its queued job is shown paused
    await page.click("#tabs button[data-tab=overview]")
    switch = '#skill-switches tr[data-skill="sales_report"] input.skill-switch'
    await page.wait_for_selector(switch)
    await page.check(switch)
    await page.wait_for_selector('#skill-switches tr[data-skill="sales_report"][data-paused=yes]')
    assert (await http.get("/api/v1/skills")).json()["paused"] == ["sales_report"]
    await _shot(page, shots, "skill-pause")
    await page.click("#tabs button[data-tab=jobs]")
    await page.wait_for_selector(f'#jobs tbody tr[data-job-id="{ids["queued"]}"] .st-paused')

    # workers: the figures of a live worker; a stopped one is forgotten
    await page.click("#tabs button[data-tab=workers]")
    live_row = '#workers tbody tr[data-worker-id="w-live"]'
    await page.wait_for_selector(live_row)
    text = await page.text_content(live_row) or ""
    for part in ("1234 / 5", "150 MiB", "9.9.9", "GMT+8"):
        assert part in text, (part, text)
    assert (await page.text_content(f"{live_row} .concurrency")) == "8"
    await _shot(page, shots, "workers-vitals")
    await page.click('#workers tbody tr[data-worker-id="w-gone"] button.forget')
    await page.wait_for_selector('#workers tbody tr[data-worker-id="w-gone"]', state="detached")
    assert [w["id"] for w in (await http.get("/api/v1/workers")).json()["items"]] == ["w-live"]

    # schedules: create, edit, delete
    await page.click("#tabs button[data-tab=schedules]")
    await page.click("#schedule-new")
    body = {"name": "from-browser", "cron": "0 9 * * *", "timezone": "Asia/Shanghai",
            "steps": [{"skill": "echo", "input": {"text": "hi"}}]}  # fmt: skip
    await page.fill("#schedule-json", json.dumps(body))
    await page.click("#schedule-save")
    row = '#schedules tbody tr:has-text("from-browser")'
    await page.wait_for_selector(row)
    assert "GMT+8" in (await page.text_content(f"{row} td:nth-child(5)") or "")
    await page.click(f"{row} button.edit")
    edited = json.loads(await page.input_value("#schedule-json"))
    assert edited["name"] == "from-browser" and "id" not in edited
    edited["cron"] = "30 8 * * 1-5"
    await page.fill("#schedule-json", json.dumps(edited))
    await page.click("#schedule-save")
    await page.wait_for_selector(f'{row}:has-text("30 8 * * 1-5")')
    await page.click("#schedule-new")
    await page.fill("#schedule-json", json.dumps({**body, "cron": "nope"}))
    await page.click("#schedule-save")
    await page.wait_for_function(
        "() => document.querySelector('#schedule-problems').textContent.includes('cron')"
    )
    await page.click("#schedule-cancel")
    await page.click(f"{row} button.delete")
    await page.wait_for_selector(row, state="detached")
    assert (await http.get("/api/v1/schedules")).json()["items"] == []
    actions = [a["action"] for a in (await http.get("/api/v1/audit")).json()["items"]]
    for done in ("schedule.create", "schedule.update", "schedule.delete", "skill.pause"):
        assert done in actions
    assert "bulk.delete" in actions and "worker.forget" in actions
    assert errors == []
    await ctx.close()


async def _phone(browser: Any, url: str, ids: dict[str, str], shots: Path) -> None:
    """A deep link to a job on a phone shows the job first, not the list."""
    ctx, page, errors = await _open(
        browser,
        url,
        f"#/jobs/{ids['failed']}",
        viewport={"width": 390, "height": 844},
        is_mobile=True,
        has_touch=True,
        device_scale_factor=2,
    )
    await page.wait_for_selector(f'#detail[data-job-id="{ids["failed"]}"]')
    detail = await page.eval_on_selector("#detail", "e => e.getBoundingClientRect().top")
    jobs = await page.eval_on_selector(".card.jobs", "e => e.getBoundingClientRect().top")
    assert detail < jobs and detail < 844, (detail, jobs)
    overflow = await page.evaluate("document.documentElement.scrollWidth - innerWidth")
    assert overflow <= 1
    await _shot(page, shots, "phone-deep-link")
    assert errors == []
    await ctx.close()


async def _chinese(browser: Any, url: str, shots: Path) -> None:
    # the browser's language by default
    ctx, page, errors = await _open(browser, url, "#/jobs", locale="zh-CN")
    await page.wait_for_function(
        "() => document.querySelector('#tabs button[data-tab=jobs]').textContent === '任务'"
    )
    assert await page.text_content("#jobs thead th[data-sort=error]") == "错误"
    await _shot(page, shots, "zh")
    # the switch in the page, kept for this browser
    await page.select_option("#lang", "en")
    await page.wait_for_function(
        "() => document.querySelector('#tabs button[data-tab=jobs]').textContent === 'Jobs'"
    )
    await page.reload()
    await page.wait_for_selector("#app", state="visible")
    assert await page.text_content("#tabs button[data-tab=jobs]") == "Jobs"
    await page.select_option("#lang", "zh")
    await page.click("#tabs button[data-tab=workers]")
    await page.wait_for_function(
        "() => document.querySelector('#workers thead').textContent.includes('并发')"
    )
    assert errors == []
    await ctx.close()


async def _shot(page: Any, shots: Path, name: str) -> None:
    await page.wait_for_timeout(150)
    await page.screenshot(path=str(shots / f"ops-{name}.png"), full_page=False)
