"""The dashboard pages' own endpoints on SQLite and PostgreSQL: time series for the
charts, the audit log, deliveries across jobs, the caller's identity; the read-only token
reads them all and is refused every action."""

from __future__ import annotations

import math
import time

import httpx
import pytest
from pydantic import SecretStr

from dashboard.app import create_app
from jobs.models import Delivery, OpsAction
from tests.helpers.dashboard import seed_job, seed_rows

READ_TOKEN = "dash-read-token-2b9e4a7c1f0d5e3a9b8c7d6e"


@pytest.mark.slow
async def test_timeseries_counts_finished_jobs_per_bucket(
    client: httpx.AsyncClient, services
) -> None:
    now = time.time()
    await seed_job(services, status="succeeded", created_at=now - 200, finished_at=now - 120)
    await seed_job(services, status="failed", created_at=now - 200, finished_at=now - 119)
    await seed_job(services, status="timed_out", created_at=now - 200, finished_at=now - 30)
    await seed_job(services, status="succeeded", created_at=now - 9000, finished_at=now - 8000)
    resp = await client.get("/api/v1/stats/timeseries", params={"window": "1h"})
    after = time.time()
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["step"] == 60 and len(body["t"]) == 60
    jobs = body["series"]["jobs"]
    assert sum(jobs["succeeded"]) == 1 and sum(jobs["failed"]) == 2
    # buckets are aligned to the clock and the last one holds the server's now (read
    # between ``now`` and ``after``: a minute may turn in between)
    assert body["t"][-1] % 60 == 0 and body["t"][-1] <= body["now"] < body["t"][-1] + 60
    assert now <= body["now"] <= after
    assert math.floor(now / 60) * 60 <= body["t"][-1] <= math.floor(after / 60) * 60
    i = math.floor((now - 30 - body["t"][0]) / 60)
    assert jobs["failed"][i] >= 1
    day = (await client.get("/api/v1/stats/timeseries?window=24h&metric=jobs")).json()
    assert sum(day["series"]["jobs"]["succeeded"]) == 2
    assert set(day["series"]) == {"jobs"} and "latency" not in day


@pytest.mark.slow
async def test_timeseries_queue_depth_latency_and_deliveries(
    client: httpx.AsyncClient, services
) -> None:
    now = time.time()
    # waiting since 30 min ago; started 10 min ago after waiting 20 min; still waiting
    await seed_job(
        services,
        skill="slow",
        status="succeeded",
        created_at=now - 1800,
        queued_at=now - 1800,
        started_at=now - 600,
        finished_at=now - 590,
        duration_ms=10000.0,
    )
    await seed_job(
        services, skill="slow", status="queued", created_at=now - 300, queued_at=now - 300
    )
    job = await seed_job(services, skill="fast", status="succeeded", duration_ms=50.0)
    await seed_rows(
        services,
        *[
            Delivery(
                ledger_key=f"k{i}",
                job_id=job.id,
                recipient=f"{ch}:1",
                channel=ch,
                status=st,
                created_at=now - 60,
            )
            for i, (ch, st) in enumerate(
                [
                    ("telegram", "sent"),
                    ("telegram", "failed"),
                    ("feishu", "unknown"),
                    ("feishu", "sent"),
                ]
            )
        ],
    )
    body = (await client.get("/api/v1/stats/timeseries?window=1h&step=300")).json()
    assert len(body["t"]) == 12
    depth = body["series"]["queue_depth"]["queued"]
    assert depth[-1] == 1  # now: one waiting
    t0 = body["t"]
    at = {t + 300: d for t, d in zip(t0, depth, strict=True)}
    # between 30 and 10 minutes ago the first job was waiting too
    assert max(d for end, d in at.items() if now - 1500 < end < now - 700) == 1
    assert depth[0] == 0 or t0[0] + 300 > now - 1800
    lat = {r["skill"]: r for r in body["latency"]}
    assert lat["slow"]["wait_p50_ms"] == pytest.approx(1_200_000, rel=0.01)
    assert lat["slow"]["run_p95_ms"] == 10000.0
    assert lat["fast"]["run_p50_ms"] == 50.0
    dl = body["series"]["deliveries"]
    assert sum(dl["sent"]) == 2 and sum(dl["failed"]) == 1 and sum(dl["unknown"]) == 1
    chans = {c["channel"]: c for c in body["delivery_channels"]}
    assert chans["telegram"]["failure_rate"] == 0.5 and chans["feishu"]["failed"] == 1
    assert body["ratelimit_waits"] == []
    # the workers' rate-limiter counters (as they write them) join the channel health
    from jobs.constants import RATELIMIT_WAITED, RATELIMIT_WAITS

    await services.redis.hincrby(services.settings.key(RATELIMIT_WAITS), "telegram", 7)
    await services.redis.hincrbyfloat(services.settings.key(RATELIMIT_WAITED), "telegram", 3.25)
    waits = (await client.get("/api/v1/stats/timeseries?window=1h&metric=deliveries")).json()
    assert waits["ratelimit_waits"] == [{"channel": "telegram", "waits": 7, "waited_s": 3.25}]
    assert (
        "ratelimit_waits" not in (await client.get("/api/v1/stats/timeseries?metric=jobs")).json()
    )


