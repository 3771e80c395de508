"""Incidents and bulk actions: real failing jobs through the real worker, on SQLite and
PostgreSQL; the API, the CLI-facing filter and the metrics."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, update

from dashboard.app import create_app
from delivery import notices
from jobs.models import Job
from jobs.queue import control, incidents, store
from jobs.queue.control import JobFilter, parse_time
from jobs.services import Services
from tests.helpers.chains import write_skill
from tests.helpers.jobs import dispatch, drain
from tests.helpers.settings import JOB_SKILLS, make_settings

ORDER_FAIL = """
async def execute(input_data, ctx):
    order = input_data["order"]
    return {
        "ok": False,
        "error": f"order {order} not found in /data/exports/{order}.csv "
        f"(request {input_data['rid']}, took {input_data['ms']} ms)",
    }
"""
QUOTA_FAIL = """
async def execute(input_data, ctx):
    return {"ok": False, "error": "quota exceeded for this month"}
"""
TOKEN = "incident-token-8c2e"


# --- pure -----------------------------------------------------------------------------------


def test_signatures_ignore_numbers_ids_and_paths() -> None:
    a = "order 1234 not found in /data/exports/1234.csv (request 9f86d081884c7d65, took 12.5 ms)"
    b = "order 77 not found in /data/exports/77.csv (request 2c26b46b68ffc68f, took 3 ms)"
    c = f"order 5 not found in /srv/x/5.csv (request {uuid.uuid4()}, took 40 ms)"
    assert incidents.normalise(a) == "order <n> not found in <path> (request <id>, took <n> ms)"
    assert incidents.signature("s", "failed", a) == incidents.signature("s", "failed", b)
    assert incidents.signature("s", "failed", a) == incidents.signature("s", "failed", c)
    # a different message, skill or error type is another incident
    assert incidents.signature("s", "failed", a) != incidents.signature("s", "failed", "quota")
    assert incidents.signature("s", "failed", a) != incidents.signature("t", "failed", a)
    assert incidents.signature("s", "failed", a) != incidents.signature("s", "transient", a)
    assert incidents.normalise("GET https://api.x.com/v1/u/42?k=1 gave 503") == "GET <url> gave <n>"
    assert incidents.normalise("chat ou_7f3a2 refused") == "chat <id> refused"


def test_filter_times_and_refusals() -> None:
    now = 1_800_000_000.0
    assert parse_time("2h", now=now) == now - 7200
    assert parse_time("30m", now=now) == now - 1800
    assert parse_time("2026-03-02T08:00:00Z") == 1772438400.0
    assert parse_time(12.5) == 12.5
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday")
    with pytest.raises(ValueError, match="unknown status 'broken'"):
        JobFilter.parse({"status": "failed,broken"})
    with pytest.raises(ValueError, match="unknown filter field"):
        JobFilter.parse({"colour": "red"})


# --- on the databases -----------------------------------------------------------------------


@pytest.fixture
async def svc(tmp_path: Path, database_url: str, redis_server_url: str, redis_prefix: str):  # type: ignore[no-untyped-def]
    extra = tmp_path / "skills"
    write_skill(extra, "order_export", ORDER_FAIL, frontmatter="async: true\n")
    write_skill(extra, "quota_report", QUOTA_FAIL, frontmatter="async: true\n")
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=os.pathsep.join([str(JOB_SKILLS), str(extra)]),
        worker_lease_sec=3.0,
        retry_backoff_sec=0.05,
        api_token=TOKEN,
    )
    services = await Services.open(settings)
    yield services
    if services.redis is not None:
        keys = [k async for k in services.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await services.redis.delete(*keys)
    await services.close()


async def _fail_orders(svc: Services, n: int, start: int = 0) -> list[str]:
    ids = []
    for i in range(start, start + n):
        inp = {"order": 1000 + i * 37, "rid": uuid.uuid4().hex[:16], "ms": 10 + i}
        ids.append(await dispatch(svc, "order_export", inp))
    return ids


@pytest.mark.slow
async def test_failures_group_into_incidents_ack_and_reopen(svc: Services) -> None:
    orders = await _fail_orders(svc, 4)
    quota = await dispatch(svc, "quota_report")
    await drain(svc)
    items = await incidents.list_incidents(svc.sessionmaker)
    by_skill = {i["skill"]: i for i in items}
    assert set(by_skill) == {"order_export", "quota_report"}
    inc = by_skill["order_export"]
    assert inc["count"] == 4 and inc["status"] == "open"
    assert sorted(inc["sample_job_ids"]) == sorted(orders)
    assert inc["first_seen"] <= inc["last_seen"]
    assert inc["pattern"].startswith("order <n> not found in <path>")
    assert by_skill["quota_report"]["sample_job_ids"] == [quota]
    assert await incidents.count_open(svc.sessionmaker) == 2

    acked = await incidents.ack(svc.sessionmaker, inc["id"], actor="ops")
    assert acked["status"] == "acked" and acked["acked_by"] == "ops"
    assert await incidents.count_open(svc.sessionmaker) == 1
    # a new failure of the same signature re-opens it and counts on
    again = await _fail_orders(svc, 1, start=10)
    await drain(svc)
    [reopened] = await incidents.list_incidents(svc.sessionmaker, skill="order_export")
    assert reopened["status"] == "open" and reopened["count"] == 5
    assert reopened["sample_job_ids"][0] == again[0]  # newest first
    with pytest.raises(LookupError):
        await incidents.ack(svc.sessionmaker, "nope")


@pytest.mark.slow
async def test_concurrent_failures_of_one_signature_all_count(svc: Services) -> None:
    import asyncio

    await asyncio.gather(
        *(
            incidents.record_failure(svc.sessionmaker, f"j{i}", "s", "failed", f"boom {i}")
            for i in range(12)
        )
    )
    [inc] = await incidents.list_incidents(svc.sessionmaker)
    assert inc["count"] == 12 and len(inc["sample_job_ids"]) == incidents.SAMPLES


@pytest.mark.slow
async def test_failures_recorded_out_of_order_keep_first_and_last_seen(svc: Services) -> None:
    """Two workers' failures commit in either order: first/last seen are the min/max."""
    await incidents.record_failure(svc.sessionmaker, "j2", "s", "failed", "boom 2", now=200.0)
    await incidents.record_failure(svc.sessionmaker, "j1", "s", "failed", "boom 1", now=100.0)
    await incidents.record_failure(svc.sessionmaker, "j3", "s", "failed", "boom 3", now=150.0)
    [inc] = await incidents.list_incidents(svc.sessionmaker)
    assert (inc["first_seen"], inc["last_seen"], inc["count"]) == (100.0, 200.0, 3)


