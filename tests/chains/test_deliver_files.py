"""A chain's final step that names its files (``{"filename": "report.csv"}``, ``images``)
delivers them, not only the text: a CSV and an image reach the fake Telegram."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chains import schedules
from chains.runner import run_chain
from chains.schedules import validate
from jobs.execution.executor import Executor
from jobs.models import ChainRun
from tests.helpers.chains import close_services, make_services, write_skill
from tests.helpers.settings import make_settings

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4

REPORT = """
import pathlib
def execute(input_data, ctx):
    ws = pathlib.Path(ctx["workspace_dir"])
    (ws / "report.csv").write_text("day,orders\\n2026-01-05,42\\n")
    (ws / "chart.png").write_bytes(bytes.fromhex(input_data["png"]))
    return {"message": "Orders report", "filename": "report.csv", "images": ["chart.png"]}
"""


@pytest.mark.slow
async def test_chain_final_files_are_delivered(
    tmp_path: Path, sqlite_url, redis, redis_server_url, redis_prefix, tg
) -> None:
    skills = tmp_path / "skills"
    write_skill(skills, "orders_report", REPORT)
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=sqlite_url,
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
    )
    svc = make_services(settings, redis, extra_skills=skills)
    ex = Executor(
        settings=svc.settings,
        registry=svc.registry,
        sessionmaker=svc.sessionmaker,
        box=svc.box,
        http=svc.http,
    )
    try:
        spec = {
            "name": f"orders{time.time_ns()}",
            "cron": "0 9 * * *",
            "timezone": "UTC",
            "identity": {"role_id": "r1", "org_id": "o1", "session_id": "s1"},
            "steps": [{"skill": "orders_report", "input": {"png": PNG.hex()}}],
            "deliver": {"to": "telegram:1001"},
        }
        row = await schedules.create(svc, validate(spec, svc.registry))
        async with svc.sessionmaker() as s:
            run = ChainRun(
                schedule_id=row.id, fire_key=f"manual:{row.id}", fire_at=1.0, status="queued"
            )
            s.add(run)
            await s.commit()
            run_id = run.id
        assert await run_chain(svc, ex, run_id, worker_id="w1") == "succeeded"
    finally:
        await ex.aclose()
        await close_services(svc)
    methods = [(m["method"], m.get("filename")) for m in tg.sent]
    assert ("sendDocument", "report.csv") in methods
    assert ("sendPhoto", "chart.png") in methods
    assert tg.sent[0].get("caption") == "Orders report"
