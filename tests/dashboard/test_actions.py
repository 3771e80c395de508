"""Dashboard actions over the real dispatcher, job controls, schedules and config store."""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest
from sqlalchemy import select

from jobs.catalog.loader import load_registry
from jobs.models import Job, OpsAction, SkillConfig
from tests.helpers.dashboard import seed_job


@pytest.fixture(autouse=True)
def _skills(services) -> None:
    services.registry = load_registry(services.settings.skill_dirs)


async def _audit(services) -> list[tuple[str, str, str]]:
    async with services.sessionmaker() as s:
        rows = (await s.execute(select(OpsAction).order_by(OpsAction.id))).scalars()
        return [(r.action, r.target, r.actor) for r in rows]


@pytest.mark.slow
async def test_dispatch_relays_receipt_result_and_refusal(
    client: httpx.AsyncClient, services
) -> None:
    ctx = {"channel": "telegram", "actor_key": "12345", "role_id": "r1", "session_id": "s1"}
    resp = await client.post(
        "/api/v1/dispatch",
        json={"skill": "sales_report", "input": {"seconds": 0}, "context": ctx},
    )
    assert resp.status_code == 202, resp.text
    receipt = resp.json()
    assert receipt["ok"] is True and receipt["async"] is True and receipt["job_id"]
    listed = (await client.get("/api/v1/jobs", params={"skill": "sales_report"})).json()
    assert [j["id"] for j in listed["items"]] == [receipt["job_id"]]
    assert listed["items"][0]["status"] == "queued"

    sync = await client.post(
        "/api/v1/dispatch", json={"skill": "echo", "input": {"message": "hi"}, "context": ctx}
    )
    assert sync.status_code == 200 and sync.json()["message"] == "hi"

    unknown = await client.post("/api/v1/dispatch", json={"skill": "nope", "context": ctx})
    assert unknown.status_code == 404 and unknown.json()["ok"] is False
    bad = await client.post("/api/v1/dispatch", json={"input": {}})
    assert bad.status_code == 422 and "skill" in bad.json()["error"]
    bad = await client.post("/api/v1/dispatch", json={"skill": "echo", "input": [1]})
    assert bad.status_code == 422 and bad.json()["ok"] is False


@pytest.mark.slow
async def test_retry_cancel_requeue_are_recorded(client: httpx.AsyncClient, services) -> None:
    queued = await seed_job(services, status="queued")
    done = await seed_job(services, status="failed", skill="echo", error="x")
    other = await seed_job(services, status="timed_out", skill="echo", error="slow")

    resp = await client.post(f"/api/v1/jobs/{queued.id}/cancel", headers={"x-actor": "ann"})
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    again = await client.post(f"/api/v1/jobs/{queued.id}/cancel")
    assert again.status_code == 409 and again.json()["ok"] is False

    resp = await client.post(f"/api/v1/jobs/{done.id}/retry")
    assert resp.status_code == 200 and resp.json()["status"] == "queued"
    detail = (await client.get(f"/api/v1/jobs/{done.id}")).json()
    assert detail["status"] == "queued"
    busy = await client.post(f"/api/v1/jobs/{done.id}/retry")
    assert busy.status_code == 409

    resp = await client.post("/api/v1/skills/echo/requeue-failed")
    assert resp.status_code == 200 and "requeued 1" in resp.json()["message"]
    async with services.sessionmaker() as s:
        assert (await s.get(Job, other.id)).status == "queued"  # type: ignore[union-attr]

    missing = await client.post("/api/v1/jobs/nope/retry")
    assert missing.status_code == 404 and missing.json()["ok"] is False

    # refusals are recorded too (their result is "refused" in GET /api/v1/audit)
    assert await _audit(services) == [
        ("cancel", queued.id, "admin"),
        ("cancel", queued.id, "admin"),
        ("retry", done.id, "admin"),
        ("retry", done.id, "admin"),
        ("requeue_failed", "echo", "admin"),
        ("retry", "nope", "admin"),
    ]
    results = (await client.get("/api/v1/audit", params={"action": "retry"})).json()["items"]
    assert [r["result"] for r in results] == ["refused", "refused", "ok"]


@pytest.mark.slow
async def test_role_skill_config_masks_secrets(client: httpx.AsyncClient, services) -> None:
    url = "/api/v1/roles/r_sales/skills/sales_report/config"
    assert (await client.get(url)).json() == {}
    put = await client.put(url, json={"region": "north", "api_key": "sk-9f8e7d6c"})
    assert put.status_code == 200
    assert put.json() == {"region": "north", "api_key": "••••••"}
    got = await client.get(url)
    assert got.json() == {"region": "north", "api_key": "••••••"} and "sk-9f8e" not in got.text
    # sending the mask back keeps the stored secret
    put = await client.put(url, json={"region": "south", "api_key": "••••••"})
    assert put.status_code == 200
    async with services.sessionmaker() as s:
        row = (
            await s.execute(select(SkillConfig).where(SkillConfig.key == "api_key"))
        ).scalar_one()
        assert row.is_secret and "sk-9f8e" not in (row.value_enc or "")
    bad = await client.put(url, json={"": 1})
    assert bad.status_code == 422 and bad.json()["ok"] is False
    assert ("config_replace", "r_sales/sales_report", "admin") in await _audit(services)