@pytest.mark.slow
async def test_bulk_retry_by_filter_retries_exactly_the_matched_jobs(svc: Services) -> None:
    orders = await _fail_orders(svc, 3)
    quota = await dispatch(svc, "quota_report")
    await drain(svc)
    # one old failure of the same skill, outside --since 2h (created 5 h ago)
    old = time.time() - 5 * 3600
    async with svc.sessionmaker() as s:
        await s.execute(
            update(Job).where(Job.id == orders[0]).values(created_at=old, finished_at=old + 60)
        )
        await s.commit()
    flt = JobFilter.parse({"status": "failed", "skill": "order_export", "since": "2h"})
    dry = await control.bulk_action(svc, "retry", flt, notices=notices, dry_run=True)
    assert dry["matched"] == 2 and dry["affected"] == 0
    assert sorted(dry["job_ids"]) == sorted(orders[1:])
    async with svc.sessionmaker() as s:  # a dry run changes nothing
        assert {j.status for j in (await s.execute(select(Job))).scalars()} == {"failed"}

    done = await control.bulk_action(svc, "retry", flt, notices=notices, dry_run=False, actor="ops")
    assert done["matched"] == 2 and done["affected"] == 2 and done["refused"] == []
    async with svc.sessionmaker() as s:
        jobs = {j.id: j for j in (await s.execute(select(Job))).scalars()}
    assert {jobs[i].status for i in orders[1:]} == {"queued"}
    assert jobs[orders[0]].status == "failed" and jobs[quota].status == "failed"
    await drain(svc)
    async with svc.sessionmaker() as s:
        jobs = {j.id: j for j in (await s.execute(select(Job))).scalars()}
    assert [jobs[i].attempts for i in orders] == [1, 2, 2]
    assert jobs[quota].attempts == 1

    # by incident: every failure of that signature, whatever its time
    [inc] = await incidents.list_incidents(svc.sessionmaker, skill="order_export")
    by_incident = await control.bulk_action(
        svc, "retry", JobFilter.parse({"incident": inc["id"]}), notices=notices, dry_run=True
    )
    assert sorted(by_incident["job_ids"]) == sorted(orders)


