"""``skilljobs schedules …`` against a real SQLite data dir."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli.app import app


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in (
        "SKILLJOBS_DATABASE_URL",
        "SKILLJOBS_REDIS_URL",
        "SKILLJOBS_SKILLS_PATH",
        "SKILLJOBS_NOTIFY_TARGETS",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    return tmp_path


@pytest.mark.slow
def test_schedules_cli_end_to_end(cli_env: Path, repo_root: Path) -> None:
    import yaml

    runner = CliRunner()
    data = yaml.safe_load((repo_root / "chains/demo/daily_orders.yaml").read_text())
    data["steps"][0]["input"]["day"] = "2026-01-05"  # a day with refunds to purge
    data["deliver"] = {"target": "ops"}
    demo = cli_env / "daily.yaml"
    demo.write_text(yaml.safe_dump(data))
    res = runner.invoke(app, ["schedules", "add", str(demo)])
    assert res.exit_code == 0, res.output
    assert "daily-orders" in res.output and "next fire" in res.output

    res = runner.invoke(app, ["schedules", "list"])
    assert res.exit_code == 0 and "daily-orders" in res.output and "0 9 * * 1-5" in res.output

    res = runner.invoke(app, ["schedules", "run", "daily-orders", "--inline"])
    assert res.exit_code == 0, res.output
    assert "succeeded" in res.output and "chain_purge_rows" in res.output
    # no notify alias is configured: the delivery failure is reported, the run still succeeded
    assert "delivery to notify:ops: failed" in res.output

    res = runner.invoke(app, ["schedules", "runs", "daily-orders"])
    assert res.exit_code == 0 and "manual" in res.output and "succeeded" in res.output
    res = runner.invoke(app, ["schedules", "list"])
    assert "succeeded" in res.output  # last run status

    res = runner.invoke(app, ["schedules", "disable", "daily-orders"])
    assert res.exit_code == 0 and "disabled" in res.output
    res = runner.invoke(app, ["schedules", "show", "daily-orders"])
    assert res.exit_code == 0 and '"enabled": false' in res.output
    res = runner.invoke(app, ["schedules", "enable", "daily-orders"])
    assert res.exit_code == 0 and "next fire" in res.output
    res = runner.invoke(app, ["schedules", "show", "daily-orders", "--next", "3"])
    assert res.exit_code == 0 and "next 3 fire(s):" in res.output
    assert len(re.findall(r"^  \d{4}-\d\d-\d\d \d\d:\d\d .*UTC\)$", res.output, re.M)) == 3
    assert res.output.count('"next_fires"') == 1
    res = runner.invoke(app, ["schedules", "list", "--next", "4"])
    assert res.exit_code == 0 and "next 4 fires" in res.output

    # queueing needs Redis; the command says so instead of failing obscurely
    res = runner.invoke(app, ["schedules", "run", "daily-orders"])
    assert res.exit_code == 1 and "--inline" in res.output


@pytest.mark.slow
def test_schedules_cli_errors(cli_env: Path) -> None:
    runner = CliRunner()
    bad = cli_env / "bad.yaml"
    bad.write_text('name: bad\ncron: "0 25 * * *"\ntimezone: Nowhere/X\nsteps:\n  - skill: nope\n')
    res = runner.invoke(app, ["schedules", "add", str(bad)])
    assert res.exit_code == 1
    assert "value 25 is out of range 0-23" in res.output
    assert "'Nowhere/X' is not a known IANA timezone" in res.output
    assert "unknown skill 'nope'" in res.output

    assert runner.invoke(app, ["schedules", "add", str(cli_env / "missing.yaml")]).exit_code == 1
    (cli_env / "list.yaml").write_text("- a\n- b\n")
    res = runner.invoke(app, ["schedules", "add", str(cli_env / "list.yaml")])
    assert res.exit_code == 1 and "one mapping" in res.output
    res = runner.invoke(app, ["schedules", "show", "nope"])
    assert res.exit_code == 1 and "no schedule 'nope'" in res.output
    res = runner.invoke(app, ["schedules", "enable", "nope"])
    assert res.exit_code == 1 and "no schedule 'nope'" in res.output
