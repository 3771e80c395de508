"""kill -9 of a real worker while its send is on the wire (the fake platform has the request
and holds its answer): on Telegram the item becomes ``unknown`` and is never sent again; on
Feishu the re-run sends it again with the same ``uuid`` and the person gets one message."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from sqlalchemy import select

from jobs.models import Delivery
from jobs.services import Services
from tests.helpers.jobs import dispatch, wait_status
from tests.helpers.settings import FAKE_SKILLS, make_settings
from tests.helpers.workers import WorkerProcess

pytestmark = pytest.mark.slow


def _settings(tmp_path, pg_url, redis_server_url, redis_prefix, **kw):
    return make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=pg_url,
        skills_path=str(FAKE_SKILLS),
        worker_grace_sec=1.0,
        worker_lease_sec=3.0,
        worker_heartbeat_sec=0.5,
        reconcile_interval_sec=0.5,
        reconcile_stale_sec=2.0,
        **kw,
    )


async def _wait_request(server, tail: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if any(r.path.endswith(tail) for r in server.requests):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no request to {tail}")


async def _row(svc: Services, job_id: str, limit: float = 60.0, until=("unknown", "sent")):
    deadline = time.monotonic() + limit
    row = None
    while time.monotonic() < deadline:
        async with svc.sessionmaker() as s:
            row = (await s.scalars(select(Delivery).where(Delivery.job_id == job_id))).first()
        if row is not None and row.status in until:
            return row
        await asyncio.sleep(0.1)
    raise AssertionError(f"delivery stuck: {row.status if row else None}")


async def _kill_mid_send(tmp_path, settings, server, tail: str, ctx: dict, env: dict):
    svc = await Services.open(settings)
    workers = [WorkerProcess(settings, tmp_path / "w0.log", **env)]
    try:
        server.lose_delay = 60.0  # the answer never comes while the worker lives
        server.lose_answers[tail] = 1
        job_id = await dispatch(svc, "bg_report", {"message": "Your report"}, ctx)
        await _wait_request(server, tail)
        await asyncio.sleep(0.3)  # the row says ``sending`` (it is set before the request)
        workers[0].signal(signal.SIGKILL)
        workers.append(WorkerProcess(settings, tmp_path / "w1.log", **env))
        await wait_status(svc, job_id, {"succeeded", "failed"}, limit=90)
        return svc, job_id, workers
    except BaseException:
        for w in workers:
            w.stop()
        await svc.close()
        raise


@pytest.mark.slow
async def test_kill_9_mid_send_on_telegram_is_unknown_not_resent(
    tmp_path, pg_url, redis_server_url, redis_prefix, tg
) -> None:
    settings = _settings(tmp_path, pg_url, redis_server_url, redis_prefix)
    env = {"SKILLJOBS_TELEGRAM_BOT_TOKEN": tg.token, "SKILLJOBS_TELEGRAM_API_BASE": tg.url}
    ctx = {"channel": "telegram", "actor_key": "1001", "role_id": "r1", "session_id": "s-k"}
    svc, job_id, workers = await _kill_mid_send(tmp_path, settings, tg, "/sendDocument", ctx, env)
    try:
        row = await _row(svc, job_id)
        assert row.status == "unknown", (row.status, row.error)
        await asyncio.sleep(1.0)
        docs = [m for m in tg.sent if m["method"] == "sendDocument"]
        assert len(docs) == 1  # the one whose answer was lost; never sent again
        assert len([r for r in tg.requests if r.path.endswith("/sendDocument")]) == 1
    finally:
        for w in workers:
            w.stop()
        await svc.close()


@pytest.mark.slow
async def test_kill_9_mid_send_on_feishu_is_sent_again_with_the_same_uuid(
    tmp_path, pg_url, redis_server_url, redis_prefix, fs
) -> None:
    settings = _settings(tmp_path, pg_url, redis_server_url, redis_prefix)
    env = {
        "SKILLJOBS_FEISHU_APP_ID": fs.app_id,
        "SKILLJOBS_FEISHU_APP_SECRET": fs.app_secret,
        "SKILLJOBS_FEISHU_API_BASE": fs.url,
    }
    ctx = {"channel": "feishu", "actor_key": "ou_k", "role_id": "r1", "session_id": "s-f"}
    tail = "/open-apis/im/v1/messages"
    svc, job_id, workers = await _kill_mid_send(tmp_path, settings, fs, tail, ctx, env)
    try:
        row = await _row(svc, job_id, until=("sent",))
        assert row.status == "sent" and row.message_id
        calls = [r for r in fs.requests if r.path == tail]
        first_uuids = [c.json.get("uuid") for c in calls]
        # the re-run repeated what it had to, under the same uuids: one message each
        assert len(calls) > len(set(first_uuids)) >= 1
        assert len({m["message_id"] for m in fs.sent}) == len(fs.sent) == len(set(first_uuids))
    finally:
        for w in workers:
            w.stop()
        await svc.close()
