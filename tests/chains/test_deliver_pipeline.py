"""Chains deliver through the same pipeline as jobs: the final step's ``filename`` becomes a
file, its ``mediaUrl`` is downloaded under the outbound policy, each file is its own ledger
item (with custody and a receipt), the run records its artifacts and deliveries, and with
``deliver: {each_step: true}`` an earlier step's files arrive as that step ends. Files an
earlier run left in the workspace are not backfilled."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from chains import schedules
from chains.runner import run_chain
from chains.schedules import validate
from dashboard.app import create_app
from jobs.execution.executor import Executor
from jobs.models import ChainRun, Delivery
from tests.fakes.sink import FakeFiles
from tests.helpers.chains import chain_workspace, close_services, make_services, write_skill
from tests.helpers.net import PNG
from tests.helpers.settings import ADMIN_AUTH, make_settings

CHART = """
import pathlib
def execute(input_data, ctx):
    ws = pathlib.Path(ctx["workspace_dir"])
    (ws / "chart.png").write_bytes(bytes.fromhex(input_data["png"]))
    return {"message": "chart ready", "images": ["chart.png"], "rows": 3}
"""

REPORT = """
import pathlib
def execute(input_data, ctx):
    ws = pathlib.Path(ctx["workspace_dir"])
    (ws / "report.csv").write_text("day,orders\\n2026-01-05,42\\n")
    return {"message": "Orders report", "filename": "report.csv", "mediaUrl": input_data["url"]}
"""


async def _run(svc: Any, ex: Executor, spec: dict[str, Any]) -> str:
    row = await schedules.create(svc, validate(spec, svc.registry))
    async with svc.sessionmaker() as s:
        run = ChainRun(
            schedule_id=row.id, fire_key=f"manual:{row.id}", fire_at=1.0, status="queued"
        )
        s.add(run)
        await s.commit()
        run_id = run.id
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "succeeded"
    return str(run_id)


@pytest.mark.slow
async def test_chain_goes_through_the_pipeline(
    tmp_path: Path, sqlite_url: str, redis: Any, redis_server_url: str, redis_prefix: str, tg: Any
) -> None:
    skills = tmp_path / "skills"
    write_skill(skills, "make_chart", CHART)
    write_skill(skills, "orders_report", REPORT)
    with FakeFiles() as cdn:
        cdn.files["/logo.png"] = (PNG, "image/png")
        settings = make_settings(
            tmp_path,
            redis_url=redis_server_url,
            prefix=redis_prefix,
            database_url=sqlite_url,
            telegram_bot_token=tg.token,
            telegram_api_base=tg.url,
            fetch_allow_hosts=f"127.0.0.1:{cdn.port}",
        )
        svc = make_services(settings, redis, extra_skills=skills)
        ws = chain_workspace(settings)
        ws.mkdir(parents=True, exist_ok=True)
        (ws / "old.txt").write_text("from an earlier run: never backfilled\n")
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
                "steps": [
                    {"id": "chart", "skill": "make_chart", "input": {"png": PNG.hex()}},
                    {"skill": "orders_report", "input": {"url": cdn.url + "/logo.png"}},
                ],
                "deliver": {"to": "telegram:1001", "each_step": True},
            }
            run_id = await _run(svc, ex, spec)
            run = await schedules.get_run(svc, run_id)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_app(settings, services=svc)),
                base_url="http://127.0.0.1",
                headers=ADMIN_AUTH,
            ) as client:
                page = (await client.get(f"/api/v1/chain-runs/{run_id}")).json()
            async with svc.sessionmaker() as s:
                rows = (
                    await s.scalars(
                        select(Delivery)
                        .where(Delivery.chain_run_id == run_id)
                        .order_by(Delivery.id)
                    )
                ).all()
        finally:
            await ex.aclose()
            await close_services(svc)
    sent = [(m["method"], m.get("filename"), m.get("caption")) for m in tg.sent]
    # step 1's chart as that step ended, captioned with the step
    assert sent[0][:2] == ("sendPhoto", "chart.png")
    assert "step 1 (make_chart)" in (sent[0][2] or "")
    # the final step: the CSV named by filename, the downloaded mediaUrl, the text as caption
    final = sent[1:]
    assert ("sendDocument", "report.csv") in [m[:2] for m in final]
    assert ("sendPhoto", "logo.png") in [m[:2] for m in final]
    assert [m[2] for m in final].count("Orders report") == 1
    assert all(m[1] != "old.txt" for m in sent)  # nothing from before this run
    assert len(sent) == 3
    # each file is its own ledger row, sent, with Telegram's message id, under the run
    assert [r.status for r in rows] == ["sent"] * 3
    assert all(r.message_id and r.verified for r in rows)
    assert {r.kind for r in rows} == {"image", "file"}
    result = run["result"]  # type: ignore[index]
    assert {a["filename"] for a in result["artifacts"]} == {"chart.png", "report.csv", "logo.png"}
    assert [f["status"] for f in result["fetches"]] == ["downloaded"]
    assert [d["status"] for d in result["deliveries"]] == ["sent"] * 3
    assert result["delivery"]["status"] == "sent"
    # the chain run's page data shows them like a job's detail does
    assert {a["filename"] for a in page["artifacts"]} == {"chart.png", "report.csv", "logo.png"}
    assert [(d["status"], d["resendable"]) for d in page["deliveries"]] == [("sent", True)] * 3
    assert page["deliveries"][0]["id"] == rows[0].id


@pytest.mark.slow
async def test_a_chain_creates_the_web_session_it_delivers_to(
    tmp_path: Path, sqlite_url: str, redis: Any, redis_server_url: str, redis_prefix: str
) -> None:
    """No dispatch ever created ``s-new``: the chain creates it for the schedule's identity
    and its outcome is stored there — never a run that says it delivered nothing."""
    from delivery.channels.web import list_messages
    from jobs.models import ChatSession

    skills = tmp_path / "skills"
    write_skill(skills, "make_chart", CHART)
    settings = make_settings(
        tmp_path, redis_url=redis_server_url, prefix=redis_prefix, database_url=sqlite_url
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
            "name": f"charts{time.time_ns()}",
            "cron": "0 9 * * *",
            "timezone": "UTC",
            "identity": {"role_id": "r1", "org_id": "o1"},
            "steps": [{"skill": "make_chart", "input": {"png": PNG.hex()}}],
            "deliver": {"session_id": "s-new"},
        }
        run_id = await _run(svc, ex, spec)
        run = await schedules.get_run(svc, run_id)
        messages = await list_messages(svc.sessionmaker, "s-new")
        async with svc.sessionmaker() as s:
            made = await s.get(ChatSession, "s-new")
    finally:
        await ex.aclose()
        await close_services(svc)
    assert made is not None and (made.role_id, made.org_id) == ("r1", "o1")
    assert [m["text"] for m in messages] == ["chart ready"]
    assert run["result"]["delivery"]["status"] == "sent"  # type: ignore[index]
