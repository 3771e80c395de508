"""Re-run from a step: the API, the CLI and the runner reuse the recorded earlier outputs."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from chains import schedules
from chains.rerun import RerunError, rerun_from
from chains.runner import run_chain
from dashboard.app import create_app
from jobs.execution.executor import Executor
from tests.helpers.chains import FAIL, close_services, make_services, write_skill
from tests.helpers.settings import ADMIN_AUTH, make_settings

TOKEN_SKILL = """
import uuid
def execute(input_data, ctx):
    return {"value": uuid.uuid4().hex}
"""

SPEC = {
    "name": "tokens",
    "cron": "0 9 * * *",
    "timezone": "UTC",
    "identity": {"role_id": "r1"},
    "steps": [
        {"id": "first", "skill": "make_token"},
        {"id": "second", "skill": "echo", "input": {"message": "$steps.first.value"}},
        {"id": "third", "skill": "echo", "input": {"message": "$steps.second.message"}},
    ],
}


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "testskills"
    write_skill(root, "make_token", TOKEN_SKILL)
    write_skill(root, "fail_step", FAIL)
    return root


@pytest.fixture
async def env(tmp_path, database_url, redis, redis_server_url, redis_prefix, skills_dir):  # type: ignore[no-untyped-def]
    settings = make_settings(
        tmp_path, redis_url=redis_server_url, prefix=redis_prefix, database_url=database_url
    )
    svc = make_services(settings, redis, extra_skills=skills_dir)
    ex = Executor(
        settings=svc.settings,
        registry=svc.registry,
        sessionmaker=svc.sessionmaker,
        box=svc.box,
        http=svc.http,
    )
    yield svc, ex
    await ex.aclose()
    await close_services(svc)


async def _first_run(svc, ex) -> str:  # type: ignore[no-untyped-def]
    row = await schedules.create(svc, SPEC)
    run_id = await schedules.trigger_manual(svc, row.id, enqueue=False)
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "succeeded"
    return run_id


@pytest.mark.slow
async def test_rerun_from_step_2_reuses_step_1s_recorded_output(env) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    source = await _first_run(svc, ex)
    before = await schedules.get_run(svc, source)
    token = before["steps"][0]["output"]["value"]  # type: ignore[index]

    app = create_app(svc.settings, services=svc)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers=ADMIN_AUTH,
    ) as client:
        res = await client.post(f"/api/v1/chain-runs/{source}/rerun", json={"from_step": 1})
        assert res.status_code == 202, res.text
        body = res.json()
        assert body["rerun_of"] == source and body["from_step"] == 1
        new_id = body["run_id"]
        assert await run_chain(svc, ex, new_id, worker_id="w2") == "succeeded"
        run = (await client.get(f"/api/v1/chain-runs/{new_id}")).json()
        # step 1 was not run again: its record and output are the source's
        assert run["steps"][0]["output"]["value"] == token
        assert run["steps"][0]["started_at"] == before["steps"][0]["started_at"]  # type: ignore[index]
        assert run["steps"][1]["output"]["message"] == token
        assert run["trigger"] == "rerun"
        stored = await schedules.get_run(svc, new_id)
        assert stored["fire_key"].startswith(f"rerun:{source}:")  # type: ignore[index]
        assert run["fire_at"] == before["fire_at"]  # type: ignore[index]

        # by step id; an unknown step and an unknown run are refused
        res = await client.post(f"/api/v1/chain-runs/{source}/rerun", json={"from_step": "third"})
        assert res.status_code == 202 and res.json()["from_step"] == 2
        res = await client.post(f"/api/v1/chain-runs/{source}/rerun", json={"from_step": 7})
        assert res.status_code == 422 and "out of range 0-2" in res.json()["error"]
        res = await client.post("/api/v1/chain-runs/nope/rerun", json={"from_step": 0})
        assert res.status_code == 404

    # from step 0 everything runs again: a new token
    again, _ = await rerun_from(svc, source, 0, enqueue=False)
    assert await run_chain(svc, ex, again, worker_id="w3") == "succeeded"
    fresh = await schedules.get_run(svc, again)
    assert fresh["steps"][0]["output"]["value"] != token  # type: ignore[index]


@pytest.mark.slow
async def test_rerun_past_a_step_without_output_is_refused(env) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    spec = {
        **SPEC,
        "name": "fails",
        "steps": [{"id": "a", "skill": "fail_step"}, *SPEC["steps"][1:2]],
    }
    spec["steps"][1] = {"id": "second", "skill": "echo", "input": {"message": "x"}}
    row = await schedules.create(svc, spec)
    run_id = await schedules.trigger_manual(svc, row.id, enqueue=False)
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "failed"
    with pytest.raises(RerunError, match=r"step 0 \(a\) of run .* is failed"):
        await rerun_from(svc, run_id, 1, enqueue=False)


@pytest.mark.slow
def test_cli_rerun_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skills_dir: Path
) -> None:
    from jobs.cli.app import app
    from jobs.settings import BUNDLED_SKILLS

    for key in ("SKILLJOBS_DATABASE_URL", "SKILLJOBS_REDIS_URL", "SKILLJOBS_NOTIFY_TARGETS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SKILLJOBS_SKILLS_PATH", f"{BUNDLED_SKILLS}:{skills_dir}")
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    import json

    (tmp_path / "s.json").write_text(json.dumps(SPEC))
    assert runner.invoke(app, ["schedules", "add", str(tmp_path / "s.json")]).exit_code == 0
    res = runner.invoke(app, ["schedules", "run", "tokens", "--inline"])
    assert res.exit_code == 0, res.output
    source = res.output.split()[1].rstrip(":")
    res = runner.invoke(app, ["schedules", "rerun", source, "--from", "second", "--inline"])
    assert res.exit_code == 0, res.output
    assert "succeeded" in res.output
    res = runner.invoke(app, ["schedules", "runs", "tokens"])
    assert "rerun" in res.output and "manual" in res.output
    res = runner.invoke(app, ["schedules", "rerun", source, "--from", "9", "--inline"])
    assert res.exit_code == 1 and "out of range" in res.output
