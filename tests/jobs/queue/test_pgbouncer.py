"""PostgreSQL behind a real PgBouncer in transaction mode: dispatch, a worker run, the record."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from jobs.cli.embedded import free_port
from jobs.db import behind_pgbouncer
from jobs.queue import store
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services
from tests.helpers.jobs import TG, drain
from tests.helpers.settings import IN_CI, JOB_SKILLS, make_settings

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def test_detection() -> None:
    assert behind_pgbouncer("postgresql+asyncpg://u@h:6432/db")
    assert behind_pgbouncer("postgresql+asyncpg://u@h:5432/db?pgbouncer=true")
    assert not behind_pgbouncer("postgresql+asyncpg://u@h:6432/db?pgbouncer=false")
    assert not behind_pgbouncer("postgresql+asyncpg://u@h:5432/db")
    assert not behind_pgbouncer("sqlite+aiosqlite:///x.db")


@pytest.fixture
def pgbouncer(pg_database_url: str) -> Iterator[str]:
    """A PgBouncer (transaction pooling) in front of the test database; its URL."""
    if not Path(PGBOUNCER).exists():
        if IN_CI:
            pytest.fail("pgbouncer is not installed (apt-get install pgbouncer)")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    target = make_url(pg_database_url)
    port = free_port()
    # its own folder under the temp root: pytest's folders are not open to another user
    folder = Path(tempfile.mkdtemp(prefix="skilljobs-pgbouncer-"))
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{target.database} = host={target.host} port={target.port or 5432} "
        f"dbname={target.database} user={target.username}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
        "auth_type = any\npool_mode = transaction\n"
        "max_client_conn = 200\ndefault_pool_size = 5\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
        f"unix_socket_dir = {folder}\n"
    )
    cmd = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        shutil.chown(folder, "postgres")
        shutil.chown(ini, "postgres")
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.1)
    try:
        yield target.set(port=port).render_as_string(hide_password=False)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


async def test_dispatch_and_run_through_pgbouncer(
    pgbouncer: str, tmp_path: Path, redis_server_url: str, redis_prefix: str
) -> None:
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=pgbouncer,
        database_pgbouncer=True,
        skills_path=str(JOB_SKILLS),
    )
    assert "pgbouncer=true" in settings.resolved_database_url
    svc = await Services.open(settings)
    try:
        ids = []
        for i in range(5):
            res = await Dispatcher(svc).dispatch("bg_sleep", {"seconds": 0.01 * i}, TG)
            assert res.status_code == 202, res.body
            ids.append(res.body["job_id"])
        await drain(svc)
        for job_id in ids:
            job = await store.get_job(svc.sessionmaker, job_id)
            assert job is not None and job.status == "succeeded", (job_id, job and job.error)
    finally:
        await svc.close()
