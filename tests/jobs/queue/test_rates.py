"""Start-rate and concurrency limits set at run time (``/api/v1/limits``, ``skilljobs
limits``): a token bucket per key shared by the workers through Redis, rebuilt from the
database when Redis loses it; jobs over a limit wait queued and never fail. SQLite and
PostgreSQL, through the real worker and API."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from jobs.cli.app import app as cli_app
from jobs.models import JobAttempt
from jobs.queue import broker, rates
from jobs.queue.dispatcher import Dispatcher
from tests.helpers.inprocess import api, running_worker
from tests.helpers.jobs import TG, wait_status
from tests.helpers.settings import JOB_SKILLS

# --- pure logic ---------------------------------------------------------------------------


def test_rates_keys_and_the_claim_form():
    assert rates.parse_rate("2/10s") == rates.Rate(2, 10.0)
    assert rates.parse_rate("30/m") == rates.Rate(30, 60.0)
    assert rates.parse_rate("100 / hour") == rates.Rate(100, 3600.0)
    assert rates.parse_rate("5/s") == rates.Rate(5, 1.0)
    assert rates.parse_rate("1/2.5s").text == "1/2.5s"
    for bad in ("2", "0/s", "two/s", "2/0s", "2/10y"):
        with pytest.raises(rates.LimitError):
            rates.parse_rate(bad)
    for bad in ("team:x", "skill:", "org"):
        with pytest.raises(rates.LimitError, match="skill:NAME"):
            rates.check_key(bad)
    eff = rates.Effective(
        {"org:*": 3, "skill:img": 1},
        {"skill:img": rates.Rate(2, 10.0), "role:*": rates.Rate(1, 1.0)},
        {},
    )
    assert json.loads(rates.for_claim(eff)) == {
        "exact": {"skill:img": 1},
        "any": {"org": 3},
        "rate": {"skill:img": [2, 10000]},
        "rate_any": {"role": [1, 1000]},
    }
    assert rates.for_claim(rates.Effective({}, {}, {})) == ""


# --- the API, the audit trail, /metrics ---------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
async def test_put_get_delete_limits_are_audited_and_in_metrics(services):
    async with api(services) as c:
        r = await c.put("/api/v1/limits/skill:bg_sleep", json={"rate": "2/10s"})
        assert r.status_code == 200, r.text
        assert r.json()["rate"] == "2/10s" and r.json()["concurrency"] is None
        r = await c.put("/api/v1/limits/skill:bg_sleep", json={"concurrency": 3})
        assert r.json()["rate"] == "2/10s" and r.json()["concurrency"] == 3
        await c.put("/api/v1/limits/org:*", json={"concurrency": 5})
        items = {i["key"]: i for i in (await c.get("/api/v1/limits")).json()["items"]}
        assert items["skill:bg_sleep"]["rate_per_s"] == pytest.approx(0.2)
        assert items["skill:bg_sleep"]["source"] == "runtime"
        assert items["org:*"]["concurrency"] == 5
        metrics = (await c.get("/metrics")).text
        assert 'skilljobs_limit_rate_per_second{limit="skill:bg_sleep"} 0.2' in metrics
        assert 'skilljobs_limit_slots{limit="skill:bg_sleep"} 3.0' in metrics
        for body, why in (
            ({"rate": "lots"}, "COUNT/PERIOD"),
            ({}, "give a rate"),
        ):
            r = await c.put("/api/v1/limits/skill:bg_sleep", json=body)
            assert r.status_code == 400 and why in r.json()["error"], r.text
        r = await c.put("/api/v1/limits/team:x", json={"rate": "1/s"})
        assert r.status_code == 400 and "skill:NAME" in r.json()["error"]
        assert (await c.put("/api/v1/limits/org:o1", json={"concurrency": 0})).status_code == 422
        r = await c.delete("/api/v1/limits/skill:bg_sleep")
        assert r.status_code == 200 and r.json()["removed"] is True
        keys = [i["key"] for i in (await c.get("/api/v1/limits")).json()["items"]]
        assert keys == ["org:*"]
        audit = (await c.get("/api/v1/audit")).json()["items"]
        actions = [(a["action"], a["target"]) for a in audit]
        assert ("limits.set", "skill:bg_sleep") in actions
        assert ("limits.unset", "skill:bg_sleep") in actions


# --- through the real worker --------------------------------------------------------------


async def _dispatch(services, n: int, seconds: float = 0.0) -> list[str]:
    ids = []
    for _ in range(n):
        res = await Dispatcher(services).dispatch("bg_sleep", {"seconds": seconds}, TG)
        assert res.status_code == 202, res.body
        ids.append(res.body["job_id"])
    return ids


async def _starts(services, ids: list[str]) -> list[tuple[float, float | None]]:
    async with services.sessionmaker() as s:
        rows = await s.execute(
            select(JobAttempt.started_at, JobAttempt.finished_at).where(JobAttempt.job_id.in_(ids))
        )
        return sorted((r[0], r[1]) for r in rows)


@pytest.mark.integration
@pytest.mark.slow
async def test_jobs_over_the_rate_wait_queued_and_all_run(services):
    services.settings.limits_refresh_sec = 0.2
    await rates.set_limit(services.sessionmaker, "skill:bg_sleep", rate="2/2s", actor="t")
    ids = await _dispatch(services, 5)
    async with running_worker(services), running_worker(services):
        for job_id in ids:
            job = await wait_status(services, job_id, {"succeeded", "failed"}, limit=30)
            assert job.status == "succeeded"
    starts = [s for s, _ in await _starts(services, ids)]
    assert len(starts) == 5
    # a bucket of 2 refilled at 1/s, shared by both workers: 2 at once, then one a second
    assert starts[-1] - starts[0] >= 2.5, starts
    for i in range(2, 5):
        assert starts[i] - starts[0] >= (i - 1) - 0.3, starts


@pytest.mark.integration
@pytest.mark.slow
async def test_lost_bucket_is_rebuilt_from_the_database_and_limits_change_live(services):
    services.settings.limits_refresh_sec = 0.2
    await rates.set_limit(services.sessionmaker, "skill:bg_sleep", rate="2/60s", actor="t")
    first = await _dispatch(services, 2)
    async with running_worker(services):
        for job_id in first:
            await wait_status(services, job_id, {"succeeded"})
        # Redis loses the bucket: it must not come back full (2 runs started this minute)
        assert services.redis is not None
        await services.redis.delete(f"{broker.queue_name(services)}:rate:skill:bg_sleep")
        (third,) = await _dispatch(services, 1)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert (await wait_status(services, third, {"queued", "running"})).status == "queued"
            await asyncio.sleep(0.1)
        level = (await rates.levels(services, await rates.current(services)))["skill:bg_sleep"]
        assert level is not None and level < 1  # rebuilt, and empty
        async with api(services) as c:
            shown = (await c.get(f"/api/v1/jobs/{third}")).json()
            assert shown["status"] == "queued" and shown["waiting_for"] == "rate skill:bg_sleep"
            # the operator removes the limit: the waiting job starts at once
            assert (await c.delete("/api/v1/limits/skill:bg_sleep")).status_code == 200
        job = await wait_status(services, third, {"succeeded", "failed"}, limit=10)
        assert job.status == "succeeded"


@pytest.mark.integration
@pytest.mark.slow
async def test_concurrency_set_at_run_time_bounds_running_jobs(services):
    services.settings.limits_refresh_sec = 0.2
    async with api(services) as c:
        r = await c.put("/api/v1/limits/skill:bg_sleep", json={"concurrency": 1})
        assert r.status_code == 200
    ids = await _dispatch(services, 3, seconds=0.4)
    async with running_worker(services, max_jobs=4):
        for job_id in ids:
            assert (await wait_status(services, job_id, {"succeeded", "failed"})).status == (
                "succeeded"
            )
    spans = await _starts(services, ids)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end is not None and start >= end - 0.05, spans  # one at a time


# --- the CLI ------------------------------------------------------------------------------


@pytest.mark.integration
def test_cli_limits_set_list_unset(
    tmp_path, monkeypatch, redis_server_url, redis_prefix, sqlite_url
):
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
    runner = CliRunner()
    res = runner.invoke(
        cli_app, ["limits", "set", "skill:img", "--rate", "2/10s", "--concurrency", "2"]
    )
    assert res.exit_code == 0, res.output
    assert "rate 2/10s, concurrency 2" in res.output
    res = runner.invoke(cli_app, ["limits", "list", "--json"])
    assert res.exit_code == 0, res.output
    (item,) = json.loads(res.output)["items"]
    assert (item["key"], item["rate"], item["concurrency"]) == ("skill:img", "2/10s", 2)
    assert "skill:img" in runner.invoke(cli_app, ["limits", "list"]).output
    bad = runner.invoke(cli_app, ["limits", "set", "skill:img", "--rate", "fast"])
    assert bad.exit_code != 0 and "COUNT/PERIOD" in bad.output
    res = runner.invoke(cli_app, ["limits", "unset", "skill:img"])
    assert res.exit_code == 0 and "removed" in res.output
    assert json.loads(runner.invoke(cli_app, ["limits", "list", "--json"]).output)["items"] == []