@pytest.mark.slow
async def test_timeseries_refuses_bad_parameters(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/v1/stats/timeseries?metric=nope")).status_code == 422
    assert (await client.get("/api/v1/stats/timeseries?window=30d")).status_code == 422
    assert (await client.get("/api/v1/stats/timeseries?window=24h&step=10")).status_code == 422


@pytest.mark.slow
async def test_deliveries_across_jobs(client: httpx.AsyncClient, services) -> None:
    now = time.time()
    a = await seed_job(services)
    b = await seed_job(services)
    await seed_rows(
        services,
        Delivery(
            ledger_key="a1",
            job_id=a.id,
            recipient="telegram:1",
            channel="telegram",
            status="failed",
            error="chat not found",
            created_at=now - 10,
        ),
        Delivery(
            ledger_key="a2",
            job_id=a.id,
            recipient="telegram:1",
            channel="telegram",
            status="sent",
            created_at=now - 9,
        ),
        Delivery(
            ledger_key="b1",
            job_id=b.id,
            recipient="feishu:ou_1",
            channel="feishu",
            status="unknown",
            created_at=now - 5,
        ),
        Delivery(
            ledger_key="old",
            job_id=b.id,
            recipient="feishu:ou_1",
            channel="feishu",
            status="failed",
            created_at=now - 30 * 86400,
        ),
    )
    items = (await client.get("/api/v1/deliveries")).json()["items"]
    assert [d["status"] for d in items] == ["unknown", "failed"]
    assert items[1]["job_id"] == a.id and items[1]["error"] == "chat not found"
    sent = (await client.get("/api/v1/deliveries?status=sent")).json()["items"]
    assert [d["recipient"] for d in sent] == ["telegram:1"]
    by_job = (await client.get(f"/api/v1/deliveries?job={a.id}")).json()["items"]
    assert {d["status"] for d in by_job} == {"sent", "failed"}
    feishu = (await client.get("/api/v1/deliveries?channel=feishu&since=0")).json()["items"]
    assert len(feishu) == 2
    assert (await client.get("/api/v1/deliveries?status=bogus")).status_code == 422


@pytest.mark.slow
async def test_audit_lists_actions_newest_first(client: httpx.AsyncClient, services) -> None:
    job = await seed_job(services, status="failed")
    assert (await client.post(f"/api/v1/jobs/{job.id}/retry")).status_code == 200
    await seed_rows(
        services,
        OpsAction(action="refused", target="POST /api/v1/jobs/x/retry", actor="read"),
    )
    body = (await client.get("/api/v1/audit")).json()
    first, second = body["items"][0], body["items"][1]
    assert (first["action"], first["actor"], first["result"]) == ("refused", "read", "refused")
    assert (second["action"], second["target"], second["actor"]) == ("retry", job.id, "admin")
    assert second["result"] == "ok" and second["at"] > 0
    only = (await client.get("/api/v1/audit?action=retry")).json()["items"]
    assert [a["target"] for a in only] == [job.id]
    page = (await client.get("/api/v1/audit?limit=1")).json()
    assert page["next_before"] == first["id"]
    rest = (await client.get(f"/api/v1/audit?before={page['next_before']}")).json()["items"]
    assert rest[0]["id"] == second["id"]


@pytest.mark.slow
async def test_read_token_sees_everything_and_changes_nothing(services) -> None:
    services.settings.api_read_token = SecretStr(READ_TOKEN)
    job = await seed_job(services, status="failed")
    app = create_app(services.settings, services=services)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {READ_TOKEN}", "x-requested-with": "test"},
    ) as c:
        me = (await c.get("/api/v1/me")).json()
        assert me == {"kind": "read", "actor": "read", "can_change": False}
        for path in (
            "/api/v1/stats/timeseries",
            "/api/v1/audit",
            "/api/v1/deliveries",
            "/api/v1/incidents",
            f"/api/v1/jobs/{job.id}",
            "/api/v1/schedules",
            "/api/v1/workers",
            "/api/v1/workers/state",
        ):
            assert (await c.get(path)).status_code == 200, path
        for path, body in (
            (f"/api/v1/jobs/{job.id}/retry", None),
            (f"/api/v1/jobs/{job.id}/cancel", None),
            ("/api/v1/jobs/bulk", {"action": "retry", "filter": {"status": "failed"}}),
            ("/api/v1/deliveries/bulk", {"action": "dismiss", "filter": {}}),
            ("/api/v1/incidents/x/ack", None),
            ("/api/v1/workers/x/pause", None),
            ("/api/v1/workers/x/drain", None),
            ("/api/v1/schedules/x/run", None),
            ("/api/v1/chain-runs/x/rerun", {"from_step": "a"}),
        ):
            resp = await c.post(path, json=body)
            assert resp.status_code == 403, (path, resp.text)
        assert (await c.patch("/api/v1/schedules/x", json={"enabled": False})).status_code == 403
    async with services.sessionmaker() as s:
        from sqlalchemy import select

        from jobs.models import Job

        assert (await s.get(Job, job.id)).status == "failed"  # type: ignore[union-attr]
        refused = (await s.execute(select(OpsAction).where(OpsAction.action == "refused"))).all()
        assert len(refused) >= 8


