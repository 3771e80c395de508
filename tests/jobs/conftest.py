"""Fixtures of tests/jobs that need the marketplace skill corpus (tests/market_skills), and
the ``network`` marker: tests that install from PyPI / npm are skipped, saying so, when the
registries cannot be reached — except in CI, where they must run."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from tests.helpers.keys import clear_keys
from tests.helpers.settings import IN_CI, make_settings

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
        await clear_keys(svc.redis, redis_prefix)
    await svc.close()


@pytest.fixture(scope="session")
def registries_reachable() -> str | None:
    """None when PyPI and the npm registry answer, else why not (proxies from the
    environment are honoured)."""
    for name, url in (
        ("PyPI", "https://pypi.org/simple/six/"),
        ("the npm registry", "https://registry.npmjs.org/is-number"),
    ):
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read(1)
        except OSError as exc:
            return f"{name} is not reachable ({exc})"
    return None


@pytest.fixture(autouse=True)
def _network_marker(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("network") is None or IN_CI:
        return
    why = request.getfixturevalue("registries_reachable")
    if why:
        pytest.skip(f"needs the package registries: {why}")
