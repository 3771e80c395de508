"""``/metrics`` latency histograms: queue wait per skill and delivery latency per channel,
from the recorded timestamps — seeded rows on both backends, and real worker processes
delivering to the fake Telegram server."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from dashboard.app import create_app
from delivery.channels.limits import Target
from delivery.ratelimit import RateLimiter
from jobs.models import Delivery, Job
from jobs.queue.worker import build_worker
from jobs.services import Services
from tests.helpers.dashboard import TOKEN, seed_job, seed_rows
from tests.helpers.jobs import dispatch, wait_status
from tests.helpers.settings import FAKE_SKILLS, make_settings
from tests.helpers.workers import WorkerProcess

OUTBOX_SKILLS = Path(__file__).resolve().parents[1] / "delivery" / "outbox_skills"
WAIT = "skilljobs_job_queue_wait_seconds"
LATENCY = "skilljobs_delivery_latency_seconds"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _get(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"window": "3600s", **labels}.items())))]


@pytest.mark.slow
async def test_histograms_match_the_seeded_timestamps(client: httpx.AsyncClient, services) -> None:
    now = time.time()
    for wait in (0.02, 0.3, 4.0):
        await seed_job(
            services,
            skill="a",
            created_at=now - 100,
            started_at=now - 100 + wait,
            finished_at=now - 50,
        )
    # a worker clock a little behind the dispatcher's: counted as no wait, not negative
    await seed_job(
        services, skill="b", created_at=now - 100, started_at=now - 100.5, finished_at=now - 50
    )
    # finished before the window: not counted
    await seed_job(services, skill="a", created_at=now - 9000, finished_at=now - 8000)
    # queued, never started: no wait yet
    await seed_job(services, skill="a", status="queued", created_at=now - 30)

    def sent(key: str, took: float, **kw: object) -> Delivery:
        values: dict[str, object] = {
            "ledger_key": key,
            "recipient": "telegram:1",
            "channel": "telegram",
            "status": "sent",
            "created_at": now - 60,
            "sent_at": now - 60 + took,
        }
        values.update(kw)
        return Delivery(**values)

    await seed_rows(
        services,
        sent("d1", 0.2),
        sent("d2", 1.5),
        sent("d3", 20.0),
        sent("w1", 0.0, recipient="web:s1", channel="web"),
        sent("d4", 3000.0, generation=1),  # an operator's resend days later is not latency
        sent("d5", 2.0, status="failed"),
        sent("d6", 2.0, created_at=now - 9000, sent_at=now - 8990),  # before the window
    )
    s = _samples((await client.get("/metrics")).text)

    assert _get(s, f"{WAIT}_count", skill="a") == 3
    assert abs(_get(s, f"{WAIT}_sum", skill="a") - 4.32) < 1e-6
    assert _get(s, f"{WAIT}_bucket", skill="a", le="0.01") == 0
    assert _get(s, f"{WAIT}_bucket", skill="a", le="0.05") == 1
    assert _get(s, f"{WAIT}_bucket", skill="a", le="0.5") == 2
    assert _get(s, f"{WAIT}_bucket", skill="a", le="5.0") == 3
    assert _get(s, f"{WAIT}_bucket", skill="a", le="+Inf") == 3
    assert _get(s, f"{WAIT}_count", skill="b") == 1 and _get(s, f"{WAIT}_sum", skill="b") == 0

    assert _get(s, f"{LATENCY}_count", channel="telegram") == 3
    assert abs(_get(s, f"{LATENCY}_sum", channel="telegram") - 21.7) < 1e-6
    assert _get(s, f"{LATENCY}_bucket", channel="telegram", le="0.25") == 1
    assert _get(s, f"{LATENCY}_bucket", channel="telegram", le="2.5") == 2
    assert _get(s, f"{LATENCY}_bucket", channel="telegram", le="30.0") == 3
    assert _get(s, f"{LATENCY}_count", channel="web") == 1


@pytest.mark.slow
async def test_empty_database_has_the_families_and_no_series(client: httpx.AsyncClient) -> None:
    families = {
        f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)
    }
    assert families[WAIT].type == "histogram" and families[WAIT].samples == []
    assert families[LATENCY].type == "histogram" and families[LATENCY].samples == []


@pytest.mark.slow
async def test_rate_limiter_waits_are_counted_across_limiters(
    client: httpx.AsyncClient, services, tmp_path, redis_server_url: str, redis_prefix: str
) -> None:
    """Three limiters on their own Redis connections (three workers) sending to one chat:
    /metrics counts every send that waited and the seconds waited, over all of them."""
    rates = json.dumps({"telegram": {"bot": [30, 1], "chat": [2, 0.2]}})
    settings = make_settings(
        tmp_path, redis_url=redis_server_url, prefix=redis_prefix, rate_limits=rates
    )
    clients = [aioredis.from_url(redis_server_url) for _ in range(3)]
    waited: list[float] = []

    async def send(limiter: RateLimiter) -> None:
        for _ in range(3):
            waited.append(await limiter.acquire("telegram", Target("1001")))

    try:
        await asyncio.gather(*(send(RateLimiter.from_settings(c, settings)) for c in clients))
        await RateLimiter.from_settings(clients[0], settings).acquire("feishu", Target("ou_1"))
    finally:
        for c in clients:
            await c.aclose()
    assert len(waited) == 9 and sum(1 for w in waited if w > 0) >= 6  # capacity 2, 9 sends
    s = _samples((await client.get("/metrics")).text)
    waits = s[("skilljobs_ratelimit_waits_total", (("channel", "telegram"),))]
    seconds = s[("skilljobs_ratelimit_wait_seconds_total", (("channel", "telegram"),))]
    assert waits == sum(1 for w in waited if w > 0)
    assert abs(seconds - sum(waited)) < 1e-6
    assert ("skilljobs_ratelimit_waits_total", (("channel", "feishu"),)) not in s  # no wait


@pytest.mark.slow
async def test_parked_sends_are_counted_and_their_wait_is_latency(
    tmp_path, database_url: str, redis_server_url: str, redis_prefix: str, tg
) -> None:
    """One message per 2 s to a chat, three results for it from a real worker: the first
    goes at once, the other two are parked in the outbox. /metrics counts the two parks,
    and the delivery latency histogram holds their waits."""
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=str(OUTBOX_SKILLS),
        api_token=TOKEN,
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        rate_limits=json.dumps({"telegram": {"chat": [1, 2]}}),
    )
    svc = await Services.open(settings)
    worker = build_worker(svc, handle_signals=False, scheduler=False)
    run = asyncio.create_task(worker.async_run())
    try:
        ctx = {"channel": "telegram", "actor_key": "1001", "role_id": "r1", "session_id": "s-p"}
        ids = [await dispatch(svc, "say", {"text": f"n{n}"}, ctx) for n in range(3)]
        for job_id in ids:
            await wait_status(svc, job_id, {"succeeded"}, limit=60)
        deadline = time.monotonic() + 60
        while True:  # the channel's answer first, then the ledger records the send
            async with svc.sessionmaker() as session:
                rows = (await session.scalars(select(Delivery))).all()
            sent = [r.status for r in rows] == ["sent"] * 3
            if (len(tg.sent) >= 3 and sent) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert [r.status for r in rows] == ["sent"] * 3
        app = create_app(settings, services=svc)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://127.0.0.1",
            headers={"authorization": f"Bearer {TOKEN}"},
        ) as client:
            s = _samples((await client.get("/metrics")).text)
    finally:
        await worker.close()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        keys = [k async for k in svc.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await svc.redis.delete(*keys)
        await svc.close()
    assert s[("skilljobs_ratelimit_parked_total", (("channel", "telegram"),))] == 2
    took = sorted(max(0.0, r.sent_at - r.created_at) for r in rows)
    assert took[-1] >= 3.5  # the last one waited for two tokens (2 s each)
    assert _get(s, f"{LATENCY}_count", channel="telegram") == 3
    assert abs(_get(s, f"{LATENCY}_sum", channel="telegram") - sum(took)) < 1e-6


@pytest.mark.slow
async def test_real_workers_dispatch_and_deliveries(
    tmp_path, pg_url, redis_server_url, redis_prefix, tg
) -> None:
    """Jobs dispatched here, run and delivered by two worker processes: the histograms
    count every job and every sent item, with the sums of the rows' own timestamps."""
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=pg_url,
        skills_path=str(FAKE_SKILLS),
        api_token=TOKEN,
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
    )
    env = {"SKILLJOBS_TELEGRAM_BOT_TOKEN": tg.token, "SKILLJOBS_TELEGRAM_API_BASE": tg.url}
    svc = await Services.open(settings)
    workers = [WorkerProcess(settings, tmp_path / f"w{i}.log", **env) for i in range(2)]
    try:
        ctx = {"channel": "telegram", "actor_key": "1001", "role_id": "r1", "session_id": "s-m"}
        ids = await asyncio.gather(
            *(dispatch(svc, "bg_report", {"message": f"report {i}"}, ctx) for i in range(6))
        )
        for job_id in ids:
            job = await wait_status(svc, job_id, {"succeeded", "failed"}, limit=90)
            assert job.status == "succeeded", job.error
        # one chat, 1 message/s: the later results wait in the outbox after their jobs end
        deadline = time.monotonic() + 60
        while True:
            async with svc.sessionmaker() as s:
                jobs = (await s.scalars(select(Job).where(Job.id.in_(ids)))).all()
                sent = (await s.scalars(select(Delivery).where(Delivery.status == "sent"))).all()
            if len(sent) >= len(ids) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert len(sent) >= len(ids) and len(tg.sent) == len(sent)
        app = create_app(settings, services=svc)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://127.0.0.1",
            headers={"authorization": f"Bearer {TOKEN}"},
        ) as client:
            s = _samples((await client.get("/metrics")).text)
        waits = [max(0.0, j.started_at - j.created_at) for j in jobs]
        assert _get(s, f"{WAIT}_count", skill="bg_report") == len(ids)
        assert abs(_get(s, f"{WAIT}_sum", skill="bg_report") - sum(waits)) < 1e-6
        took = [max(0.0, d.sent_at - d.created_at) for d in sent]
        assert _get(s, f"{LATENCY}_count", channel="telegram") == len(sent)
        assert abs(_get(s, f"{LATENCY}_sum", channel="telegram") - sum(took)) < 1e-6
        assert _get(s, f"{LATENCY}_bucket", channel="telegram", le="+Inf") == len(sent)
    finally:
        for w in workers:
            w.stop()
        await svc.close()
