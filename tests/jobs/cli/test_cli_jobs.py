"""`skilljobs dispatch` and `skilljobs jobs …` as an operator types them."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from jobs.cli.app import app
from tests.helpers.settings import JOB_SKILLS


@pytest.fixture
def cli_env(tmp_path, monkeypatch, redis_server_url, redis_prefix, sqlite_url):
    for k, v in {
        "SKILLJOBS_DATA_DIR": str(tmp_path / "data"),
        "SKILLJOBS_DATABASE_URL": sqlite_url,
        "SKILLJOBS_REDIS_URL": redis_server_url,
        "SKILLJOBS_REDIS_PREFIX": redis_prefix,
        "SKILLJOBS_QUEUE_NAME": f"{redis_prefix}:queue",
        "SKILLJOBS_SKILLS_PATH": str(JOB_SKILLS),
        "COLUMNS": "200",
    }.items():
        monkeypatch.setenv(k, v)
    return CliRunner()


def run(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_dispatch_sync_prints_the_result(cli_env):
    res = run(cli_env, "dispatch", "sync_echo", "--input", '{"a": 1}', "--channel", "web")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["echo"] == {"a": 1}


@pytest.mark.slow
def test_dispatch_async_then_list_show_cancel_retry(cli_env):
    res = run(
        cli_env,
        "dispatch",
        "bg_sleep",
        "--input",
        '{"seconds": 0}',
        "--channel",
        "telegram",
        "--actor-key",
        "tg-1",
        "--role",
        "r1",
    )
    assert res.exit_code == 0, res.output
    body = json.loads(res.output)
    assert body["async"] is True
    job_id = body["job_id"]

    listed = run(cli_env, "jobs", "list", "--status", "queued")
    assert listed.exit_code == 0 and job_id[:8] in listed.output and "bg_sleep" in listed.output

    shown = run(cli_env, "jobs", "show", job_id)
    assert shown.exit_code == 0 and "queued" in shown.output and "tg-1" in shown.output

    cancelled = run(cli_env, "jobs", "cancel", job_id)
    assert cancelled.exit_code == 0 and "cancelled before it started" in cancelled.output
    again = run(cli_env, "jobs", "cancel", job_id)
    assert again.exit_code == 1 and "already finished (cancelled)" in again.output

    retried = run(cli_env, "jobs", "retry", job_id)
    assert retried.exit_code == 0 and "new attempt" in retried.output


@pytest.mark.slow
def test_dispatch_from_a_group_conversation(cli_env):
    res = run(
        cli_env,
        "dispatch",
        "bg_sleep",
        "--input",
        '{"seconds": 0}',
        "--channel",
        "telegram",
        "--actor-key",
        "1001",
        "--role",
        "r1",
        "--conversation",
        "-1001234567890",
        "--message-id",
        "42",
    )
    assert res.exit_code == 0, res.output
    shown = run(cli_env, "jobs", "show", json.loads(res.output)["job_id"])
    assert "conversation_id=-1001234567890 message_id=42" in shown.output, shown.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["dispatch", "sync_echo", "--input", "{nope"], "--input is not valid JSON"),
        (["dispatch", "sync_echo", "--input", "[1]"], "--input must be a JSON object"),
        (["dispatch", "missing_skill"], "unknown skill 'missing_skill'"),
        (["jobs", "show", "0" * 32], "no job 000"),
        (["jobs", "retry", "0" * 32], "no job 000"),
    ],
)
@pytest.mark.slow
def test_failures_exit_non_zero_with_a_reason(cli_env, args, needle):
    res = run(cli_env, *args)
    assert res.exit_code == 1
    assert needle in re.sub(r"\s+", " ", res.output)
