"""``SKILLJOBS_DATABASE_READ_URL``: a real PostgreSQL streaming replica (``initdb`` +
``pg_basebackup -R`` under a temporary folder). With the replica's replay paused, a job
written on the primary is missing from the dashboard's list (served by the replica) and
present on its detail page (served by the primary); ``skilljobs doctor`` tells a replica
from a primary."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from dashboard.app import create_app
from jobs.cli.checks import Status, check_read_replica
from jobs.db import create_engine
from jobs.migrate import upgrade
from jobs.services import Services
from tests.helpers.dashboard import TOKEN, free_port, make_services, seed_job

BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
pytestmark = pytest.mark.skipif(
    not BINS or not shutil.which("runuser"), reason="needs PostgreSQL server binaries"
)


class Cluster:
    """One PostgreSQL server of its own (as ``postgres`` when we are root)."""

    def __init__(self, root: Path, name: str) -> None:
        self.data = root / name
        self.port = free_port()
        self.bin = Path(BINS[-1]).parent
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data.parent} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", f"{self.data}.log",
            "-o", opts, "-w", "start",
        )  # fmt: skip

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
             "-w", "stop"],
            capture_output=True, timeout=60,
        )  # fmt: skip

    def url(self, db: str) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{db}"


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[Cluster, Cluster]]:
    # Not under pytest's temporary folder: that one is private to us, and the servers run
    # as ``postgres``.
    root = Path(tempfile.mkdtemp(prefix="skilljobs-replica-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    primary, replica = Cluster(root, "primary"), Cluster(root, "replica")
    primary.run(str(primary.bin / "initdb"), "-D", str(primary.data), "-A", "trust", "-U",
                "postgres", "-N")  # fmt: skip
    primary.start()
    try:
        primary.run(
            str(primary.bin / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres", "-D", str(replica.data), "-R", "-X", "stream",
        )  # fmt: skip
        replica.start()
        try:
            yield primary, replica
        finally:
            replica.stop()
    finally:
        primary.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _scalar(url: str, sql: str) -> Any:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            value = (await conn.execute(text(sql))).scalar()
            await conn.commit()
            return value
    finally:
        await engine.dispose()


@pytest.fixture
async def replicated(
    clusters: tuple[Cluster, Cluster],
    tmp_path: Path,
    redis_server_url: str,
    redis_prefix: str,
    redis: Any,
) -> AsyncIterator[Services]:
    primary, replica = clusters
    db = f"r{time.time_ns()}"
    await _admin(primary.url("postgres"), f'CREATE DATABASE "{db}"')
    engine = create_engine(primary.url(db))
    await upgrade(engine)
    await engine.dispose()
    svc = await make_services(
        tmp_path,
        primary.url(db),
        redis_server_url,
        redis_prefix,
        redis,
        api_token=TOKEN,
        database_read_url=replica.url(db),
    )
    svc.open_read_replica()  # as Services.open does (the helper builds Services by hand)
    assert svc.read_engine is not None
    yield svc
    await _scalar(replica.url("postgres"), "SELECT pg_wal_replay_resume()")
    await svc.http.aclose()
    await svc.engine.dispose()
    if svc.read_engine is not None:
        await svc.read_engine.dispose()


async def _admin(url: str, sql: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


async def _until(predicate: Any, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not await predicate():
        assert time.monotonic() < deadline, "the replica did not catch up"
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_lists_read_the_replica_and_details_the_primary(replicated: Services) -> None:
    svc = replicated
    replica_url = svc.settings.resolved_database_read_url or ""
    app = create_app(svc.settings, services=svc)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
    ) as client:
        first = await seed_job(svc)

        async def listed() -> bool:
            resp = await client.get("/api/v1/jobs")
            return first.id in [j["id"] for j in resp.json()["items"]]

        await _until(listed)  # replicated

        await _scalar(replica_url, "SELECT pg_wal_replay_pause()")
        second = await seed_job(svc)
        await asyncio.sleep(0.5)  # would have been replayed by now, were replay running
        ids = [j["id"] for j in (await client.get("/api/v1/jobs")).json()["items"]]
        assert first.id in ids and second.id not in ids  # the list comes from the replica
        detail = await client.get(f"/api/v1/jobs/{second.id}")
        assert detail.status_code == 200, detail.text  # the detail from the primary
        assert detail.json()["id"] == second.id

        await _scalar(replica_url, "SELECT pg_wal_replay_resume()")

        async def both() -> bool:
            resp = await client.get("/api/v1/jobs")
            return second.id in [j["id"] for j in resp.json()["items"]]

        await _until(both)


@pytest.mark.slow
async def test_doctor_tells_a_replica_from_a_primary(replicated: Services) -> None:
    settings = replicated.settings
    check = await check_read_replica(settings)
    assert check is not None and check.status is Status.OK, check
    assert "is a replica" in check.detail
    wrong = settings.model_copy(update={"database_read_url": settings.database_url})
    check = await check_read_replica(wrong)
    assert check is not None and check.status is Status.WARN
    assert "not in recovery" in check.detail
    dead = settings.model_copy(
        update={"database_read_url": f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/x"}
    )
    check = await check_read_replica(dead, timeout_sec=3)
    assert check is not None and check.status is Status.FAIL
    assert "SKILLJOBS_DATABASE_READ_URL" in check.fix
    assert await check_read_replica(settings.model_copy(update={"database_read_url": None})) is None
