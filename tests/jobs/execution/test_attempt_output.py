"""What each attempt printed: a plain-text script that logs its token, fails once and
succeeds on the operator's retry, through the real worker on SQLite and PostgreSQL. Each
attempt keeps the tails of its own stdout and stderr (capped, the secret scrubbed) and the
job's detail (API, CLI) shows them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from dashboard.app import create_app
from jobs.catalog.configs import ConfigStore
from jobs.models import JobAttempt
from jobs.queue import control, store
from jobs.services import Services
from tests.helpers.jobs import TG, dispatch, drain
from tests.helpers.settings import JOB_SKILLS, make_settings

TOKEN = "api-token-5b7e19c4d2"
API = "dash-token-attempt-output-1"
EXPORTER = """\
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    data = json.loads(os.environ.get("SKILL_INPUT") or "{}")
    runs = Path(os.environ["SKILL_WORKSPACE"]) / "runs"
    n = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(n))
    for i in range(int(data.get("rows", 10))):
        print(f"run {n}: exported row {i}")
    print(f"run {n}: logging in with {os.environ['API_TOKEN']}", file=sys.stderr)
    if n == 1:
        print("upstream said 503, giving up", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({"ok": True, "message": f"exported on run {n}"}))
"""


@pytest.fixture
async def svc(tmp_path: Path, database_url: str, redis_server_url: str, redis_prefix: str):  # type: ignore[no-untyped-def]
    folder = tmp_path / "skills" / "order_sync"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: order_sync\ndescription: exports orders, printing progress\n"
        "async: true\n---\n\n# order_sync\n"
    )
    (folder / "handler.py").write_text(EXPORTER)
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=os.pathsep.join([str(JOB_SKILLS), str(tmp_path / "skills")]),
        worker_lease_sec=3.0,
        api_token=API,
    )
    services = await Services.open(settings)
    await ConfigStore(services.sessionmaker, services.box).set(
        TG["role_id"], "order_sync", "API_TOKEN", TOKEN
    )
    yield services
    if services.redis is not None:
        keys = [k async for k in services.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await services.redis.delete(*keys)
    await services.close()


async def _attempts(svc: Services, job_id: str) -> list[JobAttempt]:
    async with svc.sessionmaker() as s:
        rows = await s.scalars(
            select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number)
        )
        return list(rows)


@pytest.mark.slow
async def test_each_attempt_keeps_its_own_output_tails(svc: Services, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    job_id = await dispatch(svc, "order_sync", {"rows": 3000})
    await drain(svc)
    assert (await store.get_job(svc.sessionmaker, job_id)).status == "failed"  # type: ignore[union-attr]
    assert (await control.retry_job(svc, job_id, actor="ops")).ok
    await drain(svc)
    job = await store.get_job(svc.sessionmaker, job_id)
    assert job is not None and job.status == "succeeded" and job.attempts == 2

    first, second = await _attempts(svc, job_id)
    assert first.outcome == "failed" and second.outcome == "succeeded"
    # each run's own lines, the end of them kept, the start cut and said so
    assert first.stdout_tail is not None and second.stdout_tail is not None
    assert "run 1: exported row 2999" in first.stdout_tail and "run 2" not in first.stdout_tail
    assert "run 1: exported row 0\n" not in first.stdout_tail
    assert first.stdout_tail.startswith("[… ") and "characters cut]" in first.stdout_tail
    assert len(first.stdout_tail) <= store.OUTPUT_TAIL_CHARS + 40
    assert '"exported on run 2"' in second.stdout_tail
    assert first.stderr_tail is not None and "upstream said 503" in first.stderr_tail
    assert second.stderr_tail is not None and "upstream" not in second.stderr_tail
    # the token the script printed is masked wherever the tails are kept
    for a in (first, second):
        assert TOKEN not in (a.stderr_tail or "") + (a.stdout_tail or "")
        assert "logging in with ••••••" in (a.stderr_tail or "")

    app = create_app(svc.settings, services=svc)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {API}"},
    ) as client:
        detail = (await client.get(f"/api/v1/jobs/{job_id}")).json()
    log = detail["attempt_log"]
    assert [a["number"] for a in log] == [1, 2]
    assert "upstream said 503" in log[0]["stderr_tail"] and TOKEN not in str(log)
    assert "run 2: exported row 2999" in log[1]["stdout_tail"]

    # skilljobs jobs show prints each attempt's tails
    from typer.testing import CliRunner

    from jobs.cli.app import app as cli

    s = svc.settings
    for key, value in {
        "SKILLJOBS_DATA_DIR": str(s.data_dir),
        "SKILLJOBS_DATABASE_URL": s.resolved_database_url,
        "SKILLJOBS_SKILLS_PATH": str(s.skills_path),
        "COLUMNS": "200",
    }.items():
        monkeypatch.setenv(key, value)
    res = await asyncio.to_thread(CliRunner().invoke, cli, ["jobs", "show", job_id])
    assert res.exit_code == 0, res.output
    assert "attempt 1 stderr (tail)" in res.output and "upstream said 503" in res.output
    assert "attempt 2 stdout (tail)" in res.output and TOKEN not in res.output


@pytest.mark.slow
async def test_a_quiet_run_writes_no_tails(svc: Services) -> None:
    job_id = await dispatch(svc, "bg_sleep", {"seconds": 0})
    await drain(svc)
    [attempt] = await _attempts(svc, job_id)
    assert attempt.outcome == "succeeded"
    assert attempt.stdout_tail is None and attempt.stderr_tail is None


def test_output_tail_caps_and_skips_blank_output() -> None:
    assert store.output_tail("") is None and store.output_tail("  \n") is None
    assert store.output_tail("one line\n") == "one line\n"
    long = "".join(f"line {i}\n" for i in range(5000))
    tail: Any = store.output_tail(long, cap=100)
    assert tail.endswith("line 4999\n") and tail.startswith("[… ")
    assert len(tail.split("\n", 1)[1]) == 100
    assert "\x00" not in (store.output_tail("nul \x00 byte") or "")  # fit for a text column
