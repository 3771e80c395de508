"""Dashboard JSON API on SQLite and PostgreSQL: jobs, paging, filters, detail, artifacts,
queue overview, workers, health."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from jobs.models import Artifact, Delivery, JobAttempt, Worker
from tests.helpers.dashboard import free_port, seed_job, seed_rows


@pytest.mark.slow
async def test_job_list_pages_newest_first_without_gaps(
    client: httpx.AsyncClient, services
) -> None:
    base = time.time() - 1000
    ids = []
    for i in range(7):
        job = await seed_job(services, created_at=base + i)
        ids.append(job.id)
    # two jobs with the same created_at: the id breaks the tie, none is lost
    tie = await seed_job(services, created_at=base + 3, id="f" * 32)
    ids.append(tie.id)

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        resp = await client.get("/api/v1/jobs", params=params)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        seen += [j["id"] for j in body["items"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    assert seen[0] == ids[6]  # newest first
    # the tie: both jobs at base+3 appear, the larger id first
    pos_tie, pos_other = seen.index(tie.id), seen.index(ids[3])
    assert pos_tie == pos_other - 1


@pytest.mark.slow
async def test_job_list_filters(client: httpx.AsyncClient, services) -> None:
    now = time.time()
    a = await seed_job(
        services,
        skill="report",
        status="failed",
        error="quota exceeded for x",
        channel="feishu",
        role_id="r_sales",
        created_at=now - 50,
    )
    b = await seed_job(
        services, skill="report", status="succeeded", channel="telegram", created_at=now - 40
    )
    c = await seed_job(
        services,
        skill="resize_100%",
        status="queued",
        channel="telegram",
        role_id="r_ops",
        created_at=now - 30,
    )

    async def ids(**params: object) -> set[str]:
        resp = await client.get("/api/v1/jobs", params=params)
        assert resp.status_code == 200, resp.text
        return {j["id"] for j in resp.json()["items"]}

    assert await ids(status="failed") == {a.id}
    assert await ids(skill="report") == {a.id, b.id}
    assert await ids(channel="telegram") == {b.id, c.id}
    assert await ids(role="r_sales") == {a.id}
    assert await ids(since=now - 45) == {b.id, c.id}
    assert await ids(until=now - 45) == {a.id}
    assert await ids(q="QUOTA") == {a.id}
    assert await ids(q=c.id) == {c.id}
    assert await ids(q=c.id[:8].upper()) == {c.id}  # an id prefix, as the table shows it
    assert await ids(q="100%") == {c.id}  # LIKE wildcards are literal
    assert await ids(q="_") == {c.id}
    assert await ids(skill="report", status="succeeded") == {b.id}

    bad = await client.get("/api/v1/jobs", params={"status": "exploded"})
    assert bad.status_code == 400
    assert bad.json()["ok"] is False and "status must be one of" in bad.json()["error"]
    bad = await client.get("/api/v1/jobs", params={"cursor": "%%%not-a-cursor"})
    assert bad.status_code == 400 and "cursor" in bad.json()["error"]
    bad = await client.get("/api/v1/jobs", params={"since": "nan"})
    assert bad.status_code in (400, 422) and bad.json()["ok"] is False
    bad = await client.get("/api/v1/jobs", params={"limit": 0})
    assert bad.status_code == 422 and bad.json()["ok"] is False


@pytest.mark.slow
async def test_job_detail_has_timeline_artifacts_deliveries_fetches(
    client: httpx.AsyncClient, services, tmp_path: Path
) -> None:
    root = services.settings.resolved_workspace_root
    (root / "r1" / "s1").mkdir(parents=True)
    chart = root / "r1" / "s1" / "chart.png"
    chart.write_bytes(b"\x89PNG fake image bytes")
    outside = tmp_path / "outside.txt"
    outside.write_text("not for download")
    fetches = [
        {
            "url": "https://10.0.0.1/x.png",
            "field": "image_url",
            "status": "refused",
            "reason": "private address 10.0.0.1",
            "artifact": None,
        }
    ]
    job = await seed_job(
        services,
        status="failed",
        attempts=2,
        error="boom",
        error_type="transient",
        fetches=fetches,
        result={"ok": False},
    )
    t0 = job.created_at
    await seed_rows(
        services,
        JobAttempt(
            job_id=job.id,
            number=1,
            worker_id="w1",
            started_at=t0,
            finished_at=t0 + 1,
            outcome="failed",
            error="ConnectionError",
            duration_ms=1000,
        ),
        JobAttempt(
            job_id=job.id,
            number=2,
            worker_id="w2",
            started_at=t0 + 2,
            finished_at=t0 + 3,
            outcome="failed",
            error="boom",
            duration_ms=1000,
        ),
        Artifact(
            job_id=job.id,
            filename="chart.png",
            local_path=str(chart),
            media="image",
            size=21,
            sha256="ab" * 32,
        ),
        Artifact(job_id=job.id, filename="outside.txt", local_path=str(outside)),
        Artifact(job_id=job.id, filename="gone.txt", local_path=str(root / "gone.txt")),
        Delivery(
            ledger_key=f"{job.id}:1",
            job_id=job.id,
            recipient="telegram:12345",
            channel="telegram",
            kind="image",
            status="sent",
        ),
        Delivery(
            ledger_key=f"{job.id}:2",
            job_id=job.id,
            recipient="feishu:ou_x",
            channel="feishu",
            kind="text",
            status="failed",
            error="token expired",
        ),
    )

    resp = await client.get(f"/api/v1/jobs/{job.id}")
    assert resp.status_code == 200
    body = resp.json()
    assert [a["number"] for a in body["attempt_log"]] == [1, 2]
    assert body["attempt_log"][0]["worker_id"] == "w1"
    assert body["origin"] == {
        "channel": "telegram",
        "session_id": "s1",
        "external_id": "",
        "actor_key": "12345",
        "role_id": "r1",
        "org_id": "o1",
    }
    assert body["fetches"][0]["status"] == "refused"
    assert {d["recipient"]: d["status"] for d in body["deliveries"]} == {
        "telegram:12345": "sent",
        "feishu:ou_x": "failed",
    }
    arts = {a["filename"]: a for a in body["artifacts"]}
    assert arts["chart.png"]["media"] == "image" and arts["chart.png"]["size"] == 21

    got = await client.get(arts["chart.png"]["download_url"])
    assert got.status_code == 200 and got.content == chart.read_bytes()
    assert got.headers["content-disposition"].startswith("attachment")
    refused = await client.get(arts["outside.txt"]["download_url"])
    assert refused.status_code == 403 and refused.json()["ok"] is False
    gone = await client.get(arts["gone.txt"]["download_url"])
    assert gone.status_code == 410
    other = await client.get(f"/api/v1/jobs/{'0' * 32}/artifacts/{arts['chart.png']['id']}")
    assert other.status_code == 404
    # a signed link to paste elsewhere: no API token needed, only for files that can be served
    assert arts["outside.txt"]["link"] is None and arts["gone.txt"]["link"] is None
    link = arts["chart.png"]["link"]
    assert link.startswith("/files/")
    bare = await client.get(link, headers={"authorization": ""})
    assert bare.status_code == 200 and bare.content == chart.read_bytes()
    forged = link[:-3] + ("AAA" if not link.endswith("AAA") else "BBB")
    assert (await client.get(forged, headers={"authorization": ""})).status_code == 403

    missing = await client.get("/api/v1/jobs/nope")
    assert missing.status_code == 404
    assert missing.json() == {
        "ok": False,
        "error": "job nope not found",
        "error_type": "recoverable",
    }
    # the list carries the same artifacts and deliveries
    listed = (await client.get("/api/v1/jobs")).json()["items"][0]
    assert len(listed["artifacts"]) == 3 and len(listed["deliveries"]) == 2


@pytest.mark.slow
async def test_queue_overview_counts_rates_and_percentiles(
    client: httpx.AsyncClient, services
) -> None:
    now = time.time()
    await seed_job(services, status="queued", created_at=now - 120, queued_at=now - 120)
    await seed_job(services, status="queued", created_at=now - 10, queued_at=now - 10)
    await seed_job(services, status="running", created_at=now - 5)
    durations = [100.0, 200.0, 300.0, 400.0, 1000.0]
    for d in durations:
        await seed_job(
            services,
            skill="fast",
            status="succeeded",
            created_at=now - 100,
            finished_at=now - 60,
            duration_ms=d,
        )
    await seed_job(
        services,
        skill="fast",
        status="failed",
        created_at=now - 100,
        finished_at=now - 30,
        duration_ms=50.0,
    )
    # finished two hours ago: counts for 24h, not for 5m / 1h
    await seed_job(
        services,
        skill="slow",
        status="timed_out",
        created_at=now - 8000,
        finished_at=now - 7200,
        duration_ms=600000.0,
    )
    # finished two days ago: outside every window
    await seed_job(
        services,
        skill="slow",
        status="succeeded",
        created_at=now - 200000,
        finished_at=now - 190000,
    )
    await seed_rows(
        services,
        Worker(id="w-alive", host="h1", pid=11, last_heartbeat=now - 3, running=["j1"]),
        Worker(id="w-dead", host="h2", pid=12, last_heartbeat=now - 300),
        Delivery(
            ledger_key="k1",
            recipient="feishu:ou_1",
            channel="feishu",
            status="failed",
            error="403 forbidden",
            created_at=now - 100,
        ),
        Delivery(
            ledger_key="k2",
            recipient="feishu:ou_2",
            channel="feishu",
            status="sent",
            created_at=now - 100,
        ),
    )

    resp = await client.get("/api/v1/queue")
    assert resp.status_code == 200
    q = resp.json()
    assert q["queued"] == 2 and q["running"] == 1
    assert 119 <= q["oldest_queued_age_s"] < 150
    assert q["succeeded_5m"] == 5 and q["failed_5m"] == 1
    assert q["workers"] == 1 and q["workers_total"] == 2
    assert q["rates"]["1h"]["succeeded"] == 5 and q["rates"]["1h"]["failed"] == 1
    assert q["rates"]["24h"]["failed"] == 2 and q["rates"]["24h"]["timed_out"] == 1
    assert q["rates"]["5m"]["failure_rate"] == round(1 / 6, 4)
    skills = {s["skill"]: s for s in q["skills"]}
    # p50/p95 of the six finished "fast" runs (linear interpolation, like percentile_cont)
    values = sorted([*durations, 50.0])
    assert skills["fast"]["p50_ms"] == (values[2] + values[3]) / 2
    assert skills["fast"]["p95_ms"] == round(values[4] + (values[5] - values[4]) * 0.75, 1)
    assert skills["fast"]["succeeded"] == 5 and skills["fast"]["failed"] == 1
    assert skills["slow"]["failed"] == 1 and skills["slow"]["succeeded"] == 0
    assert skills["demo"]["queued"] == 2 and skills["demo"]["running"] == 1
    assert q["deliveries_failing"]["total"] == 1
    assert q["deliveries_failing"]["by_channel"] == {"feishu": 1}
    assert q["deliveries_failing"]["latest"][0]["error"] == "403 forbidden"

    brief = (await client.get("/api/v1/queue", params={"brief": "true"})).json()
    age = brief.pop("oldest_queued_age_s")
    assert abs(age - q["oldest_queued_age_s"]) < 5
    assert brief == {k: q[k] for k in brief}
    assert set(brief) == {"queued", "running", "succeeded_5m", "failed_5m", "workers"}

    w = (await client.get("/api/v1/workers")).json()["items"]
    assert [x["id"] for x in w] == ["w-alive", "w-dead"]  # newest heartbeat first
    assert w[0]["alive"] is True and w[1]["alive"] is False and w[0]["running"] == ["j1"]
    assert set(w[0]) >= {"id", "host", "pid", "last_heartbeat", "running"}


@pytest.mark.slow
async def test_health_and_readiness(client: httpx.AsyncClient, services) -> None:
    anon = httpx.AsyncClient(transport=client._transport, base_url="http://127.0.0.1")
    async with anon:
        assert (await anon.get("/healthz")).json() == {"ok": True}
        ready = await anon.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"redis": "ok", "database": "ok", "schema": "ok"}
        page = await anon.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    from redis.asyncio import Redis

    live = services.redis
    services.redis = Redis(host="127.0.0.1", port=free_port())  # nothing listens there
    try:
        ready = await client.get("/readyz")
    finally:
        await services.redis.aclose()
        services.redis = live
    assert ready.status_code == 503
    assert ready.json()["checks"]["redis"] != "ok" and ready.json()["ok"] is False
