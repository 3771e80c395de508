"""Every dashboard page in headless Chromium against a real app, Redis and database:
each page loads from its own address, deep links survive a reload, back/forward walk the
pages, actions (bulk retry, incident ack, schedule disable, chain re-run) change what the
API says, skill text stays text, the read-only token sees no action, a phone-sized window
has no sideways scroll. Screenshots go to the ``screenshots`` folder (a temporary one;
``make screenshots`` refreshes the README's)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from dashboard.app import create_app
from jobs.constants import RATELIMIT_WAITED, RATELIMIT_WAITS
from jobs.db import create_engine, create_sessionmaker
from jobs.models import (
    ChainRun,
    ChainStep,
    Delivery,
    Incident,
    Job,
    JobAttempt,
    OpsAction,
    Schedule,
    Worker,
    new_id,
)
from tests.dashboard.test_browser import CHROMIUM, CHROMIUM_ARGS, _need_chromium
from tests.helpers.dashboard import TOKEN, LiveServer
from tests.helpers.settings import make_settings

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

READ_TOKEN = "dash-read-token-7c1f0d5e3a9b8c7d6e2b9e4a"
EVIL = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
PAGES = ("overview", "jobs", "schedules", "deliveries", "incidents", "workers", "audit")


@pytest.fixture
def env_settings(tmp_path: Path, redis_server_url: str, redis_prefix: str, sqlite_url: str):  # type: ignore[no-untyped-def]
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=sqlite_url,
        api_token=TOKEN,
    )
    s.api_read_token = SecretStr(READ_TOKEN)
    return s


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
        "role_id": "r_sales",
        "org_id": "o1",
        "session_id": "tg-4711",
        "actor_key": "4711",
        "input": {"region": "north"},
        "result": {"ok": True, "message": "42 rows"},
        "created_at": now - 60,
        "queued_at": now - 60,
        "started_at": now - 58,
        "finished_at": now - 50,
        "duration_ms": 8000.0,
    }
    values.update(kw)
    return Job(**values)


async def _seed(settings: Any) -> dict[str, str]:
    now = time.time()
    engine = create_engine(settings.resolved_database_url)
    ids: dict[str, str] = {}
    try:
        async with create_sessionmaker(engine)() as s:
            jobs = [
                _job(now - i * 170, skill=skill, status=status, duration_ms=900.0 + 40 * i)
                for i, (skill, status) in enumerate(
                    [("sales_report", "succeeded"), ("image_gen", "succeeded")] * 10
                )
            ]
            flaky = [
                _job(
                    now - 300 - i * 400,
                    skill="flaky_fetch",
                    status="failed",
                    error="upstream 503: quota exceeded",
                    error_type="transient",
                    result=None,
                )
                for i in range(3)
            ]
            evil = _job(now - 20, skill="echo", status="failed", error=EVIL, result={"m": EVIL})
            s.add_all([*jobs, *flaky, evil])
            ids["job"] = jobs[0].id
            ids["flaky"] = flaky[0].id
            await s.flush()
            s.add(
                JobAttempt(
                    job_id=flaky[0].id,
                    number=1,
                    worker_id="worker-a1",
                    started_at=now - 310,
                    finished_at=now - 300,
                    outcome="failed",
                    error="upstream 503: quota exceeded",
                    duration_ms=10000.0,
                    stdout_tail="fetched page 1\nfetched page 2\n",
                    stderr_tail=f"HTTP 503 from upstream {EVIL}\n",
                )
            )
            ids["evil"] = evil.id
            sched = Schedule(
                name="daily-sales",
                cron="0 9 * * 1-5",
                timezone="Asia/Shanghai",
                identity={"role_id": "r_sales", "org_id": "o1", "session_id": "sched-daily"},
                steps=[
                    {"id": "fetch", "skill": "echo", "input": {"day": "yesterday"}},
                    {"id": "report", "skill": "echo", "input": {"rows": "$steps.fetch.data"}},
                ],
                deliver={"session_id": "sched-daily"},
                next_fire_at=now + 3600,
            )
            s.add(sched)
            await s.flush()
            ids["schedule"] = sched.id
            run = ChainRun(
                schedule_id=sched.id,
                fire_key="cron:1",
                fire_at=now - 600,
                status="failed",
                started_at=now - 600,
                finished_at=now - 590,
                error="step report failed",
            )
            missed = ChainRun(
                schedule_id=sched.id, fire_key="cron:0", fire_at=now - 90000, status="missed"
            )
            s.add_all([run, missed])
            await s.flush()
            ids["run"] = run.id
            s.add_all(
                [
                    ChainStep(
                        run_id=run.id,
                        idx=0,
                        step_id="fetch",
                        skill="echo",
                        status="succeeded",
                        input={"day": "yesterday"},
                        output={"ok": True, "data": {"rows": [1, 2, 3]}},
                        duration_ms=1200.0,
                    ),
                    ChainStep(
                        run_id=run.id,
                        idx=1,
                        step_id="report",
                        skill="echo",
                        status="failed",
                        input={"rows": [1, 2, 3]},
                        error=f"renderer crashed {EVIL}",
                        duration_ms=300.0,
                    ),
                ]
            )
            s.add_all(
                [
                    Delivery(
                        ledger_key=f"d{i}",
                        job_id=jobs[i].id,
                        recipient=f"{ch}:ou_{i}",
                        channel=ch,
                        kind="text",
                        status=st,
                        error=err,
                        tries=3 if st == "failed" else 1,
                        created_at=now - 100 * i,
                    )
                    for i, (ch, st, err) in enumerate(
                        [
                            ("feishu", "failed", "app not authorized for chat"),
                            ("feishu", "sent", None),
                            ("telegram", "unknown", f"timed out after the request was sent {EVIL}"),
                            ("telegram", "sent", None),
                            ("telegram", "sent", None),
                        ]
                    )
                ]
            )
            inc = Incident(
                signature="sig-flaky",
                skill="flaky_fetch",
                error_type="transient",
                pattern="upstream <n>: quota exceeded",
                sample_error=f"upstream 503: quota exceeded {EVIL}",
                count=3,
                sample_job_ids=[f.id for f in flaky],
                first_seen=now - 1100,
                last_seen=now - 300,
            )
            s.add(inc)
            await s.flush()
            ids["incident"] = inc.id
            s.add(
                Worker(
                    id="worker-a1",
                    host="node-1",
                    pid=4242,
                    last_heartbeat=now,
                    running=[ids["job"]],
                )
            )
            s.add(OpsAction(action="cancel", target=EVIL[:200], actor="admin", details={}))
            await s.commit()
    finally:
        await engine.dispose()
    return ids


async def _shot(page: Any, shots: Path, name: str) -> None:
    await page.wait_for_timeout(150)
    await page.screenshot(path=str(shots / f"dashboard-{name}.png"), full_page=False)


async def test_every_page_in_chromium(
    live: LiveServer, env_settings: Any, screenshots: Path, redis: Any
) -> None:
    _need_chromium()
    from playwright.async_api import async_playwright

    ids = await _seed(env_settings)
    # the workers' rate-limiter counters, as they write them
    await redis.hincrby(env_settings.key(RATELIMIT_WAITS), "telegram", 4)
    await redis.hincrbyfloat(env_settings.key(RATELIMIT_WAITED), "telegram", 2.5)
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with (
        httpx.AsyncClient(base_url=live.url, headers=auth, timeout=30) as http,
        async_playwright() as pw,
    ):
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            await _admin(browser, http, live.url, ids, screenshots)
            await _read_only(browser, live.url, ids)
            await _narrow(browser, live.url, screenshots)
        finally:
            await browser.close()


async def _open(
    browser: Any, url: str, token: str, hash_: str, **ctx_kw: Any
) -> tuple[Any, Any, list[str]]:
    ctx = await browser.new_context(viewport={"width": 1360, "height": 900}, **ctx_kw)
    page = await ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{url}/?token={token}{hash_}")
    await page.wait_for_selector("#app", state="visible")
    return ctx, page, errors


async def _admin(
    browser: Any, http: httpx.AsyncClient, url: str, ids: dict[str, str], shots: Path
) -> None:
    dialogs: list[str] = []
    ctx, page, errors = await _open(browser, url, TOKEN, "#/jobs?status=failed&skill=flaky_fetch")

    async def _accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        await dialog.accept()

    page.on("dialog", _accept)
    # the filter came from the address: the form shows it, the list holds only those jobs
    assert "token" not in page.url and page.url.endswith("#/jobs?status=failed&skill=flaky_fetch")
    await page.wait_for_function(
        "() => document.querySelectorAll('#jobs tbody tr[data-job-id]').length === 3"
    )
    assert await page.input_value("#filters [name=skill]") == "flaky_fetch"
    assert await page.input_value("#filters [name=status]") == "failed"
    # skill-name suggestions
    await page.wait_for_function(
        "() => [...document.querySelectorAll('#skill-names option')].some(o => o.value === 'flaky_fetch')"
    )
    await _shot(page, shots, "jobs")

    # bulk retry of the filter: a confirmation with the dry-run count, then the API agrees
    await page.click("#bulk-retry")
    await page.wait_for_selector("#flash:not([hidden])")
    assert any("Retry 3 job(s) matching status=failed, skill=flaky_fetch" in d for d in dialogs)
    queued = (
        await http.get("/api/v1/jobs", params={"skill": "flaky_fetch", "status": "queued"})
    ).json()
    assert len(queued["items"]) == 3

    # a deep link to a job, surviving a reload; search by error text
    await page.goto(f"{url}/#/jobs/{ids['evil']}")
    await page.wait_for_selector(f'#detail[data-job-id="{ids["evil"]}"]')
    await page.reload()
    await page.wait_for_selector(f'#detail[data-job-id="{ids["evil"]}"]')
    shown = await page.text_content("#detail-outcome") or ""
    assert "<script>window.__pwned=2</script>" in shown
    await page.keyboard.press("Escape")
    await page.wait_for_selector("#detail", state="hidden")
    await page.keyboard.press("/")
    # (the page focuses the search box in a timeout of its own, after the navigation)
    await page.wait_for_function("() => document.activeElement?.name === 'q'")
    await page.keyboard.type("flaky")
    await page.keyboard.press("Enter")
    await page.wait_for_function("() => location.hash === '#/jobs?q=flaky'")
    await page.wait_for_function(
        "() => document.querySelectorAll('#jobs tbody tr[data-job-id]').length === 3"
    )
    assert await page.is_enabled("#bulk-retry")  # a search is a bulk filter too
    await page.click(f'#jobs tbody tr[data-job-id="{ids["flaky"]}"]')
    await page.wait_for_selector(f'#detail[data-job-id="{ids["flaky"]}"]')
    # the attempt's output tails, folded, as text
    await page.click("#detail-attempts details.tail-stderr summary")
    stderr = await page.text_content("#detail-attempts details.tail-stderr pre") or ""
    assert "HTTP 503 from upstream <img src=x" in stderr
    assert "fetched page 2" in (await page.text_content("#detail-attempts .tail-stdout pre") or "")
    assert f"#/jobs/{ids['flaky']}?q=flaky" in page.url
    await _shot(page, shots, "job")

    # every page from the tabs, each with its own address; back and forward walk them
    for name in PAGES:
        await page.click(f"#tabs button[data-tab={name}]")
        await page.wait_for_selector(f"#tab-{name}", state="visible")
        assert page.url.endswith(f"#/{name}")
    await page.go_back()
    await page.wait_for_selector("#tab-workers", state="visible")
    await page.go_back()
    await page.wait_for_selector("#tab-incidents", state="visible")
    await page.go_forward()
    await page.wait_for_selector("#tab-workers", state="visible")
    await page.wait_for_selector("#workers tbody tr[data-worker-id=worker-a1]")
    assert "alive" in (await page.text_content("#workers tbody") or "")
    # its current job is a link to the job, shown by its id
    running = page.locator("#workers tbody tr[data-worker-id=worker-a1] a")
    assert await running.first.get_attribute("href") == f"#/jobs/{ids['job']}"
    assert (await running.first.text_content() or "") == ids["job"][:8]
    await _shot(page, shots, "workers")
    # drain: asked first, then the API says draining and the row shows it
    worker = "#workers tbody tr[data-worker-id=worker-a1]"
    await page.click(f"{worker} button:has-text('Drain')")
    await page.wait_for_selector(f"{worker}[data-mode=draining]")
    assert any("Drain worker worker-a1? It takes no new jobs" in d for d in dialogs)
    flags = (await http.get("/api/v1/workers/state")).json()["items"]
    assert flags == [{"id": "worker-a1", "paused": False, "draining": True}]

    # overview: three inline SVG charts drawn from the time series
    await page.goto(f"{url}/#/overview")
    await page.wait_for_function(
        "() => document.querySelectorAll('#chart-jobs svg polyline').length === 3"
    )
    assert await page.locator("#chart-depth svg polyline").count() == 1
    assert await page.locator("#latency tbody tr").count() >= 2
    await page.click("#chart-window button[data-window='24h']")
    await page.wait_for_function(
        "() => document.querySelector('#latency-window').textContent.includes('24')"
    )
    await page.click("#chart-window button[data-window='1h']")
    await _shot(page, shots, "overview")

    # incidents: ack, and the API says acked
    await page.goto(f"{url}/#/incidents")
    row = f'#incidents tbody tr[data-incident-id="{ids["incident"]}"]'
    await page.wait_for_selector(f'{row}[data-status="open"]')
    await _shot(page, shots, "incidents")
    await page.click(f"{row} button:has-text('Ack')")
    await page.wait_for_selector(f'{row}[data-status="acked"]')
    inc = (await http.get("/api/v1/incidents", params={"status": "acked"})).json()["items"]
    assert [i["id"] for i in inc] == [ids["incident"]] and inc[0]["acked_by"] == "admin"

    # deliveries: failed and unknown across jobs, per-channel failure rate
    await page.goto(f"{url}/#/deliveries")
    await page.wait_for_selector("#deliveries tbody tr[data-status=unknown]")
    assert await page.locator("#deliveries tbody tr[data-delivery-id]").count() == 2
    health = await page.text_content("#channel-health tbody") or ""
    assert "feishu" in health and "50.0 %" in health and "33.3 %" in health
    waited = await page.text_content("#channel-health tr[data-channel=telegram] td.ratelimit")
    assert waited is not None and waited.startswith("4 sends")
    await _shot(page, shots, "deliveries")
    failed = "#deliveries tbody tr[data-status=failed]"
    failed_id = await page.get_attribute(failed, "data-delivery-id")
    await page.click(f"{failed} button:has-text('Dismiss')")
    await page.wait_for_function(
        "() => document.querySelectorAll('#deliveries tbody tr[data-delivery-id]').length === 1"
    )
    assert any("Dismiss delivery to feishu:ou_0 (failed)?" in d for d in dialogs)
    gone = (await http.get("/api/v1/deliveries", params={"status": "dismissed"})).json()
    assert [str(d["id"]) for d in gone["items"]] == [failed_id]
    # bulk: every delivery the filter matches, after the count
    await page.click("#deliveries-bulk button:has-text('Dismiss all matching')")
    await page.wait_for_function(
        "() => !document.querySelector('#deliveries tbody tr[data-delivery-id]')"
    )
    assert any("Dismiss 1 deliveries matching status=failed,unknown" in d for d in dialogs)
    gone = (await http.get("/api/v1/deliveries", params={"status": "dismissed"})).json()
    assert len(gone["items"]) == 2

    # a schedule's own address: runs including a missed fire; disabling changes the API
    await page.goto(f"{url}/#/schedules/{ids['schedule']}")
    await page.wait_for_selector('#runs-list .run[data-status="missed"]')
    assert await page.locator("#next-fires li").count() == 5  # the next fire times
    # after the stored one, 09:00 as the schedule's own timezone reads it
    assert "09:00" in (await page.locator("#next-fires li").nth(1).text_content() or "")
    await _shot(page, shots, "schedules")
    await page.click("#schedules tbody tr button:has-text('Disable')")
    await page.wait_for_selector("#schedules tbody tr button:has-text('Enable')")
    sched = (await http.get(f"/api/v1/schedules/{ids['schedule']}")).json()
    assert sched["enabled"] is False

    # a chain run: each step's input, output, error and time; re-run from the failed step
    await page.click(f'#runs-list .run[data-run-id="{ids["run"]}"] a')
    await page.wait_for_selector('#chain-steps li[data-step="report"][data-status="failed"]')
    assert page.url.endswith(f"#/chain-runs/{ids['run']}")
    steps = await page.text_content("#chain-steps") or ""
    assert "1.20 s" in steps and "renderer crashed" in steps and '"rows"' in steps
    await _shot(page, shots, "chain-run")
    await page.click('#chain-steps li[data-step="report"] button:has-text("Re-run from here")')
    await page.wait_for_function(f"() => !location.hash.endsWith('{ids['run']}')")
    new_run = page.url.rsplit("/", 1)[-1]
    body = (await http.get(f"/api/v1/chain-runs/{new_run}")).json()
    assert body["schedule_id"] == ids["schedule"]

    # audit: the actions above, by the admin token
    await page.goto(f"{url}/#/audit")
    await page.wait_for_selector("#audit tbody tr[data-action='incident.ack']")
    audit = await page.text_content("#audit tbody") or ""
    assert "bulk.retry" in audit and "admin" in audit and "<script>" in audit
    await _shot(page, shots, "audit")
    await page.goto(f"{url}/#/audit?action=incident.ack")
    await page.wait_for_function(
        "() => document.querySelectorAll('#audit tbody tr[data-action]').length === 1"
    )

    assert await page.evaluate("window.__pwned") is None
    assert errors == []
    await ctx.close()


async def _read_only(browser: Any, url: str, ids: dict[str, str]) -> None:
    ctx, page, errors = await _open(browser, url, READ_TOKEN, f"#/jobs/{ids['flaky']}")
    await page.wait_for_selector(f'#detail[data-job-id="{ids["flaky"]}"]')
    assert "read only" in (await page.text_content("#who") or "")
    for hash_, ready in (
        (f"#/jobs/{ids['flaky']}", "#detail-attempts"),
        ("#/jobs?status=failed", "#jobs tbody tr[data-job-id]"),
        ("#/overview", "#chart-jobs svg"),
        (f"#/schedules/{ids['schedule']}", "#runs-list .run"),
        (f"#/chain-runs/{ids['run']}", "#chain-steps li[data-step]"),
        ("#/incidents", "#incidents tbody tr[data-incident-id]"),
        ("#/deliveries", "#deliveries tbody tr"),
        ("#/audit", "#audit tbody tr"),
        ("#/workers", "#workers tbody tr[data-worker-id]"),
    ):
        await page.goto(f"{url}/{hash_}")
        await page.wait_for_selector(ready)
        visible = await page.locator("button.action:visible, .action button:visible").count()
        assert visible == 0, hash_
        for label in (
            "Re-run",
            "Ack",
            "Resend",
            "Dismiss",
            "Disable",
            "Retry all",
            "Pause",
            "Drain",
        ):
            assert await page.locator(f"button:visible:has-text('{label}')").count() == 0
    assert await page.evaluate("window.__pwned") is None
    assert errors == []
    await ctx.close()


async def _narrow(browser: Any, url: str, shots: Path) -> None:
    ctx, page, errors = await _open(browser, url, TOKEN, "#/overview", is_mobile=True)
    await page.set_viewport_size({"width": 390, "height": 844})
    for name in ("overview", "jobs", "deliveries", "incidents"):
        await page.goto(f"{url}/#/{name}")
        await page.wait_for_selector(f"#tab-{name}", state="visible")
        await page.wait_for_timeout(200)
        wide = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert wide <= 1, (name, wide)
    await page.goto(f"{url}/#/overview")
    await page.wait_for_selector("#chart-jobs svg")
    await _shot(page, shots, "phone")
    assert errors == []
    await ctx.close()


async def test_built_messages_in_chinese(
    live: LiveServer, env_settings: Any, screenshots: Path, redis: Any
) -> None:
    """The questions and notices the script builds (deliveries one by one and in bulk, a
    chain re-run, the rate-limit figures) are Chinese in a Chinese browser."""
    _need_chromium()
    from playwright.async_api import async_playwright

    ids = await _seed(env_settings)
    await redis.hincrby(env_settings.key(RATELIMIT_WAITS), "telegram", 4)
    await redis.hincrbyfloat(env_settings.key(RATELIMIT_WAITED), "telegram", 2.5)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx, page, errors = await _open(
                browser, live.url, TOKEN, "#/deliveries", locale="zh-CN"
            )
            dialogs: list[str] = []

            async def _accept(dialog: Any) -> None:
                dialogs.append(dialog.message)
                await dialog.accept()

            page.on("dialog", _accept)
            await page.wait_for_selector("#deliveries tbody tr[data-status=unknown]")
            waited = await page.text_content(
                "#channel-health tr[data-channel=telegram] td.ratelimit"
            )
            assert waited is not None and waited.startswith("4 次发送，共等待")
            await page.click("#deliveries tbody tr[data-status=failed] button:has-text('忽略')")
            await page.wait_for_function(
                "() => document.querySelectorAll('#deliveries tbody tr[data-delivery-id]')"
                ".length === 1"
            )
            assert dialogs[-1] == "忽略发给 feishu:ou_0 的投递（失败）？"
            await page.wait_for_function(
                "() => document.querySelector('#flash').textContent === '忽略：1 条中完成 1 条'"
            )
            await page.click("#deliveries-bulk button:has-text('忽略所有匹配的')")
            await page.wait_for_function(
                "() => !document.querySelector('#deliveries tbody tr[data-delivery-id]')"
            )
            assert dialogs[-1] == "忽略匹配 status=failed,unknown 的 1 条投递（最近 7 天）？"
            await _shot(page, screenshots, "zh-deliveries")

            await page.goto(f"{live.url}/#/chain-runs/{ids['run']}")
            button = '#chain-steps li[data-step="report"] button:has-text("从这里重新运行")'
            await page.wait_for_selector(button)
            await page.click(button)
            await page.wait_for_function(f"() => !location.hash.endsWith('{ids['run']}')")
            assert dialogs[-1] == "从步骤 report 重新运行此链？（之前的步骤沿用已记录的输出）"
            flash = await page.text_content("#flash") or ""
            assert flash.startswith("已从步骤 report 开始新的运行"), flash
            await _shot(page, screenshots, "zh-chain-rerun")
            assert errors == []
            await ctx.close()
        finally:
            await browser.close()