@pytest.mark.slow
async def test_api_incidents_bulk_and_metrics(svc: Services) -> None:
    orders = await _fail_orders(svc, 2)
    await drain(svc)
    app = create_app(svc.settings, services=svc)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
    ) as client:
        res = await client.get("/api/v1/incidents")
        assert res.status_code == 200
        body = res.json()
        assert body["open"] == 1
        [inc] = body["items"]
        assert inc["count"] == 2 and sorted(inc["sample_job_ids"]) == sorted(orders)
        metrics = (await client.get("/metrics")).text
        assert "skilljobs_incidents_open 1.0" in metrics
        assert f'skilljobs_incident_failures{{error_type="failed",incident="{inc["id"]}"' in metrics

        req = {"action": "retry", "filter": {"status": "failed", "skill": "order_export"}}
        res = await client.post("/api/v1/jobs/bulk", json=req)  # a dry run unless told
        assert res.status_code == 200 and res.json()["dry_run"] is True
        assert res.json()["matched"] == 2 and res.json()["affected"] == 0
        res = await client.post("/api/v1/jobs/bulk", json={**req, "dry_run": False})
        assert res.json()["affected"] == 2
        bad = await client.post("/api/v1/jobs/bulk", json={"action": "explode", "filter": {}})
        assert bad.status_code == 422 and "unknown action" in bad.json()["error"]
        bad = await client.post(
            "/api/v1/jobs/bulk", json={"action": "retry", "filter": {"since": "soon"}}
        )
        assert bad.status_code == 422

        res = await client.post(f"/api/v1/incidents/{inc['id']}/ack")
        assert res.status_code == 200 and res.json()["status"] == "acked"
        assert (await client.get("/api/v1/incidents?status=open")).json()["items"] == []
        assert "skilljobs_incidents_open 0.0" in (await client.get("/metrics")).text
        assert (await client.post("/api/v1/incidents/nope/ack")).status_code == 404


