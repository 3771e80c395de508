"""Telegram forum topics and Feishu threads: a background job dispatched from a topic keeps
``message_thread_id`` (or ``thread_id``) in its context and its result is posted back in that
topic — through the real worker, the fake servers speaking the platforms' APIs, on SQLite
and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from delivery.channels.limits import parse_target
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.store import get_job
from jobs.queue.worker import build_worker
from jobs.services import Services
from tests.fakes.feishu import GROUP as FS_GROUP
from tests.fakes.telegram import GROUP as TG_GROUP
from tests.helpers.settings import FAKE_SKILLS, make_settings


def test_a_contact_names_its_thread():
    t = parse_target("chat:-100123/42#777")
    assert (t.id, t.chat, t.thread, t.reply_to) == ("-100123", True, "42", "777")
    assert parse_target("chat:oc_1").thread is None
    assert parse_target("1001#5").thread is None  # a person, not a conversation


@pytest.fixture
async def svc(tmp_path, database_url, redis_server_url, redis_prefix, tg, fs):
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=str(FAKE_SKILLS),
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        feishu_app_id=fs.app_id,
        feishu_app_secret=fs.app_secret,
        feishu_api_base=fs.url,
    )
    services = await Services.open(s)
    yield services
    if services.redis is not None:
        keys = [k async for k in services.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await services.redis.delete(*keys)
    await services.close()


async def _drain(svc: Services) -> None:
    w = build_worker(svc, burst=True, handle_signals=False, scheduler=False)
    try:
        await asyncio.wait_for(w.async_run(), 90)
    finally:
        await w.close()


@pytest.mark.integration
@pytest.mark.slow
async def test_results_go_back_to_the_topic_they_were_asked_in(svc, tg, fs):
    asked_tg = tg.receive(TG_GROUP)
    asked_fs = fs.receive(FS_GROUP)
    common = {"role_id": "r1", "org_id": "o1"}
    tg_ctx = {
        **common,
        "channel": "telegram",
        "actor_key": "1001",
        "conversation_id": TG_GROUP,
        "conversation_type": "supergroup",
        "message_id": str(asked_tg),
        "message_thread_id": 42,
    }
    fs_ctx = {
        **common,
        "channel": "feishu",
        "actor_key": "ou_a",
        "conversation_id": FS_GROUP,
        "conversation_type": "group",
        "message_id": asked_fs,
        "thread_id": "omt_7",
    }
    long_text = "weekly numbers " + "x" * 5000  # more than one Telegram message
    ids = []
    for ctx, text in ((tg_ctx, long_text), (fs_ctx, "weekly numbers")):
        res = await Dispatcher(svc).dispatch("bg_report", {"message": text}, ctx)
        assert res.status_code == 202, res.body
        ids.append(res.body["job_id"])
    await _drain(svc)
    for job_id in ids:
        job = await get_job(svc.sessionmaker, job_id)
        assert job is not None and job.status == "succeeded", job and job.error
    ctx = svc.box.unseal((await get_job(svc.sessionmaker, ids[0])).context)
    assert ctx["message_thread_id"] == "42"
    # every Telegram message of the result is in topic 42; the first answers the question
    assert len(tg.sent) >= 2
    assert all((m["chat_id"], m.get("message_thread_id")) == (TG_GROUP, 42) for m in tg.sent)
    assert tg.sent[0].get("reply_to") == asked_tg
    # Feishu: a reply in the thread (reply_in_thread), in the group
    # Feishu: every message (the text, then the CSV) a reply in the thread
    assert [m["msg_type"] for m in fs.sent] == ["text", "file"]
    for sent in fs.sent:
        assert (sent["receive_id"], sent.get("reply_to"), sent.get("in_thread")) == (
            FS_GROUP,
            asked_fs,
            True,
        )
