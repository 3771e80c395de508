"""Refusals at dispatch write nothing: an input too large to store is a 413 (never run on a
summary), and a dispatch refused because Redis is down is a 503 that leaves no failed job."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select

from dashboard.app import create_app
from jobs import storable
from jobs.models import Job
from jobs.services import Services
from tests.helpers.jobs import TG
from tests.helpers.settings import ADMIN_AUTH

pytestmark = pytest.mark.integration


async def _jobs(services: Services) -> list[Job]:
    async with services.sessionmaker() as s:
        return list((await s.scalars(select(Job))).all())


def _client(services: Services) -> httpx.AsyncClient:
    app = create_app(services.settings, services=services)
    # (the app's answer to an unexpected error is what is tested, not the error itself)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=ADMIN_AUTH)


@pytest.mark.slow
async def test_input_over_the_storable_limit_is_a_413(services: Services) -> None:
    services.settings.max_request_mb = 8
    over = {"seconds": 0, "blob": "a" * (storable.JSON_CAP + 10)}
    under = {"seconds": 0, "blob": "b" * (storable.JSON_CAP - 1000)}
    async with _client(services) as c:
        refused = await c.post(
            "/api/v1/dispatch", json={"skill": "bg_sleep", "input": over, "context": TG}
        )
        assert refused.status_code == 413, refused.text
        body = refused.json()
        assert body["ok"] is False and body["field"] == "input"
        assert "too large" in body["error"] and f"{storable.JSON_CAP:,}" in body["error"]
        assert await _jobs(services) == []  # nothing recorded, nothing to run on a summary
        taken = await c.post(
            "/api/v1/dispatch", json={"skill": "bg_sleep", "input": under, "context": TG}
        )
        assert taken.status_code == 202, taken.text
    (job,) = await _jobs(services)
    # stored whole: the skill runs on exactly what was sent
    assert services.box.unseal(job.input) == under


@pytest.mark.slow
async def test_redis_down_refusal_writes_no_job(job_settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A private Redis, stopped: every dispatch is a 503, none leaves a job (failed or not),
    and the failure counts stay at 0; once it is back the same dispatch is a 202."""
    from jobs.cli.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path / "private-redis", persist=False)
    job_settings.redis_url = server.start()
    svc = await Services.open(job_settings)
    try:
        server.stop()
        async with _client(svc) as c:
            for n in range(3):
                res = await c.post(
                    "/api/v1/dispatch",
                    json={"skill": "bg_sleep", "input": {"n": n}, "context": TG},
                    headers={"Idempotency-Key": f"down-{n}"},
                )
                assert res.status_code == 503, res.text
                assert res.json()["error_type"] == "transient" and "job_id" not in res.json()
        assert await _jobs(svc) == []
        async with svc.sessionmaker() as s:
            failed = await s.scalar(
                select(func.count()).select_from(Job).where(Job.status == "failed")
            )
        assert failed == 0
    finally:
        server.stop()
        await svc.close()


async def test_database_away_is_a_503_not_a_500(services: Services) -> None:
    """The database unreachable mid-request (a restart): 503 ``transient``, try again —
    nothing was written, so nothing failed."""
    from jobs.cli.embedded import free_port
    from jobs.db import create_engine, create_sessionmaker

    away = create_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/gone")
    kept = services.sessionmaker
    services.sessionmaker = create_sessionmaker(away)
    try:
        async with _client(services) as c:
            res = await c.post(
                "/api/v1/dispatch", json={"skill": "bg_sleep", "input": {}, "context": TG}
            )
        assert res.status_code == 503, res.text
        assert res.json()["error_type"] == "transient" and "try again" in res.json()["error"]
    finally:
        services.sessionmaker = kept
        await away.dispose()
