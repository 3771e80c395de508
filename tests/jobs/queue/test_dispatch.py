"""The dispatcher on SQLite and PostgreSQL with real Redis: receipts vs sync per channel,
refusals, the rebuilt background context and secrets at rest."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select, text

from jobs.catalog.configs import ConfigStore
from jobs.models import ChatSession, Job
from jobs.queue.dispatcher import Dispatcher

TG = {
    "channel": "telegram",
    "actor_key": "tg-4242",
    "role_id": "r1",
    "org_id": "o1",
    "session_id": "s-tg",
}


async def _job(services, job_id: str) -> Job:
    async with services.sessionmaker() as s:
        return await s.get(Job, job_id)


@pytest.mark.parametrize(
    ("channel", "external_id", "expect_async"),
    [
        ("telegram", "", True),
        ("feishu", "", True),
        ("wecom", "", True),
        ("dingtalk", "", True),
        ("web", "", False),
        ("web_admin", "", False),
        ("web", "orgdeleg:acme", True),
        ("web_admin", "orgdeleg:x", True),
    ],
)
@pytest.mark.slow
async def test_async_skill_receipt_or_sync_per_channel(
    services, channel, external_id, expect_async
):
    ctx = {"channel": channel, "actor_key": "u1", "role_id": "r1", "session_id": "sess-1"}
    res = await Dispatcher(services).dispatch("bg_sleep", {"seconds": 0}, ctx, external_id or None)
    if expect_async:
        assert res.status_code == 202
        assert set(res.body) == {"ok", "async", "message", "job_id"}
        assert res.body["ok"] is True and res.body["async"] is True
        job = await _job(services, res.body["job_id"])
        assert job.status == "queued" and job.channel == channel
        assert job.external_id == external_id
        # durably recorded AND enqueued before the receipt
        queued = await services.redis.zrange(services.settings.queue_name, 0, -1)
        assert f"{job.id}:0".encode() in queued
    else:
        assert res.status_code == 200
        assert res.body["ok"] is True and res.body["message"] == "slept 0s"
        async with services.sessionmaker() as s:
            assert (await s.scalar(select(Job.id))) is None


@pytest.mark.slow
async def test_sync_skill_runs_now_even_from_telegram(services):
    res = await Dispatcher(services).dispatch("sync_echo", {"x": 1}, TG)
    assert res.status_code == 200
    assert res.body["echo"] == {"x": 1}
    assert res.body["chat_mode"] is True and res.body["channel"] == "telegram"


@pytest.mark.slow
async def test_orgdeleg_and_web_sessions_are_recorded_for_delivery(services):
    ctx = {"channel": "web", "session_id": "chat-77", "role_id": "r1", "org_id": "o1"}
    res = await Dispatcher(services).dispatch("bg_sleep", {}, ctx, "orgdeleg:acme")
    assert res.status_code == 202
    async with services.sessionmaker() as s:
        sess = await s.get(ChatSession, "chat-77")
    assert sess is not None and sess.external_id == "orgdeleg:acme" and sess.role_id == "r1"


@pytest.mark.parametrize(
    ("skill", "inp", "ctx", "code", "needle"),
    [
        ("nope", {}, TG, 404, "unknown skill 'nope'"),
        ("broken_entry", {}, TG, 409, "failed to load"),
        ("doc_only", {}, TG, 400, "skill_md document"),
        ("bg_sleep", {}, {**TG, "actor_key": ""}, 422, "no actor_key"),
        ("bg_sleep", {}, {**TG, "actor_is_admin": True}, 422, "no actor_key"),
        ("needs_name", {"count": 1}, TG, 422, "missing required field 'name'"),
        ("needs_name", {"name": "", "count": 1}, TG, 422, "missing required field 'name'"),
        ("needs_name", {"name": "  ", "count": 1}, TG, 422, "missing required field 'name'"),
        ("needs_name", {"name": None, "count": 2}, TG, 422, "missing required field 'name'"),
        ("needs_name", {"name": "a", "count": "x"}, TG, 422, "count"),
        ("needs_name", {"name": "a", "count": 1, "flag": "yes"}, TG, 422, "flag"),
    ],
)
@pytest.mark.slow
async def test_refusals_are_clear_and_recoverable(services, skill, inp, ctx, code, needle):
    res = await Dispatcher(services).dispatch(skill, inp, ctx)
    assert res.status_code == code, res.body
    assert res.body["ok"] is False
    assert needle in res.body["error"]
    if code == 409 or skill == "doc_only":
        # a skill that failed to load, a document skill: the operator must fix the folder
        # (as the executor says); no other input would help
        assert res.body["error_type"] == "config" and res.body["non_retriable"] is True
    else:
        assert res.body["error_type"] == "recoverable"
    async with services.sessionmaker() as s:
        assert (await s.scalar(select(Job.id))) is None  # nothing half-recorded


@pytest.mark.slow
async def test_zero_and_false_are_values(services):
    res = await Dispatcher(services).dispatch(
        "needs_name", {"name": "a", "count": 0, "flag": False}, TG
    )
    assert res.status_code == 202, res.body


@pytest.mark.slow
async def test_background_context_is_rebuilt_exactly(services):
    await ConfigStore(services.sessionmaker, services.box).replace(
        "r1", "bg_ctx", {"region": "cn-north", "api_token": "tok-123"}
    )
    origin = {
        **TG,
        "actor_name": "Li Lei",
        "actor_title": "Lead",
        "actor_tags": ["vip"],
        "actor_id": "u-9",
        "actor_phone": "+86 100",
        "actor_email": "li@example.com",
        "actor_emp_no": "E7",
        "raw_input": "make the report",
        "triggered_at": 1767225600.0,
        "team_role": "owner",
        "request": {"headers": {}},
        "channel_registry": {"x": 1},
        "user_id": "u-1",
        "team_id": "t-1",
        "is_admin": False,
        "not_vocabulary": "dropped",
        "attachments": [{"type": "image", "url": "https://example.com/a.png", "filename": "a.png"}],
    }
    res = await Dispatcher(services).dispatch("bg_ctx", {}, origin)
    job = await _job(services, res.body["job_id"])
    ctx = services.box.unseal(job.context)
    fixed = {
        "raw_input",
        "attachments",
        "actor_name",
        "actor_emp_no",
        "actor_department",
        "actor_department_path",
        "actor_position",
        "actor_title",
        "actor_phone",
        "actor_email",
        "actor_tags",
        "actor_key",
        "channel",
        "triggered_at",
        "triggered_at_str",
        "actor_id",
        "actor_is_admin",
    }
    identity = {
        "role_id",
        "org_id",
        "chat_mode",
        "session_id",
        "is_admin",
        "user_id",
        "team_id",
        "abort_signal",
    }
    configs = {"skill_configs", "skill_args", "region", "api_token"}
    assert set(ctx) == fixed | identity | configs
    assert ctx["chat_mode"] is True and ctx["abort_signal"] is None
    assert ctx["user_id"] == "" and ctx["team_id"] == ""
    assert ctx["role_id"] == "r1" and ctx["org_id"] == "o1" and ctx["session_id"] == "s-tg"
    assert ctx["is_admin"] is False
    assert ctx["actor_name"] == "Li Lei" and ctx["actor_key"] == "tg-4242"
    assert ctx["actor_department"] == "" and ctx["actor_tags"] == ["vip"]
    assert ctx["triggered_at"] == 1767225600.0 and ctx["triggered_at_str"] == "2026-01-01 00:00"
    assert ctx["attachments"] == [
        {
            "type": "image",
            "att_type": "image",
            "filename": "a.png",
            "local_path": "",
            "url": "https://example.com/a.png",
        }
    ]
    # configs prefetched and flattened four ways
    assert ctx["skill_configs"]["bg_ctx"] == {"region": "cn-north", "api_token": "tok-123"}
    assert ctx["skill_configs"]["region"] == "cn-north"
    assert ctx["skill_args"] == {"region": "cn-north", "api_token": "tok-123"}
    assert ctx["region"] == "cn-north" and ctx["api_token"] == "tok-123"
    for absent in ("team_role", "request", "channel_registry", "db", "not_vocabulary"):
        assert absent not in ctx


@pytest.mark.slow
async def test_admin_proxy_fill_in_background_context(services):
    origin = {
        **TG,
        "actor_is_admin": True,
        "actor_name": "Admin",
        "actor_phone": "1",
        "actor_email": "a@x",
        "actor_title": "T",
        "actor_tags": ["x"],
        "actor_id": "9",
        "actor_emp_no": "E",
    }
    res = await Dispatcher(services).dispatch(
        "bg_ctx", {}, {**origin, "channel": "web"}, "orgdeleg:z"
    )
    ctx = services.box.unseal((await _job(services, res.body["job_id"])).context)
    assert (
        ctx["actor_name"] == "Admin" and ctx["actor_phone"] == "1" and ctx["actor_email"] == "a@x"
    )
    for cleared in ("actor_title", "actor_key", "actor_id", "actor_emp_no", "actor_department"):
        assert ctx[cleared] == ""
    assert ctx["actor_tags"] == []


@pytest.mark.slow
async def test_no_secret_in_plaintext_in_redis_or_rows(services):
    secret = "sk-live-9f8e7d6c5b4a-do-not-leak"
    await ConfigStore(services.sessionmaker, services.box).set("r1", "bg_ctx", "api_key", secret)
    res = await Dispatcher(services).dispatch("bg_ctx", {"note": "x", "password": secret}, TG)
    assert res.status_code == 202
    # every Redis key this deployment and arq wrote (arq's own keys are not prefixed)
    # (read in two pipelined rounds: the server is shared, arq:* can be thousands of keys)
    blobs: list[bytes] = []
    r = services.redis
    keys = [k async for k in r.scan_iter(count=1000, match=f"{services.settings.redis_prefix}*")]
    keys += [k async for k in r.scan_iter(count=1000, match="arq:*")]
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = [k.decode() for k in await pipe.execute()]
    pipe = r.pipeline(transaction=False)
    for key, kind in zip(keys, kinds, strict=True):
        if kind == "string":
            pipe.get(key)
        elif kind == "zset":
            pipe.zrange(key, 0, -1)
        elif kind == "hash":
            pipe.hvals(key)
        elif kind == "list":
            pipe.lrange(key, 0, -1)
    for value in await pipe.execute():
        if isinstance(value, list):
            blobs.extend(value)
        else:
            blobs.append(value or b"")
    assert blobs
    assert all(secret.encode() not in b for b in blobs)
    # every job-related row, as the database returns it
    async with services.sessionmaker() as s:
        for table in ("jobs", "job_attempts", "skill_configs", "chat_sessions"):
            rows = (await s.execute(text(f"SELECT * FROM {table}"))).all()
            for row in rows:
                assert secret not in json.dumps([str(v) for v in row])
    # ... yet the job runs with it
    job = await _job(services, res.body["job_id"])
    assert services.box.unseal(job.context)["api_key"] == secret
    assert services.box.unseal(job.input)["password"] == secret


@pytest.mark.slow
async def test_enqueue_failure_is_never_a_receipt(job_settings, tmp_path):
    """Redis down at dispatch: the caller gets a transient error, never a receipt, and the
    refusal writes no job (a refusal is not a failure)."""
    from jobs.cli.embedded import EmbeddedRedis
    from jobs.services import Services

    server = EmbeddedRedis(tmp_path / "doomed-redis", persist=False)
    job_settings.redis_url = server.start()
    svc = await Services.open(job_settings)
    try:
        server.stop()
        res = await Dispatcher(svc).dispatch("bg_sleep", {}, TG)
        assert res.status_code == 503 and res.body["error_type"] == "transient"
        assert "try again" in res.body["error"]
        assert "job_id" not in res.body
        async with svc.sessionmaker() as s:
            assert (await s.execute(text("SELECT count(*) FROM jobs"))).scalar_one() == 0
            assert (await s.execute(text("SELECT count(*) FROM dispatch_keys"))).scalar_one() == 0
    finally:
        server.stop()
        await svc.close()


@pytest.mark.slow
async def test_concurrent_dispatches_from_one_new_session(services):
    """Many jobs at once from a session nobody has seen yet: all recorded, one session row."""
    import asyncio

    ctx = {"channel": "web", "session_id": "burst-session", "role_id": "r1"}
    results = await asyncio.gather(
        *(Dispatcher(services).dispatch("bg_sleep", {}, ctx, "orgdeleg:burst") for _ in range(20))
    )
    assert [r.status_code for r in results] == [202] * 20
    async with services.sessionmaker() as s:
        assert len((await s.scalars(select(ChatSession))).all()) == 1
        assert len((await s.scalars(select(Job))).all()) == 20


@pytest.mark.parametrize(("inp", "ctx"), [([1, 2], {}), ("text", {}), ({}, ["channel"])])
@pytest.mark.slow
async def test_input_and_context_must_be_objects(services, inp, ctx):
    res = await Dispatcher(services).dispatch("sync_echo", inp, ctx)
    assert res.status_code == 400 and "must be JSON objects" in res.body["error"]