SCHEDULE = {
    "name": "daily-words",
    "cron": "0 9 * * 1-5",
    "timezone": "Asia/Shanghai",
    "identity": {"role_id": "r1", "org_id": "o1", "session_id": "sched-1"},
    "steps": [
        {"id": "count", "skill": "word_count", "input": {"text": "a b c"}},
        {"skill": "echo", "input": {"n": "$steps.count.words"}},
    ],
}


@pytest.mark.slow
async def test_schedules_lifecycle(client: httpx.AsyncClient, services) -> None:
    bad = dict(SCHEDULE, steps=[{"skill": "echo", "input": {"x": "$steps.later.y"}}])
    resp = await client.post("/api/v1/schedules", json=bad)
    assert resp.status_code == 422
    assert resp.json()["ok"] is False and "later" in resp.json()["error"]
    assert resp.json()["problems"]

    resp = await client.post("/api/v1/schedules", json=SCHEDULE)
    assert resp.status_code == 201, resp.text
    sched = resp.json()
    assert sched["enabled"] is True and sched["next_fire_at"]
    # the next 5 fires: 09:00 in Shanghai (01:00 UTC) on weekdays, the first next_fire_at
    fires = [datetime.fromisoformat(t) for t in sched["next_fires"]]
    assert len(fires) == 5 and sched["next_fires"][0] == sched["next_fire_at"]
    assert fires == sorted(set(fires))
    assert all(f.hour == 1 and f.minute == 0 and f.weekday() < 5 for f in fires)
    more = (await client.get(f"/api/v1/schedules/{sched['id']}", params={"next": 12})).json()
    assert len(more["next_fires"]) == 12 and more["next_fires"][:5] == sched["next_fires"]
    listed = (await client.get("/api/v1/schedules", params={"next": 2})).json()["items"]
    assert listed[0]["next_fires"] == sched["next_fires"][:2]
    bad_next = await client.get(f"/api/v1/schedules/{sched['id']}", params={"next": 0})
    assert bad_next.status_code == 422
    dup = await client.post("/api/v1/schedules", json=SCHEDULE)
    assert dup.status_code == 422 and "already exists" in dup.json()["error"]

    listed = (await client.get("/api/v1/schedules")).json()["items"]
    assert [s["name"] for s in listed] == ["daily-words"] and listed[0]["last_run"] is None

    off = await client.patch(f"/api/v1/schedules/{sched['id']}", json={"enabled": False})
    assert off.status_code == 200 and off.json()["enabled"] is False
    assert off.json()["next_fire_at"] is None and off.json()["next_fires"] == []
    changed = await client.patch(f"/api/v1/schedules/{sched['id']}", json={"cron": "5 9 * * *"})
    assert changed.status_code == 200 and changed.json()["cron"] == "5 9 * * *"
    wrong = await client.patch(f"/api/v1/schedules/{sched['id']}", json={"cron": "nope"})
    assert wrong.status_code == 422
    wrong = await client.patch(f"/api/v1/schedules/{sched['id']}", json={"enabled": "yes"})
    assert wrong.status_code == 422

    run = await client.post(f"/api/v1/schedules/{sched['id']}/run")
    assert run.status_code == 202
    run_id = run.json()["run_id"]
    runs = (await client.get(f"/api/v1/schedules/{sched['id']}/runs")).json()["items"]
    assert [r["id"] for r in runs] == [run_id]
    one = (await client.get(f"/api/v1/chain-runs/{run_id}")).json()
    assert one["schedule_id"] == sched["id"] and one["status"] == "queued"
    listed = (await client.get("/api/v1/schedules")).json()["items"]
    assert listed[0]["last_run"]["id"] == run_id
    # by name works too
    assert (await client.get("/api/v1/schedules/daily-words")).json()["id"] == sched["id"]

    assert (await client.get("/api/v1/schedules/nope")).status_code == 404
    assert (await client.post("/api/v1/schedules/nope/run")).status_code == 404
    assert (await client.get("/api/v1/schedules/nope/runs")).status_code == 404
    assert (await client.get("/api/v1/chain-runs/nope")).status_code == 404
    actions = [a for a, _, _ in await _audit(services)]
    assert actions == ["schedule.create", "schedule.disable", "schedule.update", "schedule.run"]
    assert {actor for _, _, actor in await _audit(services)} == {"admin"}
