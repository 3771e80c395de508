"""Delayed and one-shot jobs (``run_at`` / ``delay_s``): the receipt says when, the job is
``scheduled`` until then (listed, cancellable, kept through Redis loss) and a real worker
starts it on time — through the HTTP API, the Python API and the CLI, on SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from typer.testing import CliRunner

from jobs.cli.app import app as cli_app
from jobs.queue import delayed, store
from jobs.queue.dispatcher import Dispatcher
from tests.helpers.inprocess import api, running_worker
from tests.helpers.jobs import TG, job_and_attempts, wait_status
from tests.helpers.settings import JOB_SKILLS

# --- pure logic ---------------------------------------------------------------------------


def test_durations_and_instants_are_read_or_refused_with_a_reason():
    assert delayed.parse_duration("10m") == 600
    assert delayed.parse_duration("1h30m") == 5400
    assert delayed.parse_duration("250ms") == 0.25
    assert delayed.parse_duration(45) == 45 and delayed.parse_duration("45") == 45
    for bad in ("soon", "10x", "-5", "", "m10"):
        with pytest.raises(delayed.WhenError):
            delayed.parse_duration(bad)
    assert (
        delayed.parse_instant("2026-12-06T18:00:00+08:00")
        == datetime(2026, 12, 6, 10, tzinfo=UTC).timestamp()
    )
    assert (
        delayed.parse_instant("2026-12-06T10:00:00Z")
        == datetime(2026, 12, 6, 10, tzinfo=UTC).timestamp()
    )
    naive = delayed.parse_instant("2026-12-06T18:00:00", "Asia/Shanghai")
    assert naive == datetime(2026, 12, 6, 10, tzinfo=UTC).timestamp()
    assert delayed.parse_instant(1_800_000_000) == delayed.parse_instant("1800000000")
    with pytest.raises(delayed.WhenError, match="ISO 8601"):
        delayed.parse_instant("tomorrow evening")
    with pytest.raises(delayed.WhenError, match="time zone"):
        delayed.clock_time("18:00", "Mars/Olympus", time.time())


def test_clock_time_is_the_next_such_time_in_the_zone():
    tz = ZoneInfo("Asia/Shanghai")
    now = datetime(2026, 12, 6, 17, 0, tzinfo=tz).timestamp()
    assert delayed.clock_time("18:00", "Asia/Shanghai", now) == now + 3600
    # past today: tomorrow
    assert delayed.clock_time("16:00", "Asia/Shanghai", now) == now + 23 * 3600
    with pytest.raises(delayed.WhenError):
        delayed.clock_time("25:00", "Asia/Shanghai", now)


def test_due_time_refuses_both_or_too_far():
    now = 1_000_000.0
    assert delayed.due_time(None, None, now) == (None, None)
    assert delayed.due_time(None, "10m", now) == (now + 600, None)
    assert delayed.due_time(None, 5, now) == (now + 5, None)
    assert delayed.due_time(now + 1, 5, now)[1] == "give run_at or delay_s, not both"
    assert "days ahead" in (delayed.due_time(now + 400 * 86400, None, now)[1] or "")


# --- through the real worker and the API ------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
async def test_http_delayed_job_waits_scheduled_then_starts_on_time(services):
    async with api(services) as c, running_worker(services):
        await asyncio.sleep(0.5)  # started (a delayed job's clock does not wait for workers)
        before = time.time()
        r = await c.post(
            "/api/v1/dispatch",
            json={"skill": "bg_sleep", "input": {"seconds": 0}, "context": TG, "delay_s": 1.5},
        )
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["status"] == "scheduled" and body["async"] is True
        assert before + 1.5 <= body["run_at_epoch"] <= time.time() + 1.5
        assert body["run_at"].endswith("Z") and "run at" in body["message"]
        job_id = body["job_id"]
        listed = (await c.get("/api/v1/jobs", params={"status": "scheduled"})).json()
        assert [j["id"] for j in listed["items"]] == [job_id]
        shown = (await c.get(f"/api/v1/jobs/{job_id}")).json()
        assert shown["status"] == "scheduled" and shown["run_at"] == body["run_at_epoch"]
        job = await wait_status(services, job_id, {"succeeded", "failed"}, limit=30)
    assert job.status == "succeeded"
    assert job.started_at is not None
    late = job.started_at - body["run_at_epoch"]
    assert 0 <= late < 1.0, late  # starts within 1 s of its time


@pytest.mark.integration
@pytest.mark.slow
async def test_run_at_iso_and_a_sync_skill_runs_in_the_background(services):
    at = datetime.fromtimestamp(time.time() + 1.0, UTC).isoformat()
    res = await Dispatcher(services).dispatch("sync_echo", {"a": 1}, TG, run_at=at)
    assert res.status_code == 202 and res.body["status"] == "scheduled", res.body
    async with running_worker(services):
        job = await wait_status(services, res.body["job_id"], {"succeeded", "failed"})
    assert job.status == "succeeded"
    assert services.box.unseal(job.result)["echo"] == {"a": 1}


@pytest.mark.integration
@pytest.mark.slow
async def test_bad_when_is_refused_and_nothing_is_recorded(services):
    async with api(services) as c:
        for extra, why in (
            ({"run_at": "next tuesday"}, "ISO 8601"),
            ({"delay_s": "soon"}, "duration"),
            ({"delay_s": 5, "run_at": 1_900_000_000}, "not both"),
        ):
            r = await c.post(
                "/api/v1/dispatch",
                json={"skill": "bg_sleep", "input": {}, "context": TG, **extra},
            )
            assert r.status_code == 400 and why in r.json()["error"], r.text
        assert (await c.get("/api/v1/jobs")).json()["items"] == []


@pytest.mark.integration
@pytest.mark.slow
async def test_scheduled_job_is_cancellable_and_never_runs(services):
    res = await Dispatcher(services).dispatch("bg_sleep", {"seconds": 0}, TG, delay_s=0.5)
    job_id = res.body["job_id"]
    async with api(services) as c:
        r = await c.post(f"/api/v1/jobs/{job_id}/cancel")
        assert r.status_code == 200, r.text
    async with running_worker(services):
        await asyncio.sleep(0)  # the promoter's first pass
        assert await delayed.promote_once(services, time.time() + 5) == 0
    job, attempts = await job_and_attempts(services, job_id)
    assert job.status == "cancelled" and attempts == []


@pytest.mark.integration
@pytest.mark.slow
async def test_scheduled_jobs_survive_redis_loss_and_run_once_with_two_workers(services):
    ids = []
    for _ in range(5):
        res = await Dispatcher(services).dispatch("bg_sleep", {"seconds": 0}, TG, delay_s=1.0)
        ids.append(res.body["job_id"])
    assert services.redis is not None
    keys = [
        k
        async for k in services.redis.scan_iter(
            count=1000, match=f"{services.settings.redis_prefix}*"
        )
    ]
    if keys:  # Redis lost everything it had (a restart without persistence)
        await services.redis.delete(*keys)
    async with running_worker(services), running_worker(services):
        for job_id in ids:
            await wait_status(services, job_id, {"succeeded", "failed"})
    for job_id in ids:
        job, attempts = await job_and_attempts(services, job_id)
        assert job.status == "succeeded" and len(attempts) == 1


@pytest.mark.integration
async def test_promotion_is_exactly_once_under_concurrent_promoters(services):
    ids = []
    for _ in range(20):
        res = await Dispatcher(services).dispatch("bg_sleep", {"seconds": 0}, TG, delay_s=60)
        ids.append(res.body["job_id"])
    later = time.time() + 120
    counts = await asyncio.gather(*(delayed.promote_once(services, later) for _ in range(4)))
    assert sum(counts) == 20
    for job_id in ids:
        assert (await store.get_job(services.sessionmaker, job_id)).status == "queued"


# --- the CLI ------------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path, monkeypatch, redis_server_url, redis_prefix, sqlite_url):
    for k, v in {
        "SKILLJOBS_DATA_DIR": str(tmp_path / "data"),
        "SKILLJOBS_DATABASE_URL": sqlite_url,
        "SKILLJOBS_REDIS_URL": redis_server_url,
        "SKILLJOBS_REDIS_PREFIX": redis_prefix,
        "SKILLJOBS_QUEUE_NAME": f"{redis_prefix}:queue",
        "SKILLJOBS_SKILLS_PATH": str(JOB_SKILLS),
        "COLUMNS": "200",
    }.items():
        monkeypatch.setenv(k, v)
    return CliRunner()


def _cli(runner, *args):
    base = ["dispatch", "bg_sleep", "--channel", "telegram", "--actor-key", "tg-1", "--role", "r1"]
    return runner.invoke(cli_app, [*base, *args], catch_exceptions=False)


@pytest.mark.integration
@pytest.mark.slow
def test_cli_in_and_at_with_a_time_zone(cli_env):
    before = time.time()
    res = _cli(cli_env, "--in", "10m")
    assert res.exit_code == 0, res.output
    body = json.loads(res.output)
    assert body["status"] == "scheduled"
    assert before + 600 <= body["run_at_epoch"] <= time.time() + 600
    res = _cli(cli_env, "--at", "18:00", "--tz", "Asia/Shanghai")
    assert res.exit_code == 0, res.output
    at = datetime.fromtimestamp(json.loads(res.output)["run_at_epoch"], ZoneInfo("Asia/Shanghai"))
    assert (at.hour, at.minute, at.second) == (18, 0, 0)
    listed = cli_env.invoke(cli_app, ["jobs", "list", "--status", "scheduled"])
    assert listed.exit_code == 0 and listed.output.count("bg_sleep") == 2, listed.output
    bad = cli_env.invoke(cli_app, ["dispatch", "bg_sleep", "--in", "later"])
    assert bad.exit_code != 0 and "duration" in bad.output