@pytest.mark.slow
async def test_cli_bulk_retry_counts_first(svc: Services, monkeypatch, redis_prefix: str) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from typer.testing import CliRunner

    from jobs.cli.app import app

    orders = await _fail_orders(svc, 2)
    quota = await dispatch(svc, "quota_report")
    await drain(svc)
    s = svc.settings
    for key, value in {
        "SKILLJOBS_DATA_DIR": str(s.data_dir),
        "SKILLJOBS_DATABASE_URL": s.resolved_database_url,
        "SKILLJOBS_REDIS_URL": str(s.redis_url),
        "SKILLJOBS_REDIS_PREFIX": redis_prefix,
        "SKILLJOBS_QUEUE_NAME": s.queue_name,
        "SKILLJOBS_SKILLS_PATH": str(s.skills_path),
        "COLUMNS": "200",
    }.items():
        monkeypatch.setenv(key, value)
    runner = CliRunner()
    args = ["jobs", "retry", "--status", "failed", "--skill", "order_export", "--since", "2h"]
    res = await asyncio.to_thread(runner.invoke, app, [*args, "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "retry: 2 jobs match" in res.output
    assert all(j in res.output for j in orders) and quota not in res.output
    res = await asyncio.to_thread(
        runner.invoke, app, args, input="n\n"
    )  # the count first, then the question
    assert res.exit_code == 1 and "Retry 2 jobs?" in res.output
    res = await asyncio.to_thread(runner.invoke, app, args, input="y\n")
    assert res.exit_code == 0 and "retry: 2 of 2 done" in res.output
    async with svc.sessionmaker() as session:
        jobs = {j.id: j.status for j in (await session.execute(select(Job))).scalars()}
    assert [jobs[j] for j in orders] == ["queued", "queued"] and jobs[quota] == "failed"
    res = await asyncio.to_thread(runner.invoke, app, ["jobs", "retry", orders[0], "--skill", "x"])
    assert res.exit_code == 1 and "not both" in res.output
    res = await asyncio.to_thread(runner.invoke, app, ["jobs", "retry", "--since", "soon"])
    assert res.exit_code == 1 and "not a time" in res.output

    res = await asyncio.to_thread(runner.invoke, app, ["incidents", "list"])
    assert res.exit_code == 0 and "order_export" in res.output and "quota_report" in res.output
    [inc] = await incidents.list_incidents(svc.sessionmaker, skill="order_export")
    res = await asyncio.to_thread(runner.invoke, app, ["incidents", "ack", inc["id"]])
    assert res.exit_code == 0 and "acknowledged (2 failures so far)" in res.output
    res = await asyncio.to_thread(runner.invoke, app, ["incidents", "list"])
    assert "order_export" not in res.output and "quota_report" in res.output
    res = await asyncio.to_thread(runner.invoke, app, ["incidents", "ack", "nope"])
    assert res.exit_code == 1 and "no incident" in res.output


@pytest.mark.slow
async def test_a_job_lost_three_times_is_an_incident_with_its_cause(svc: Services) -> None:
    """The lease of each run runs out (its worker died): the third loss fails the job, and
    that failure is counted like any other, shown in GET /api/v1/incidents."""
    job_id = await dispatch(svc, "bg_sleep")
    token = 0
    for n in range(1, 4):
        claim = await store.claim(svc.sessionmaker, job_id, token, f"worker-{n}", 30)
        assert claim is not None and claim.attempt == n
        async with svc.sessionmaker() as s:  # the worker died: its lease ran out
            await s.execute(
                update(Job).where(Job.id == job_id).values(lease_expires_at=time.time() - 1)
            )
            await s.commit()
        requeued = await store.expire_leases(svc.sessionmaker)
        assert [j for j, _ in requeued] == ([job_id] if n < 3 else [])
        token = requeued[0][1] if requeued else token
    async with svc.sessionmaker() as s:
        job = await s.get(Job, job_id)
    assert job is not None and job.status == "failed" and job.error_type == "lost"
    [inc] = await incidents.list_incidents(svc.sessionmaker)
    assert inc["skill"] == "bg_sleep" and inc["error_type"] == "lost"
    assert inc["sample_error"] == store.LOST_CAP_REASON.format(n=3)
    assert inc["sample_job_ids"] == [job_id] and inc["status"] == "open"

    app = create_app(svc.settings, services=svc)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
    ) as client:
        [shown] = (await client.get("/api/v1/incidents")).json()["items"]
    assert shown["id"] == inc["id"] and shown["error_type"] == "lost"
    assert "died or stalled" in shown["sample_error"]


async def test_a_job_failing_again_is_one_sample(svc: Services) -> None:
    sm = svc.sessionmaker
    first = await incidents.record_failure(sm, "job-a", "s", "ValueError", "boom 1", now=100.0)
    await incidents.record_failure(sm, "job-b", "s", "ValueError", "boom 2", now=101.0)
    again = await incidents.record_failure(sm, "job-a", "s", "ValueError", "boom 3", now=102.0)
    assert again == first
    [inc] = await incidents.list_incidents(sm, skill="s")
    assert inc["count"] == 3 and inc["sample_job_ids"] == ["job-a", "job-b"]
