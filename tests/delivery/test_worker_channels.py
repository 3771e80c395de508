"""Channel rules through a real worker, from a real dispatch.

A request from a group conversation is answered in that group: the dispatch context's
``conversation_id`` (and ``message_id``) travel with the background job to each platform's
group API — Telegram's negative chat id, Feishu ``receive_id_type=chat_id``, WeCom app
chats, DingTalk group robot messages — replying to the message that asked where the
platform has replies. An access token that expires in the middle of a batch of results is
refreshed once for all of the worker's concurrent sends, and every message is sent once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select

from dashboard.shapes import job_dict
from jobs.context import background_context, group_conversation
from jobs.models import Delivery, Job
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.worker import build_worker
from jobs.services import Services
from tests.fakes.dingtalk import GROUP as DT_GROUP
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.feishu import GROUP as FS_GROUP
from tests.fakes.telegram import GROUP as TG_GROUP
from tests.fakes.wecom import FakeWeCom
from tests.helpers.settings import FAKE_SKILLS, make_settings

WC_GROUP = "wrchat1"


@pytest.fixture
def wc():
    with FakeWeCom() as server:
        yield server


@pytest.fixture
def dt():
    with FakeDingTalk() as server:
        yield server


@pytest.fixture
async def svc(tmp_path, database_url, redis_server_url, redis_prefix, tg, fs, wc, dt):
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
        wecom_corp_id=wc.corp_id,
        wecom_corp_secret=wc.corp_secret,
        wecom_agent_id=str(wc.agent_id),
        wecom_api_base=wc.url,
        dingtalk_app_key=dt.app_key,
        dingtalk_app_secret=dt.app_secret,
        dingtalk_robot_code=dt.robot_code,
        dingtalk_api_base=dt.url,
        dingtalk_oapi_base=dt.oapi.url,
    )
    services = await Services.open(s)
    yield services
    if services.redis is not None:
        keys = [k async for k in services.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await services.redis.delete(*keys)
    await services.close()


def origin(channel: str, actor: str, **extra: Any) -> dict[str, Any]:
    return {"channel": channel, "actor_key": actor, "role_id": "r1", "org_id": "o1", **extra}


async def dispatch(svc: Services, ctx: dict[str, Any], message: str) -> str:
    res = await Dispatcher(svc).dispatch("bg_report", {"message": message}, ctx)
    assert res.status_code == 202, res.body
    return str(res.body["job_id"])


async def drain(svc: Services) -> None:
    w = build_worker(svc, burst=True, handle_signals=False, scheduler=False)
    try:
        await asyncio.wait_for(w.async_run(), 90)
    finally:
        await w.close()


async def recipients(svc: Services, job_id: str) -> list[tuple[str, str]]:
    async with svc.sessionmaker() as s:
        rows = await s.execute(
            select(Delivery).where(Delivery.job_id == job_id).order_by(Delivery.id)
        )
        return [(d.recipient, d.status) for d in rows.scalars()]


def test_a_group_conversation_is_named_by_the_context() -> None:
    assert group_conversation({"conversation_id": "oc_1", "actor_key": "ou_a"}) == "oc_1"
    assert group_conversation({"conversation_id": "chat:cid9==", "actor_key": "u"}) == "cid9=="
    # a one-to-one chat is the person's own: Telegram's private chat id is the user's id
    assert group_conversation({"conversation_id": "1001", "actor_key": "1001"}) == ""
    p2p = {"conversation_id": "oc_2", "conversation_type": "p2p", "actor_key": "ou_a"}
    assert group_conversation(p2p) == ""
    assert group_conversation({"actor_key": "ou_a"}) == ""
    # the rebuilt background context keeps them (the chat layer's context had them)
    ctx = background_context(
        {**p2p, "channel": "feishu", "message_id": "om_5", "role_id": "r"}, skill="s", configs={}
    )
    assert (ctx["conversation_id"], ctx["conversation_type"], ctx["message_id"]) == (
        "oc_2",
        "p2p",
        "om_5",
    )
    # configs never shadow where a request came from
    ctx = background_context(
        {"conversation_id": "oc_1"}, skill="s", configs={"conversation_id": "oc_evil"}
    )
    assert ctx["conversation_id"] == "oc_1"


@pytest.mark.slow
async def test_a_dispatch_from_a_group_is_delivered_to_that_group(svc, tg, fs, wc, dt) -> None:
    asked_tg, asked_fs = tg.receive(TG_GROUP), fs.receive(FS_GROUP)
    jobs = {
        "telegram": await dispatch(
            svc,
            origin("telegram", "1001", conversation_id=TG_GROUP, message_id=str(asked_tg)),
            "numbers for the telegram group",
        ),
        "feishu": await dispatch(
            svc,
            origin("feishu", "ou_a", conversation_id=FS_GROUP, message_id=asked_fs),
            "numbers for the feishu group",
        ),
        "wecom": await dispatch(
            svc,
            origin("wecom", "zhangsan", conversation_id=WC_GROUP, message_id="m-1"),
            "numbers for the wecom group",
        ),
        "dingtalk": await dispatch(
            svc,
            origin("dingtalk", "user001", conversation_id=DT_GROUP, message_id="msg-1"),
            "numbers for the dingtalk group",
        ),
    }
    async with svc.sessionmaker() as s:
        job = await s.get(Job, jobs["feishu"])
        assert job is not None
        assert (job.context["conversation_id"], job.context["message_id"]) == (FS_GROUP, asked_fs)
        shown = job_dict(job, [], [])["origin"]  # the job's origin in the API and dashboard
        assert (shown["conversation_id"], shown["message_id"]) == (FS_GROUP, asked_fs)
    await drain(svc)

    # Telegram: the group's negative chat id, the document answering the message that asked
    (doc,) = tg.sent
    assert (doc["method"], doc["chat_id"], doc.get("reply_to")) == (
        "sendDocument",
        TG_GROUP,
        asked_tg,
    )
    assert doc["caption"] == "numbers for the telegram group"
    # Feishu: the text replies in the group (reply API), the file goes to the chat_id
    assert [(m["receive_id_type"], m["receive_id"], m.get("reply_to")) for m in fs.sent] == [
        ("chat_id", FS_GROUP, asked_fs),
        ("chat_id", FS_GROUP, None),
    ]
    assert [m["msg_type"] for m in fs.sent] == ["text", "file"]
    # WeCom: the app chat (appchat/send), never a member's message/send
    assert [(m.get("chatid"), m.get("touser"), m["msgtype"]) for m in wc.sent] == [
        (WC_GROUP, None, "text"),
        (WC_GROUP, None, "file"),
    ]
    # DingTalk: group robot messages to the openConversationId
    assert [(m.get("openConversationId"), m.get("userId"), m["msgKey"]) for m in dt.sent] == [
        (DT_GROUP, None, "sampleText"),
        (DT_GROUP, None, "sampleFile"),
    ]
    assert await recipients(svc, jobs["telegram"]) == [(f"telegram:chat:{TG_GROUP}", "sent")]
    assert await recipients(svc, jobs["dingtalk"]) == [
        (f"dingtalk:chat:{DT_GROUP}", "sent"),
        (f"dingtalk:chat:{DT_GROUP}", "sent"),
    ]


@pytest.mark.slow
async def test_a_one_to_one_conversation_goes_to_the_person(svc, tg, fs) -> None:
    own_chat = await dispatch(
        svc, origin("telegram", "1001", conversation_id="1001"), "to me on telegram"
    )
    p2p = await dispatch(
        svc,
        origin("feishu", "ou_a", conversation_id="oc_p2p", conversation_type="p2p"),
        "to me on feishu",
    )
    await drain(svc)
    assert [(m["chat_id"], m.get("reply_to")) for m in tg.sent] == [("1001", None)]
    assert {(m["receive_id_type"], m["receive_id"]) for m in fs.sent} == {("open_id", "ou_a")}
    assert await recipients(svc, own_chat) == [("telegram:1001", "sent")]
    assert {r for r, _ in await recipients(svc, p2p)} == {"feishu:ou_a"}


@pytest.mark.slow
async def test_a_token_expiring_mid_batch_is_refreshed_once_and_each_message_sent_once(
    svc, fs, wc
) -> None:
    members = [f"member{i}" for i in range(8)]
    wc.users |= set(members)
    # each result is a text, an upload and a file message: 24 uses of each platform's token,
    # the first serves 12 and expires in the middle of the batch
    wc.tokens.expire_after = 12
    fs.tokens.expire_after = 12
    jobs = [
        *[await dispatch(svc, origin("wecom", m), f"report for {m}") for m in members],
        *[await dispatch(svc, origin("feishu", f"ou_{m}"), f"report for ou_{m}") for m in members],
    ]
    await drain(svc)
    assert len(wc.calls("/cgi-bin/gettoken")) == 2
    assert len(fs.calls("/open-apis/auth/v3/tenant_access_token/internal")) == 2
    texts = sorted(m["text"]["content"] for m in wc.sent if m["msgtype"] == "text")
    assert texts == sorted(f"report for {m}" for m in members)
    assert sorted(m["touser"] for m in wc.sent if m["msgtype"] == "file") == sorted(members)
    fs_texts = sorted(m["content"]["text"] for m in fs.sent if m["msg_type"] == "text")
    assert fs_texts == sorted(f"report for ou_{m}" for m in members)
    assert sum(m["msg_type"] == "file" for m in fs.sent) == len(members)
    for job_id in jobs:
        assert [status for _, status in await recipients(svc, job_id)] == ["sent", "sent"]


@pytest.mark.slow
async def test_a_refusal_is_recorded_with_what_to_fix(svc, tg, fs, wc, dt) -> None:
    """Each platform's "bot not in the chat / user unreachable" answer ends the item failed
    (not retried) with a human reason in the delivery record the API and dashboard show."""
    jobs = {
        "the user blocked the bot": await dispatch(svc, origin("telegram", "1003"), "x"),
        "availability range": await dispatch(svc, origin("feishu", "ou_blocked"), "x"),
        "bot is not in this group chat": await dispatch(
            svc, origin("feishu", "ou_a", conversation_id="oc_elsewhere"), "x"
        ),
        "visible range": await dispatch(svc, origin("wecom", "nobody"), "x"),
        "robot is not in this group": await dispatch(
            svc, origin("dingtalk", "user001", conversation_id="cidNoRobot=="), "x"
        ),
    }
    await drain(svc)
    for reason, job_id in jobs.items():
        async with svc.sessionmaker() as s:
            job = await s.get(Job, job_id)
            rows = await s.execute(select(Delivery).where(Delivery.job_id == job_id))
            assert job is not None
            shown = job_dict(job, [], list(rows.scalars()))
        assert shown["status"] == "succeeded"  # a refused delivery never fails the job
        first = shown["deliveries"][0]
        assert first["status"] == "failed" and reason in first["error"], (reason, first)
        assert "HTTP 4" not in first["error"] and first["tries"] == 1


@pytest.mark.slow
async def test_reply_to_current_answers_the_dispatched_message(svc, tg) -> None:
    """In a one-to-one chat a result answers the message that asked only when it says so
    ([[reply_to_current]]): the dispatch context's message_id reaches the delivery."""
    asked = tg.receive("1001")
    ctx = origin("telegram", "1001", message_id=str(asked))
    await dispatch(svc, ctx, "[[reply_to_current]] here it is")
    await dispatch(svc, ctx, "and without the tag")
    await drain(svc)
    replies = {m["caption"]: m.get("reply_to") for m in tg.sent}
    assert replies == {"here it is": asked, "and without the tag": None}
