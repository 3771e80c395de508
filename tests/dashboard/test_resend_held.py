"""A result whose channel was not configured is kept sealed with its failed delivery, and
sent whole by a resend once the channel is configured; the bulk dry run counts only the
deliveries a resend can send."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from delivery.channels.registry import use_channels
from delivery.channels.telegram import TelegramChannel
from delivery.plan import SEALED_RESULT
from delivery.router import deliver_result
from jobs.crypto import ENC_TAG
from jobs.models import Delivery
from tests.helpers.dashboard import seed_job

pytestmark = pytest.mark.integration


async def _fence() -> bool:
    return True


@pytest.mark.slow
async def test_resend_after_the_channel_is_configured(client, services, tg) -> None:
    use_channels(services, {})  # telegram not configured yet
    job = await seed_job(services, status="succeeded", skill="sales_report", actor_key="1001")
    result = {"ok": True, "message": "Sales are up 12%"}
    out = await deliver_result(services, job, result, [], fence=_fence)
    assert [d["status"] for d in out] == ["failed"]
    assert "not configured" in out[0]["error"]
    async with services.sessionmaker() as s:
        row = (await s.scalars(select(Delivery).where(Delivery.job_id == job.id))).one()
    # kept sealed: nothing of the result readable in the row
    assert set(row.content) == {SEALED_RESULT} and set(row.content[SEALED_RESULT]) == {ENC_TAG}
    assert "Sales" not in json.dumps(row.content)
    listed = (await client.get("/api/v1/deliveries", params={"job": job.id})).json()["items"]
    assert listed[0]["resendable"] is True and "Sales" not in json.dumps(listed)

    # a delivery with nothing stored is not counted by the dry run
    other = await seed_job(services, status="succeeded")
    async with services.sessionmaker() as s:
        s.add(
            Delivery(
                ledger_key=f"k-{other.id}",
                recipient="telegram:9",
                channel="telegram",
                status="failed",
                job_id=other.id,
            )
        )
        await s.commit()

    async def dry() -> int:
        resp = await client.post(
            "/api/v1/deliveries/bulk", json={"action": "resend", "filter": {"status": "failed"}}
        )
        assert resp.status_code == 200, resp.text
        return int(resp.json()["matched"])

    assert await dry() == 0  # telegram is still not configured: nothing can be resent
    use_channels(services, {"telegram": TelegramChannel(services.http, tg.token, api_base=tg.url)})
    assert await dry() == 1  # the held one; not the row without content
    resp = await client.post(f"/api/v1/deliveries/{row.id}/resend")
    assert resp.status_code == 200, resp.text
    assert resp.json()["delivery"]["status"] == "sent"
    assert [str(m["chat_id"]) for m in tg.sent] == ["1001"]
    assert "Sales are up 12%" in tg.sent[0]["text"]
