"""Operator custody on SQLite and PostgreSQL: an unknown Telegram delivery is listed, sent
again (a new generation, the fake shows the message, the receipt is recorded) or dismissed;
both audited; the read-only token is refused both."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select

from dashboard.app import create_app
from delivery.channels.base import Courier
from delivery.channels.registry import use_channels
from delivery.channels.telegram import TelegramChannel
from delivery.errors import DeliveryOutcomeUnknown
from delivery.ledger import Parcel, deliver_once, ledger_key
from jobs.models import OpsAction
from tests.helpers.dashboard import seed_job

READ_TOKEN = "dash-read-token-7c1f0d5e3a9b8c7d6e2b9e4a"


async def _unknown(services, job_id: str, text: str) -> None:
    async def lost() -> str:
        raise DeliveryOutcomeUnknown("telegram sendMessage: timed out waiting for the answer")

    out = await deliver_once(
        services.sessionmaker,
        lost,
        Courier("telegram:1001", "w#1", channel="telegram", job_id=job_id),
        Parcel(ledger_key(job_id, "telegram:1001", "text"), content={"text": text}),
    )
    assert out["status"] == "unknown"


@pytest.mark.slow
async def test_unknown_delivery_listed_resent_and_dismissed(client, services, tg) -> None:
    use_channels(services, {"telegram": TelegramChannel(services.http, tg.token, api_base=tg.url)})
    job = await seed_job(services, status="succeeded")
    await _unknown(services, job.id, "your report is ready")
    listed = (await client.get("/api/v1/deliveries", params={"status": "unknown"})).json()
    (item,) = listed["items"]
    assert item["status"] == "unknown" and item["job_id"] == job.id
    assert item["generation"] == 0 and item["resendable"] is True and item["message_id"] is None
    resp = await client.post(f"/api/v1/deliveries/{item['id']}/resend")
    assert resp.status_code == 200, resp.text
    body = resp.json()["delivery"]
    assert body["status"] == "sent" and body["generation"] == 1
    assert body["message_id"] == str(tg.sent[-1]["message_id"]) and body["verified"] is True
    assert [m["text"] for m in tg.sent] == ["your report is ready"]
    (listed,) = (await client.get("/api/v1/deliveries", params={"job": job.id})).json()["items"]
    assert listed["status"] == "sent" and listed["message_id"] == body["message_id"]
    assert listed["verified"] is True and listed["generation"] == 1
    # sent now: neither resent nor dismissed again
    assert (await client.post(f"/api/v1/deliveries/{item['id']}/resend")).status_code == 409
    assert (await client.post(f"/api/v1/deliveries/{item['id']}/dismiss")).status_code == 409

    other = await seed_job(services, status="succeeded")
    await _unknown(services, other.id, "second")
    (row,) = (await client.get("/api/v1/deliveries", params={"job": other.id})).json()["items"]
    resp = await client.post(f"/api/v1/deliveries/{row['id']}/dismiss")
    assert resp.status_code == 200 and resp.json()["delivery"]["status"] == "dismissed"
    assert len(tg.sent) == 1
    assert (await client.post("/api/v1/deliveries/999999/resend")).status_code == 404
    async with services.sessionmaker() as s:
        actions = (
            await s.scalars(select(OpsAction.action).where(OpsAction.action.like("delivery_%")))
        ).all()
    assert sorted(actions) == ["delivery_dismiss", "delivery_resend"]


@pytest.mark.slow
async def test_read_token_cannot_resend_or_dismiss(services) -> None:
    services.settings.api_read_token = SecretStr(READ_TOKEN)
    job = await seed_job(services, status="succeeded")
    await _unknown(services, job.id, "x")
    app = create_app(services.settings, services=services)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {READ_TOKEN}", "x-requested-with": "test"},
    ) as c:
        (item,) = (await c.get("/api/v1/deliveries")).json()["items"]
        for action in ("resend", "dismiss"):
            resp = await c.post(f"/api/v1/deliveries/{item['id']}/{action}")
            assert resp.status_code == 403, resp.text


@pytest.mark.slow
async def test_bulk_resend_and_dismiss_take_the_lists_filter(client, services, tg) -> None:
    use_channels(services, {"telegram": TelegramChannel(services.http, tg.token, api_base=tg.url)})
    jobs = [await seed_job(services, status="succeeded") for _ in range(3)]
    for i, job in enumerate(jobs):
        await _unknown(services, job.id, f"report {i}")

    async def bulk(**kw):  # type: ignore[no-untyped-def]
        resp = await client.post("/api/v1/deliveries/bulk", json=kw)
        assert resp.status_code == 200, resp.text
        return resp.json()

    listed = (await client.get("/api/v1/deliveries", params={"channel": "telegram"})).json()
    dry = await bulk(action="resend", filter={"channel": "telegram"})
    assert dry["dry_run"] is True and dry["matched"] == len(listed["items"]) == 3
    assert dry["affected"] == 0 and tg.sent == []
    assert (await bulk(action="resend", filter={"channel": "feishu"}))["matched"] == 0
    # the oldest first, at most the limit: it says more are left
    first = await bulk(action="resend", filter={"status": "unknown"}, dry_run=False, limit=2)
    assert first["matched"] == 3 and first["capped"] is True and first["affected"] == 2
    assert [m["text"] for m in tg.sent] == ["report 0", "report 1"]
    rest = await bulk(action="dismiss", filter={"status": "unknown"}, dry_run=False)
    assert rest["matched"] == 1 and rest["affected"] == 1 and len(tg.sent) == 2
    statuses = sorted(
        d["status"]
        for d in (await client.get("/api/v1/deliveries?status=sent,dismissed")).json()["items"]
    )
    assert statuses == ["dismissed", "sent", "sent"]
    async with services.sessionmaker() as s:
        actions = (await s.scalars(select(OpsAction.action).order_by(OpsAction.id))).all()
    assert actions.count("delivery_resend") == 2 and actions.count("delivery_dismiss") == 1
    assert "bulk.resend" in actions and "bulk.dismiss" in actions

    for bad in (
        {"action": "explode", "filter": {}},
        {"action": "dismiss", "filter": {"colour": "red"}},
        {"action": "dismiss", "filter": {"status": "lost"}},
        {"action": "dismiss", "filter": {}, "limit": 501},
        {"action": "dismiss", "filter": {"since": "yesterday"}},
    ):
        assert (await client.post("/api/v1/deliveries/bulk", json=bad)).status_code == 422, bad
