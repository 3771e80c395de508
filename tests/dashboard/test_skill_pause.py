"""``POST /api/v1/skills/{name}/pause`` and ``/resume``: shown in ``GET /api/v1/skills``
and on the job, refused to a read token, audited."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from jobs.catalog.loader import load_registry
from jobs.models import OpsAction

pytestmark = pytest.mark.integration


@pytest.mark.slow
async def test_pause_and_resume_a_skill(client: httpx.AsyncClient, services) -> None:
    services.registry = load_registry(services.settings.skill_dirs)
    paused = await client.post("/api/v1/skills/sales_report/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True
    skills = (await client.get("/api/v1/skills")).json()
    assert skills["paused"] == ["sales_report"]
    row = next(s for s in skills["items"] if s["name"] == "sales_report")
    assert row["paused"] is True and row["async"] is True
    from tests.helpers.dashboard import seed_job

    job = await seed_job(services, status="queued", skill="sales_report")
    assert (await client.get(f"/api/v1/jobs/{job.id}")).json()["paused"] is True
    resumed = await client.post("/api/v1/skills/sales_report/resume")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert (await client.get("/api/v1/skills")).json()["paused"] == []
    missing = await client.post("/api/v1/skills/nope/pause")
    assert missing.status_code == 404 and "no skill 'nope'" in missing.json()["error"]
    async with services.sessionmaker() as s:
        rows = (await s.scalars(select(OpsAction).order_by(OpsAction.id))).all()
    assert [(r.action, r.target) for r in rows] == [
        ("skill.pause", "sales_report"),
        ("skill.resume", "sales_report"),
    ]
