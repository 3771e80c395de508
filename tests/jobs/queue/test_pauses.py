"""Pause per skill: a paused skill's jobs stay queued while the others run, resume puts
them back in order; both audited (jobs.queue.pauses, the claim script in the broker)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from delivery import notices
from jobs.cli.app import app
from jobs.models import OpsAction
from jobs.queue import pauses, store
from tests.helpers.jobs import dispatch, drain

pytestmark = pytest.mark.integration


async def _status(services, job_id: str) -> str:
    return (await store.get_job(services.sessionmaker, job_id)).status


@pytest.mark.slow
async def test_paused_skill_waits_while_others_run(services):
    done = await pauses.pause(services, "bg_sleep", actor="ops")
    assert done == {"skill": "bg_sleep", "paused": True, "changed": True}
    assert await pauses.paused_skills(services) == {"bg_sleep"}
    held = [await dispatch(services, "bg_sleep", {"seconds": 0}) for _ in range(3)]
    other = await dispatch(services, "bg_ctx")
    await drain(services)
    assert await _status(services, other) == "succeeded"
    assert [await _status(services, j) for j in held] == ["queued"] * 3
    await drain(services)  # a second pass still takes none of them
    assert [await _status(services, j) for j in held] == ["queued"] * 3

    resumed = await pauses.resume(services, "bg_sleep", actor="ops")
    assert resumed["paused"] is False and resumed["requeued"] == 3
    await drain(services)
    assert [await _status(services, j) for j in held] == ["succeeded"] * 3
    async with services.sessionmaker() as s:
        rows = (await s.scalars(select(OpsAction).order_by(OpsAction.id))).all()
    assert [(r.action, r.target, r.actor) for r in rows] == [
        ("skill.pause", "bg_sleep", "ops"),
        ("skill.resume", "bg_sleep", "ops"),
    ]


@pytest.mark.slow
async def test_unknown_skill_is_refused(services):
    with pytest.raises(LookupError, match="no skill 'nope'"):
        await pauses.pause(services, "nope")


@pytest.mark.slow
async def test_cancel_of_a_parked_job_and_resume_of_the_rest(services):
    from jobs.queue import control

    await pauses.pause(services, "bg_sleep")
    a = await dispatch(services, "bg_sleep", {"seconds": 0})
    b = await dispatch(services, "bg_sleep", {"seconds": 0})
    await drain(services)  # parks both
    res = await control.cancel_job(services, a, notices=notices, actor="ops")
    assert res.ok, res.message
    assert (await pauses.resume(services, "bg_sleep"))["requeued"] == 1
    await drain(services)
    assert await _status(services, a) == "cancelled"
    assert await _status(services, b) == "succeeded"


@pytest.mark.slow
def test_cli_pause_and_resume(tmp_path, monkeypatch, redis_server_url, redis_prefix, sqlite_url):
    from tests.helpers.settings import JOB_SKILLS

    for k, v in {
        "SKILLJOBS_DATA_DIR": str(tmp_path / "data"),
        "SKILLJOBS_DATABASE_URL": sqlite_url,
        "SKILLJOBS_REDIS_URL": redis_server_url,
        "SKILLJOBS_REDIS_PREFIX": redis_prefix,
        "SKILLJOBS_QUEUE_NAME": f"{redis_prefix}:queue",
        "SKILLJOBS_SKILLS_PATH": str(JOB_SKILLS),
    }.items():
        monkeypatch.setenv(k, v)
    runner = CliRunner()
    res = runner.invoke(app, ["skills", "pause", "bg_sleep"])
    assert res.exit_code == 0, res.output
    assert "paused" in res.output
    job = runner.invoke(
        app,
        ["dispatch", "bg_sleep", "-i", '{"seconds": 0}', "-c", "telegram", "--actor-key", "t1"],
    )
    job_id = json.loads(job.output)["job_id"]
    listed = runner.invoke(app, ["jobs", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert "skill bg_sleep is paused" in runner.invoke(app, ["jobs", "show", job_id]).output
    shown = runner.invoke(app, ["jobs", "show", job_id, "--json"])
    assert json.loads(shown.output)["paused"] is True
    piped = runner.invoke(app, ["jobs", "list"])
    assert "queued (paused)" in piped.output
    skills = json.loads(runner.invoke(app, ["skills", "list", "--json"]).output)["items"]
    assert {s["name"]: s["paused"] for s in skills}["bg_sleep"] is True
    res = runner.invoke(app, ["skills", "resume", "bg_sleep"])
    assert res.exit_code == 0 and "resumed" in res.output, res.output
    res = runner.invoke(app, ["skills", "pause", "no_such_skill"])
    assert res.exit_code == 1 and "no skill 'no_such_skill'" in res.output
