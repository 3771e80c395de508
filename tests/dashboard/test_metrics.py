"""``/metrics``: Prometheus text computed from the database at scrape time."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import ChainRun, Delivery, Schedule, Worker
from tests.helpers.dashboard import seed_job, seed_rows


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def test_metrics_parse_and_match_the_rows(client: httpx.AsyncClient, services) -> None:
    now = time.time()
    await seed_job(services, status="queued", skill="a", created_at=now - 30, queued_at=now - 30)
    await seed_job(services, status="running", skill="a", created_at=now - 5)
    for ms in (50.0, 700.0, 4000.0):
        await seed_job(
            services,
            skill="a",
            status="succeeded",
            created_at=now - 60,
            finished_at=now - 20,
            duration_ms=ms,
        )
    await seed_job(
        services,
        skill="a",
        status="failed",
        created_at=now - 60,
        finished_at=now - 10,
        duration_ms=200.0,
    )
    # outside the window: not counted
    await seed_job(
        services, skill="a", status="failed", created_at=now - 9000, finished_at=now - 8000
    )
    sched = Schedule(name="daily", cron="0 9 * * *", steps=[{"skill": "a"}])
    await seed_rows(services, sched)
    await seed_rows(
        services,
        ChainRun(schedule_id=sched.id, fire_key="k1", fire_at=now, status="stopped_empty"),
        ChainRun(schedule_id=sched.id, fire_key="k2", fire_at=now, status="succeeded"),
        Delivery(ledger_key="d1", recipient="telegram:1", channel="telegram", status="sent"),
        Delivery(ledger_key="d2", recipient="telegram:2", channel="telegram", status="failed"),
        Delivery(ledger_key="d3", recipient="telegram:3", channel="telegram", status="failed"),
        Worker(id="w1", last_heartbeat=now - 2),
        Worker(id="w2", last_heartbeat=now - 120),
    )

    resp = await client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    s = _samples(resp.text)
    assert _get(s, "skilljobs_queue_depth", status="queued") == 1
    assert _get(s, "skilljobs_queue_depth", status="running") == 1
    assert 29 <= _get(s, "skilljobs_oldest_queued_age_seconds") < 60
    assert _get(s, "skilljobs_jobs_active", skill="a", status="queued") == 1
    w = "3600s"
    assert _get(s, "skilljobs_jobs_finished", skill="a", outcome="succeeded", window=w) == 3
    assert _get(s, "skilljobs_jobs_finished", skill="a", outcome="failed", window=w) == 1
    h = "skilljobs_job_duration_seconds"
    assert _get(s, f"{h}_count", skill="a", window=w) == 4
    assert abs(_get(s, f"{h}_sum", skill="a", window=w) - 4.95) < 1e-9
    assert _get(s, f"{h}_bucket", skill="a", window=w, le="0.1") == 1
    assert _get(s, f"{h}_bucket", skill="a", window=w, le="0.25") == 2
    assert _get(s, f"{h}_bucket", skill="a", window=w, le="1.0") == 3
    assert _get(s, f"{h}_bucket", skill="a", window=w, le="5.0") == 4
    assert _get(s, f"{h}_bucket", skill="a", window=w, le="+Inf") == 4
    d = "skilljobs_deliveries"
    assert _get(s, d, channel="telegram", status="failed", window=w) == 2
    assert _get(s, d, channel="telegram", status="sent", window=w) == 1
    assert _get(s, "skilljobs_chain_runs", status="stopped_empty", window=w) == 1
    assert _get(s, "skilljobs_worker_up", worker="w1") == 1
    assert _get(s, "skilljobs_worker_up", worker="w2") == 0
    assert _get(s, "skilljobs_workers_alive") == 1


async def test_metrics_on_an_empty_database(client: httpx.AsyncClient) -> None:
    resp = await client.get("/metrics")
    s = _samples(resp.text)
    assert _get(s, "skilljobs_queue_depth", status="queued") == 0
    assert _get(s, "skilljobs_oldest_queued_age_seconds") == 0
    assert _get(s, "skilljobs_workers_alive") == 0


@pytest.mark.slow
async def test_limit_usage_per_key(services) -> None:
    from dashboard.app import create_app
    from tests.helpers.dashboard import TOKEN

    limits = {"org:*": 2, "skill:video": 1, "actor:*": 5}
    services.settings = services.settings.model_copy(update={"limits": limits})
    now = time.time()
    for org, status, n in (("o1", "running", 2), ("o1", "queued", 3), ("o2", "running", 1)):
        for _ in range(n):
            await seed_job(services, status=status, org_id=org, actor_key="", created_at=now - 5)
    await seed_job(services, status="queued", org_id="o3", actor_key="", created_at=now)
    app = create_app(services.settings, services=services)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
    ) as client:
        resp = await client.get("/metrics")
    assert resp.status_code == 200, resp.text
    samples = _samples(resp.text)
    assert _get(samples, "skilljobs_limit_slots", limit="org:o1") == 2
    assert _get(samples, "skilljobs_limit_running", limit="org:o1") == 2
    assert _get(samples, "skilljobs_limit_waiting", limit="org:o1") == 3  # full: counted
    assert _get(samples, "skilljobs_limit_running", limit="org:o2") == 1
    assert ("skilljobs_limit_waiting", (("limit", "org:o2"),)) not in samples  # not full
    assert _get(samples, "skilljobs_limit_slots", limit="skill:video") == 1  # exact: always
    assert _get(samples, "skilljobs_limit_running", limit="skill:video") == 0
    assert ("skilljobs_limit_slots", (("limit", "org:o3"),)) not in samples  # nothing running
    assert _get(samples, "skilljobs_limits_full") == 1


@pytest.mark.slow
async def test_no_limit_families_without_limits(client: httpx.AsyncClient, services) -> None:
    await seed_job(services, status="running", org_id="o1")
    text = (await client.get("/metrics")).text
    assert "skilljobs_limit_running" not in text and "skilljobs_limits_full" not in text
