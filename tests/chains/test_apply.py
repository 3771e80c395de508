"""Schedules as code: ``skilljobs schedules apply DIR|FILE`` (create or update by name,
idempotent, a diff, ``--prune``), ``schedules delete``, ``DELETE /api/v1/schedules/{id}``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from jobs.cli.app import app

pytestmark = pytest.mark.integration


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in ("SKILLJOBS_DATABASE_URL", "SKILLJOBS_REDIS_URL", "SKILLJOBS_SKILLS_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["db", "upgrade"]).exit_code == 0
    return tmp_path


def _schedule(name: str, cron: str = "0 9 * * *", text: str = "hi") -> dict:
    return {
        "name": name,
        "cron": cron,
        "timezone": "Asia/Shanghai",
        "steps": [{"skill": "echo", "input": {"text": text}}],
    }


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def _audit(data: Path) -> list[str]:
    import asyncio

    from jobs.db import create_engine, create_sessionmaker
    from jobs.models import OpsAction

    async def go() -> list[str]:
        engine = create_engine(f"sqlite+aiosqlite:///{data / 'skilljobs.db'}")
        async with create_sessionmaker(engine)() as s:
            rows = (await s.scalars(select(OpsAction).order_by(OpsAction.id))).all()
        await engine.dispose()
        return [r.action for r in rows]

    return asyncio.run(go())


@pytest.mark.slow
def test_apply_a_folder_is_idempotent_prints_a_diff_and_prunes(cli_env: Path) -> None:
    folder = cli_env / "schedules"
    folder.mkdir()
    (folder / "a.yaml").write_text(yaml.safe_dump(_schedule("alpha")))
    (folder / "b.json").write_text(json.dumps(_schedule("beta", "30 8 * * 1-5")))
    (folder / "notes.txt").write_text("not a schedule")

    res = run("schedules", "apply", str(folder))
    assert res.exit_code == 0, res.output
    assert "+ alpha (create)" in res.output and "+ beta (create)" in res.output
    assert "2 created" in res.output

    again = run("schedules", "apply", str(folder))
    assert again.exit_code == 0
    assert "= alpha (unchanged)" in again.output and "2 unchanged" in again.output

    (folder / "a.yaml").write_text(yaml.safe_dump(_schedule("alpha", "15 9 * * *")))
    res = run("schedules", "apply", str(folder))
    assert "~ alpha (update)" in res.output
    assert 'cron: "0 9 * * *" -> "15 9 * * *"' in res.output
    assert "1 updated, 1 unchanged" in res.output
    listed = json.loads(run("schedules", "list", "--json").output)["items"]
    assert {s["name"]: s["cron"] for s in listed} == {"alpha": "15 9 * * *", "beta": "30 8 * * 1-5"}

    # an operator's disable survives an apply of a file that does not say `enabled`
    assert run("schedules", "disable", "beta").exit_code == 0
    assert "= beta (unchanged)" in run("schedules", "apply", str(folder)).output

    (folder / "b.json").unlink()
    dry = run("schedules", "apply", str(folder), "--prune", "--dry-run", "--json")
    assert json.loads(dry.output)["items"][-1] == {
        "name": "beta",
        "action": "delete",
        "changes": {},
    }
    assert len(json.loads(run("schedules", "list", "--json").output)["items"]) == 2
    res = run("schedules", "apply", str(folder), "--prune")
    assert "- beta (delete)" in res.output and "1 deleted" in res.output
    names = [s["name"] for s in json.loads(run("schedules", "list", "--json").output)["items"]]
    assert names == ["alpha"]
    actions = _audit(cli_env / "data")
    assert actions.count("schedule.create") == 2 and "schedule.update" in actions
    assert actions[-1] == "schedule.delete"


@pytest.mark.slow
def test_apply_refuses_a_bad_file_and_changes_nothing(cli_env: Path) -> None:
    folder = cli_env / "s"
    folder.mkdir()
    (folder / "good.yaml").write_text(yaml.safe_dump(_schedule("good")))
    (folder / "bad.yaml").write_text(yaml.safe_dump(_schedule("bad", "61 * * * *")))
    res = run("schedules", "apply", str(folder))
    assert res.exit_code == 1 and "bad.yaml" in res.output and "nothing changed" in res.output
    assert json.loads(run("schedules", "list", "--json").output)["items"] == []


@pytest.mark.slow
def test_delete_by_name(cli_env: Path) -> None:
    path = cli_env / "one.yaml"
    path.write_text(yaml.safe_dump(_schedule("one")))
    assert run("schedules", "apply", str(path)).exit_code == 0
    res = run("schedules", "delete", "one", "--yes")
    assert res.exit_code == 0 and "deleted" in res.output
    again = run("schedules", "delete", "one", "--yes")
    assert again.exit_code == 1 and "no schedule 'one'" in again.output
    shown = run("schedules", "show", "one", "--json")
    assert shown.exit_code == 1