@pytest.mark.slow
async def test_me_as_admin(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/v1/me")).json()["can_change"] is True


@pytest.mark.slow
async def test_search_matches_origin_session_and_actor(client: httpx.AsyncClient, services) -> None:
    a = await seed_job(services, session_id="web-room-9", actor_key="ou_alice")
    b = await seed_job(services, session_id="tg-1", actor_key="ou_bob", error="quota exceeded")
    await seed_job(services, session_id="tg-2", actor_key="ou_carol")

    async def found(q: str) -> list[str]:
        resp = await client.get("/api/v1/jobs", params={"q": q})
        assert resp.status_code == 200, resp.text
        return [j["id"] for j in resp.json()["items"]]

    assert await found("web-room-9") == [a.id]
    assert await found("ou_bob") == [b.id]
    assert await found("QUOTA") == [b.id]
    assert await found("web-room") == []  # origins match exactly, not as substrings


@pytest.mark.slow
async def test_pause_and_resume_a_worker(client: httpx.AsyncClient, services) -> None:
    from jobs.constants import WORKER_PAUSE
    from jobs.models import Worker

    await seed_rows(services, Worker(id="host-1:42:abc", host="host-1", pid=42))
    key = services.settings.key(WORKER_PAUSE, "host-1:42:abc")
    resp = await client.post("/api/v1/workers/host-1%3A42%3Aabc/pause")
    assert resp.status_code == 200, resp.text
    assert await services.redis.exists(key)
    state = (await client.get("/api/v1/workers/state")).json()["items"]
    assert state == [{"id": "host-1:42:abc", "paused": True, "draining": False}]
    assert (await client.post("/api/v1/workers/host-1:42:abc/resume")).status_code == 200
    assert not await services.redis.exists(key)
    assert (await client.get("/api/v1/workers/state")).json()["items"][0]["paused"] is False
    resp = await client.post("/api/v1/workers/host-1:42:abc/drain")
    assert resp.json() == {"ok": True, "id": "host-1:42:abc", "paused": False, "draining": True}
    state = (await client.get("/api/v1/workers/state")).json()["items"]
    assert state == [{"id": "host-1:42:abc", "paused": False, "draining": True}]
    assert (await client.post("/api/v1/workers/nope/pause")).status_code == 404
    assert (await client.post("/api/v1/workers/nope/drain")).status_code == 404
    acts = (await client.get("/api/v1/audit?target=host-1:42:abc")).json()["items"]
    assert [(a["action"], a["actor"]) for a in acts] == [
        ("worker.drain", "admin"),
        ("worker.resume", "admin"),
        ("worker.pause", "admin"),
    ]


@pytest.mark.slow
async def test_bulk_takes_exactly_what_the_job_list_shows(
    client: httpx.AsyncClient, services
) -> None:
    now = time.time()
    a = await seed_job(services, status="failed", error="quota exceeded", created_at=now - 300)
    b = await seed_job(services, status="failed", error="Quota exceeded", created_at=now - 200)
    await seed_job(services, status="failed", error="quota exceeded", channel="feishu")
    await seed_job(services, status="failed", error="disk full")
    await seed_job(services, status="succeeded", error="quota exceeded")
    await seed_job(services, status="failed", error="quota exceeded", created_at=now - 9000)
    query = {"status": "failed", "channel": "telegram", "q": "quota", "since": "2h"}
    listed = (await client.get("/api/v1/jobs", params=query)).json()["items"]
    assert sorted(j["id"] for j in listed) == sorted([a.id, b.id])

    async def bulk(**kw) -> dict:  # type: ignore[no-untyped-def,type-arg]
        resp = await client.post("/api/v1/jobs/bulk", json={"action": "retry", **kw})
        assert resp.status_code == 200, resp.text
        return resp.json()  # type: ignore[no-any-return]

    dry = await bulk(filter=query)
    assert dry["dry_run"] is True and dry["matched"] == 2 and dry["capped"] is False
    assert sorted(dry["job_ids"]) == sorted([a.id, b.id]) and dry["affected"] == 0
    # epoch seconds, as the page sends them, mean the same
    assert (await bulk(filter={**query, "since": now - 7200}))["matched"] == 2
    # the cap: the oldest first, and it says more are left
    first = await bulk(filter=query, dry_run=False, limit=1)
    assert first["matched"] == 2 and first["capped"] is True
    assert first["job_ids"] == [a.id] and first["affected"] == 1
    statuses = {j["id"]: j["status"] for j in (await client.get("/api/v1/jobs")).json()["items"]}
    assert statuses[a.id] == "queued" and statuses[b.id] == "failed"
    second = await bulk(filter=query, dry_run=False)
    assert second["matched"] == 1 and second["job_ids"] == [b.id] and second["affected"] == 1
    audit = (await client.get("/api/v1/audit", params={"action": "bulk.retry"})).json()["items"]
    assert [(x["details"]["matched"], x["details"]["taken"]) for x in audit] == [(1, 1), (2, 1)]
    assert audit[0]["details"]["filter"]["q"] == "quota" and audit[0]["actor"] == "admin"
    assert [x["result"] for x in audit] == ["ok", "ok"]
    # a refused action is audited too, with why
    assert (await client.post(f"/api/v1/jobs/{a.id}/retry")).status_code == 409  # queued
    refused = (await client.get("/api/v1/audit", params={"target": a.id})).json()["items"]
    assert (refused[0]["action"], refused[0]["result"]) == ("retry", "refused")
    assert "only finished jobs" in refused[0]["details"]["error"]

    bad = await client.post("/api/v1/jobs/bulk", json={"action": "retry", "filter": {"x": 1}})
    assert bad.status_code == 422 and "known: status" in bad.json()["error"]
    bad = await client.post(
        "/api/v1/jobs/bulk", json={"action": "retry", "filter": query, "limit": 0}
    )
    assert bad.status_code == 422 and "limit" in bad.json()["error"]
    many = await client.get("/api/v1/jobs", params={"status": "failed,succeeded", "q": "quota"})
    assert len(many.json()["items"]) == 3  # feishu, succeeded, the old one (a, b are queued)
    assert (await client.get("/api/v1/jobs", params={"since": "soon"})).status_code == 422
