"""A job failed because its runs were lost (``jobs.queue.lost``): the person is told in one
short line through the normal delivery path, once, and only while the job is still that
failure — on PostgreSQL and SQLite, delivered to the fake Telegram server."""

from __future__ import annotations

import time

import pytest
from pydantic import SecretStr
from sqlalchemy import update

from delivery.pipeline import postprocess
from jobs.models import Job
from jobs.queue import lost, store
from jobs.services import Services
from tests.helpers.jobs import TG, dispatch


async def _lose_three_runs(svc: Services, job_id: str) -> list[str]:
    """Three runs whose worker died (their leases ran out); the ids failed as lost."""
    token = 0
    failed: list[str] = []
    for n in range(1, 4):
        claim = await store.claim(svc.sessionmaker, job_id, token, f"worker-{n}", 30)
        assert claim is not None and claim.attempt == n
        async with svc.sessionmaker() as s:
            await s.execute(
                update(Job).where(Job.id == job_id).values(lease_expires_at=time.time() - 1)
            )
            await s.commit()
        requeued = await store.expire_leases(svc.sessionmaker, failed=failed)
        token = requeued[0][1] if requeued else token
    return failed


@pytest.mark.slow
async def test_the_person_is_told_once_in_one_short_line(job_settings, tg) -> None:
    job_settings.telegram_bot_token = SecretStr(tg.token)
    job_settings.telegram_api_base = tg.url
    svc = await Services.open(job_settings)
    try:
        job_id = await dispatch(svc, "bg_sleep", {"seconds": 0}, {**TG, "actor_key": "1001"})
        assert await _lose_three_runs(svc, job_id) == [job_id]
        await lost.tell(svc, job_id, postprocess)
        await lost.tell(svc, job_id, postprocess)  # a second teller sends nothing more (the ledger)
        said = [(m["chat_id"], m.get("text")) for m in tg.sent]
        assert said == [
            (
                "1001",
                "Sorry, bg_sleep could not finish: it was stopped every time it ran "
                "(the worker running it died or stalled).",
            )
        ]
    finally:
        await svc.close()


@pytest.mark.slow
async def test_a_job_retried_meanwhile_is_not_reported_lost(job_settings, tg) -> None:
    job_settings.telegram_bot_token = SecretStr(tg.token)
    job_settings.telegram_api_base = tg.url
    svc = await Services.open(job_settings)
    try:
        job_id = await dispatch(svc, "bg_sleep", {"seconds": 0}, {**TG, "actor_key": "1001"})
        assert await _lose_three_runs(svc, job_id) == [job_id]
        assert await store.reopen(svc.sessionmaker, job_id) is not None  # an operator's retry
        await lost.tell(svc, job_id, postprocess)
        assert tg.sent == []
    finally:
        await svc.close()
