"""Fixtures of tests/jobs that need the marketplace skill corpus (tests/market_skills)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.settings import make_settings

MARKET = Path(__file__).resolve().parents[1] / "market_skills"


@pytest.fixture
async def market_services(  # type: ignore[no-untyped-def]
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str
):
    """Services (SQLite + Redis) loading the marketplace skill corpus."""
    from jobs.services import Services

    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=sqlite_url,
        skills_path=str(MARKET),
        retry_backoff_sec=0.05,
    )
    svc = await Services.open(settings)
    yield svc
    if svc.redis is not None:
        keys = [k async for k in svc.redis.scan_iter(match=f"{redis_prefix}*")]
        if keys:
            await svc.redis.delete(*keys)
    await svc.close()
