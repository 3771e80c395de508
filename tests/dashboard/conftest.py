"""Fixtures of the dashboard tests: services with an API token, an in-process client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dashboard.app import create_app
from jobs.services import Services
from tests.helpers.dashboard import TOKEN, make_services


@pytest.fixture
async def services(
    database_url: str, tmp_path: Path, redis_server_url: str, redis_prefix: str, redis: Any
) -> AsyncIterator[Services]:
    svc = await make_services(
        tmp_path, database_url, redis_server_url, redis_prefix, redis, api_token=TOKEN
    )
    yield svc
    await svc.http.aclose()
    await svc.engine.dispose()


@pytest.fixture
async def client(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(services.settings, services=services)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
    ) as c:
        yield c
