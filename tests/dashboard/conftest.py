"""Fixtures of the dashboard tests: services with an API token, an in-process client, and
where browser tests save their screenshots."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dashboard.app import create_app
from jobs.services import Services
from tests.helpers.dashboard import TOKEN, make_services
from tests.helpers.settings import ROOT


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


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where browser tests save screenshots: a temporary folder, so a test run never
    changes a tracked file. ``make screenshots`` points ``DASHBOARD_SCREENSHOT_DIR`` at
    ``docs/`` to refresh the images of the README on purpose."""
    chosen = os.environ.get("DASHBOARD_SCREENSHOT_DIR")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session", autouse=True)
def docs_untouched() -> Iterator[None]:
    """A test run leaves the tracked images of ``docs/`` as they were (unless
    ``make screenshots`` asked for them)."""
    docs = ROOT / "docs"

    def state() -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in docs.glob("*.png")}

    before = state()
    yield
    if os.environ.get("DASHBOARD_SCREENSHOT_DIR"):
        return
    changed = sorted(n for n, h in state().items() if before.get(n) != h)
    assert not changed, f"tests rewrote tracked files in docs/: {', '.join(changed)}"
