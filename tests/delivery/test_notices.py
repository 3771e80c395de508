"""Telling the person: "still working" once a background run outlasts
``SKILLJOBS_NOTICE_AFTER_S`` (or when the skill calls ``progress()``), "cancelled" when a
job is cancelled — each once, through the delivery ledger, in the person's language, and
both can be turned off. Real worker, fake Telegram, a web session."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import select

from delivery import notices
from delivery.channels.web import list_messages
from jobs.models import Delivery
from jobs.queue.control import cancel_job
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.worker import build_worker
from jobs.services import Services
from tests.helpers.jobs import drain, wait_status
from tests.helpers.settings import TESTS, make_settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKING_EN = "slow_task is still working on it; the result will be sent here when it is ready."


async def _services(tmp_path, database_url, redis_server_url, redis_prefix, tg, **kw: Any):
    tg.known_chats.update({"4001", "4002", "4003", "4004", "4005"})
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=str(TESTS / "result_skills"),
        # trusted: these handlers run in the worker, so a notice's timing is the skill's own
        # (a sandbox's start would count toward "still working")
        trusted_skills=str(TESTS / "result_skills"),
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        worker_lease_sec=5.0,
        **kw,
    )
    return await Services.open(s)


@pytest.fixture
async def svc(tmp_path, database_url, redis_server_url, redis_prefix, tg):
    services = await _services(
        tmp_path, database_url, redis_server_url, redis_prefix, tg, notice_after_s=0.2
    )
    yield services
    await services.close()


def tg_ctx(chat: str, **extra: Any) -> dict[str, Any]:
    return {"channel": "telegram", "actor_key": chat, "role_id": "r1", "org_id": "o1", **extra}


def texts(tg: Any, chat: str) -> list[str]:
    return [m.get("text") or "" for m in tg.sent if m["chat_id"] == chat]


async def dispatch(svc: Services, skill: str, inp: dict[str, Any], ctx: dict[str, Any]) -> str:
    res = await Dispatcher(svc).dispatch(skill, inp, ctx)
    assert res.status_code == 202, res.body
    return str(res.body["job_id"])


async def ledger_items(svc: Services, job_id: str) -> list[str]:
    async with svc.sessionmaker() as s:
        rows = await s.scalars(select(Delivery).where(Delivery.job_id == job_id))
        return sorted(r.item for r in rows)


async def test_a_long_job_says_it_is_still_working_once(svc, tg) -> None:
    job = await dispatch(svc, "slow_task", {"seconds": 1.0}, tg_ctx("4001"))
    quick = await dispatch(svc, "slow_task", {"seconds": 0}, tg_ctx("4002"))
    zh = await dispatch(svc, "slow_task", {"seconds": 1.0}, tg_ctx("4003", locale="zh-CN"))
    await drain(svc)
    assert texts(tg, "4001") == [WORKING_EN, "slow task done"]
    assert texts(tg, "4002") == ["slow task done"]  # done before the notice was due
    assert texts(tg, "4003") == ["slow_task 仍在处理中，完成后结果会发送到这里。", "slow task done"]
    assert await ledger_items(svc, job) == ["notice:working", "text"]
    assert await ledger_items(svc, quick) == ["text"]
    assert zh


async def test_a_progress_call_tells_the_person_at_once(svc, tg) -> None:
    job = await dispatch(svc, "busy_task", {"seconds": 0.05}, tg_ctx("4004"))
    await drain(svc)
    assert texts(tg, "4004") == [
        "busy_task is still working on it; the result will be sent here when it is ready.",
        "busy task done",
    ]
    assert await ledger_items(svc, job) == ["notice:working", "text"]


async def test_cancelled_jobs_say_so_once(svc, tg) -> None:
    # queued, cancelled before any worker took it
    queued = await dispatch(svc, "slow_task", {"seconds": 0}, tg_ctx("4005"))
    assert (await cancel_job(svc, queued, notices=notices, actor="ops")).ok
    assert texts(tg, "4005") == ["slow_task was cancelled; no result will follow."]
    assert not (
        await cancel_job(svc, queued, notices=notices, actor="ops")
    ).ok  # nothing sent again

    # running in a worker, then cancelled: the notice comes after "still working"
    running = await dispatch(svc, "slow_task", {"seconds": 30}, {**tg_ctx("4005")})
    w = build_worker(svc, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    try:
        await wait_status(svc, running, {"running"})
        deadline = time.monotonic() + 10
        while WORKING_EN not in texts(tg, "4005") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert (await cancel_job(svc, running, notices=notices, actor="ops")).ok
        await wait_status(svc, running, {"cancelled"})
        deadline = time.monotonic() + 10
        while len(texts(tg, "4005")) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await w.close()
    assert texts(tg, "4005") == [
        "slow_task was cancelled; no result will follow.",
        WORKING_EN,
        "slow_task was cancelled; no result will follow.",
    ]
    assert await ledger_items(svc, running) == ["notice:cancelled", "notice:working"]


async def test_notices_can_be_turned_off(
    tmp_path, database_url, redis_server_url, redis_prefix, tg
) -> None:
    svc = await _services(
        tmp_path,
        database_url,
        redis_server_url,
        redis_prefix,
        tg,
        notice_after_s=0.1,
        notice_working=False,
        notice_cancelled=False,
    )
    try:
        await dispatch(svc, "busy_task", {"seconds": 0.3}, tg_ctx("4001"))
        queued = await dispatch(svc, "slow_task", {"seconds": 0}, tg_ctx("4002"))
        assert (await cancel_job(svc, queued, notices=notices)).ok
        await drain(svc)
    finally:
        await svc.close()
    assert texts(tg, "4001") == ["busy task done"]
    assert texts(tg, "4002") == []


async def test_a_web_session_gets_the_notice_as_a_message(svc) -> None:
    ctx = {"channel": "web", "session_id": "s-notice", "role_id": "r1", "org_id": "o1"}
    await dispatch(svc, "slow_task", {"seconds": 0.8}, {**ctx, "external_id": "orgdeleg:s-notice"})
    await drain(svc)
    got = [m["text"] for m in await list_messages(svc.sessionmaker, "s-notice")]
    assert got == [WORKING_EN, "slow task done"]
