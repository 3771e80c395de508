"""Skill-initiated sends are ledgered: a job that calls send_message and then fails
transiently is re-run, and the recipient still gets the message once (both backends, a
real worker, Telegram at the fake server)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from jobs.models import Delivery
from jobs.services import Services
from tests.helpers.jobs import dispatch, drain, job_and_attempts
from tests.helpers.settings import make_settings

FAKE_SKILLS = Path(__file__).resolve().parents[1] / "fakes" / "skills"


@pytest.fixture
async def svc(
    tmp_path: Path,
    database_url: str,
    redis_server_url: str,
    redis_prefix: str,
    tg: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Services]:
    values: dict[str, Any] = {
        "database_url": database_url,
        "skills_path": os.pathsep.join([str(FAKE_SKILLS), "bundled"]),
        "telegram_bot_token": tg.token,
        "telegram_api_base": tg.url,
        "worker_lease_sec": 5.0,
        "retry_backoff_sec": 0.05,
    }
    settings = make_settings(tmp_path, redis_url=redis_server_url, prefix=redis_prefix, **values)
    for name in ("data_dir", "redis_url", "redis_prefix", "queue_name", "secret_key"):
        value = getattr(settings, name)
        value = value.get_secret_value() if hasattr(value, "get_secret_value") else value
        monkeypatch.setenv(f"SKILLJOBS_{name.upper()}", str(value))
    for name, value in values.items():
        monkeypatch.setenv(f"SKILLJOBS_{name.upper()}", str(value))
    services = await Services.open(settings)
    yield services
    if services.redis is not None:
        keys = [k async for k in services.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await services.redis.delete(*keys)
    await services.close()


@pytest.mark.slow
async def test_send_message_then_connection_error_twice_sends_once(svc, tg) -> None:
    ctx = {
        "channel": "telegram",
        "actor_key": "1001",
        "role_id": "r1",
        "org_id": "o1",
        "session_id": "s-flake",
    }
    job_id = await dispatch(
        svc, "send_then_flake", {"message": "invoice 7 sent", "to": "telegram:1002"}, ctx
    )
    for _ in range(4):
        await drain(svc)
        job, attempts = await job_and_attempts(svc, job_id)
        if job.status == "succeeded":
            break
    assert job.status == "succeeded", (job.status, job.error)
    assert len(attempts) == 3
    to_1002 = [m for m in tg.sent if str(m.get("chat_id")) == "1002"]
    assert [m["text"] for m in to_1002] == ["invoice 7 sent"]
    async with svc.sessionmaker() as s:
        rows = (
            await s.scalars(select(Delivery).where(Delivery.recipient == "telegram:1002"))
        ).all()
    assert [(r.status, r.job_id, r.verified) for r in rows] == [("sent", job_id, True)]


@pytest.mark.slow
async def test_a_parked_send_then_connection_error_twice_sends_once(svc, tg) -> None:
    """The chat has no token when the skill sends: the message is parked in the outbox and
    the skill goes on; its re-runs make the same call, find the parked (or by then sent)
    row under the same ledger key and send nothing more."""
    from delivery.channels.limits import Target
    from delivery.ratelimit import RateLimiter
    from jobs.sendscope import INLINE_BUDGET

    limiter = RateLimiter.from_settings(svc.redis, svc.settings)
    # the chat's bucket paused (as after a 429) for longer than a run waits for tokens in place
    await limiter.pause("telegram", Target("1002"), INLINE_BUDGET + 2)
    ctx = {
        "channel": "telegram",
        "actor_key": "1001",
        "role_id": "r1",
        "org_id": "o1",
        "session_id": "s-parked",
    }
    job_id = await dispatch(
        svc, "send_then_flake", {"message": "invoice 8 sent", "to": "telegram:1002"}, ctx
    )
    for _ in range(4):
        await drain(svc)
        job, attempts = await job_and_attempts(svc, job_id)
        if job.status == "succeeded":
            break
    assert job.status == "succeeded", (job.status, job.error)
    assert len(attempts) == 3
    answer = job.result["send_message"]
    assert answer["ok"] and not answer["failed"], answer
    to_1002 = [m for m in tg.sent if str(m.get("chat_id")) == "1002"]
    assert [m["text"] for m in to_1002] == ["invoice 8 sent"]
    async with svc.sessionmaker() as s:
        rows = (
            await s.scalars(select(Delivery).where(Delivery.recipient == "telegram:1002"))
        ).all()
    assert [(r.status, r.job_id, r.verified) for r in rows] == [("sent", job_id, True)]
    # it was parked, not waited for (counted for /metrics when it was)
    from jobs.constants import RATELIMIT_PARKED

    assert int(await svc.redis.hget(svc.settings.key(RATELIMIT_PARKED), "telegram") or 0) >= 1
