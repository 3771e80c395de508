"""``DELETE /api/v1/schedules/{id}``: admin only, audited, 404 after."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from jobs.catalog.loader import load_registry
from jobs.models import OpsAction

pytestmark = pytest.mark.integration

SCHEDULE = {
    "name": "to-delete",
    "cron": "0 9 * * *",
    "steps": [{"skill": "echo", "input": {"text": "x"}}],
}


@pytest.mark.slow
async def test_delete_schedule(client: httpx.AsyncClient, services) -> None:
    services.registry = load_registry(services.settings.skill_dirs)
    made = await client.post("/api/v1/schedules", json=SCHEDULE)
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    gone = await client.delete(f"/api/v1/schedules/{sid}")
    assert gone.status_code == 200 and gone.json() == {"deleted": sid, "name": "to-delete"}
    assert (await client.get(f"/api/v1/schedules/{sid}")).status_code == 404
    again = await client.delete(f"/api/v1/schedules/{sid}")
    assert again.status_code == 404
    async with services.sessionmaker() as s:
        rows = (await s.scalars(select(OpsAction).where(OpsAction.target == sid))).all()
    assert [r.action for r in rows] == ["schedule.create", "schedule.delete"]
