"""Acting on selected jobs (``POST /api/v1/jobs/bulk {"action", "ids"}``) and deleting
finished jobs (``DELETE /api/v1/jobs/{id}``, ``skilljobs jobs delete``), all audited."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from jobs.models import Job, OpsAction
from tests.helpers.dashboard import seed_job

pytestmark = pytest.mark.integration


async def _audit(services) -> list[tuple[str, str]]:
    async with services.sessionmaker() as s:
        rows = (await s.scalars(select(OpsAction).order_by(OpsAction.id))).all()
    return [(r.action, r.target) for r in rows]


@pytest.mark.slow
async def test_delete_finished_job(client: httpx.AsyncClient, services) -> None:
    done = await seed_job(services, status="succeeded")
    queued = await seed_job(services, status="queued")
    resp = await client.delete(f"/api/v1/jobs/{done.id}")
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "deleted"
    assert (await client.get(f"/api/v1/jobs/{done.id}")).status_code == 404
    refused = await client.delete(f"/api/v1/jobs/{queued.id}")
    assert refused.status_code == 409 and "cancel it first" in refused.json()["error"]
    assert (await client.delete("/api/v1/jobs/nope")).status_code == 404
    audit = await _audit(services)
    assert ("delete", done.id) in audit and ("delete", queued.id) in audit


@pytest.mark.slow
async def test_act_on_the_selected_rows(client: httpx.AsyncClient, services) -> None:
    picked = [await seed_job(services, status="succeeded") for _ in range(2)]
    running = await seed_job(services, status="running")
    untouched = await seed_job(services, status="succeeded")
    ids = [j.id for j in picked] + [running.id]
    resp = await client.post("/api/v1/jobs/bulk", json={"action": "delete", "ids": ids})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["selected"] == 3 and body["affected"] == 2
    assert [r["job_id"] for r in body["refused"]] == [running.id]
    async with services.sessionmaker() as s:
        left = set((await s.scalars(select(Job.id))).all())
    assert left == {running.id, untouched.id}
    assert ("bulk.delete", "jobs") in await _audit(services)
    bad = await client.post("/api/v1/jobs/bulk", json={"action": "delete", "ids": []})
    assert bad.status_code == 422
    wrong = await client.post("/api/v1/jobs/bulk", json={"action": "explode", "ids": ids})
    assert wrong.status_code == 422
