"""Retention on SQLite and PostgreSQL: what is old goes, what an operator may still need stays."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from jobs.cli.app import app
from jobs.models import (
    Artifact,
    ChainRun,
    ChainStep,
    ChatSession,
    Delivery,
    Job,
    JobAttempt,
    OpsAction,
    Schedule,
    SessionMessage,
)
from jobs.queue.prune import prune, pruned_totals

DAY = 86400.0
NOW = time.time()


def _job(job_id: str, status: str, finished_days_ago: float | None, created_days_ago: float) -> Job:
    created = NOW - created_days_ago * DAY
    return Job(
        id=job_id,
        skill="demo",
        status=status,
        channel="telegram",
        role_id="r1",
        actor_key="1001",
        created_at=created,
        queued_at=created,
        finished_at=None if finished_days_ago is None else NOW - finished_days_ago * DAY,
    )


async def _seed(services, workspace: Path) -> None:  # type: ignore[no-untyped-def]
    kept_file = workspace / "kept.csv"
    kept_file.write_text("a,b\n")
    async with services.sessionmaker() as s:
        s.add_all(
            [
                _job("old-done", "succeeded", 40, 41),
                _job("old-held", "failed", 40, 41),
                _job("old-running", "running", None, 41),
                _job("old-queued", "queued", None, 41),
                _job("young-done", "succeeded", 2, 2),
            ]
        )
        await s.flush()
        s.add_all(
            [
                JobAttempt(
                    job_id="old-done", number=1, outcome="succeeded", started_at=NOW - 41 * DAY
                ),
                Artifact(
                    job_id="old-done", filename="gone.png", local_path=str(workspace / "gone.png")
                ),
                Artifact(job_id="young-done", filename="kept.csv", local_path=str(kept_file)),
                Delivery(
                    job_id="old-done",
                    ledger_key="k-old-done",
                    recipient="telegram:1001",
                    channel="telegram",
                    kind="text",
                    status="sent",
                    created_at=NOW - 40 * DAY,
                ),
                # an operator may still resend this one: its job stays
                Delivery(
                    job_id="old-held",
                    ledger_key="k-old-held",
                    recipient="telegram:1001",
                    channel="telegram",
                    kind="text",
                    status="unknown",
                    created_at=NOW - 5 * DAY,
                ),
                Schedule(id="sch1", name=f"daily-{NOW}", cron="0 9 * * *", timezone="UTC"),
            ]
        )
        await s.flush()
        s.add_all(
            [
                ChainRun(
                    id="run-old",
                    schedule_id="sch1",
                    fire_key="cron:sch1:1",
                    fire_at=NOW - 40 * DAY,
                    status="succeeded",
                    finished_at=NOW - 40 * DAY,
                ),
                ChainRun(
                    id="run-live",
                    schedule_id="sch1",
                    fire_key="cron:sch1:2",
                    fire_at=NOW,
                    status="running",
                ),
                ChatSession(session_id="sess1", role_id="r1"),
            ]
        )
        await s.flush()
        s.add_all(
            [
                ChainStep(run_id="run-old", idx=0, step_id="a", skill="echo", status="succeeded"),
                SessionMessage(session_id="sess1", text="old", created_at=NOW - 100 * DAY),
                SessionMessage(session_id="sess1", text="new", created_at=NOW - 1 * DAY),
            ]
        )
        await s.commit()


async def _ids(services, model) -> list[str]:  # type: ignore[no-untyped-def]
    async with services.sessionmaker() as s:
        return sorted(str(x) for x in (await s.scalars(select(model.id))).all())


@pytest.mark.slow
async def test_retention_keeps_what_may_still_matter(services, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    workspace = services.settings.resolved_workspace_root / "r1" / "x"
    workspace.mkdir(parents=True)
    await _seed(services, workspace)
    old_file, new_file = workspace / "old.txt", workspace / "new.txt"
    old_file.write_text("old")
    new_file.write_text("new")
    os.utime(old_file, (NOW - 50 * DAY, NOW - 50 * DAY))
    kept = workspace / "kept.csv"
    os.utime(kept, (NOW - 50 * DAY, NOW - 50 * DAY))  # old, but a kept job lists it
    settings = services.settings.model_copy(
        update={"message_retention_days": 30.0, "workspace_retention_days": 30.0}
    )

    dry = await prune(services.sessionmaker, settings, dry_run=True, now=NOW)
    assert dry is not None and (dry.jobs, dry.chain_runs, dry.messages, dry.files) == (1, 1, 1, 1)
    assert len(await _ids(services, Job)) == 5  # nothing deleted by a dry run
    assert old_file.exists()

    done = await prune(services.sessionmaker, settings, now=NOW, pause=0)
    assert done is not None and done.to_dict()["jobs"] == 1
    assert await _ids(services, Job) == ["old-held", "old-queued", "old-running", "young-done"]
    assert await _ids(services, ChainRun) == ["run-live"]
    async with services.sessionmaker() as s:
        assert await s.scalar(select(func.count()).select_from(JobAttempt)) == 0
        assert await s.scalar(select(func.count()).select_from(ChainStep)) == 0
        assert [a.filename for a in (await s.scalars(select(Artifact))).all()] == ["kept.csv"]
        assert [d.ledger_key for d in (await s.scalars(select(Delivery))).all()] == ["k-old-held"]
        assert [m.text for m in (await s.scalars(select(SessionMessage))).all()] == ["new"]
        audit = (await s.scalars(select(OpsAction).where(OpsAction.action == "prune"))).all()
    assert not old_file.exists() and new_file.exists() and kept.exists()
    assert pruned_totals([a.details for a in audit]) == {
        "jobs": 1,
        "chain_runs": 1,
        "messages": 1,
        "files": 1,
        "envs": 0,
    }
    again = await prune(services.sessionmaker, settings, now=NOW)
    assert again is not None and again.total() == 0


@pytest.mark.slow
async def test_messages_and_files_are_kept_unless_configured(services, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    workspace = services.settings.resolved_workspace_root / "r1" / "y"
    workspace.mkdir(parents=True)
    await _seed(services, workspace)
    old_file = workspace / "old.txt"
    old_file.write_text("old")
    os.utime(old_file, (NOW - 50 * DAY, NOW - 50 * DAY))
    done = await prune(services.sessionmaker, services.settings, now=NOW)
    assert done is not None and (done.messages, done.files) == (0, 0)
    assert old_file.exists()


def test_prune_command_reports_counts(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    out = runner.invoke(app, ["prune", "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "would delete: 0 jobs, 0 chain runs, 0 messages, 0 workspace files" in out.output
