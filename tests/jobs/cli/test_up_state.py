"""`skilljobs up --redis-port` leaves state.json in the data dir, and every other command
finds the instance from it with nothing but SKILLJOBS_DATA_DIR set."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli.embedded import free_port
from tests.helpers.settings import JOB_SKILLS
from tests.jobs.cli.test_up import _listening, _stop, _wait_ready

UP = (sys.executable, "-m", "jobs.cli.app", "up")
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _only_data_dir(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
    env["SKILLJOBS_DATA_DIR"] = str(tmp_path / "data")
    return env


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli.app", *args],
        cwd=tmp_path,
        env=_only_data_dir(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_commands_find_the_instance_from_the_state_file(tmp_path):
    port, redis_port = free_port(), free_port()
    log = tmp_path / "up.log"
    env = _only_data_dir(tmp_path) | {
        "SKILLJOBS_SKILLS_PATH": f"{JOB_SKILLS}{os.pathsep}bundled",
        "SKILLJOBS_WORKER_GRACE_SEC": "3",
        "SKILLJOBS_SYNC_PROCESSES": "0",  # nothing here runs on the sync line
    }
    proc = subprocess.Popen(
        [*UP, "--port", str(port), "--redis-port", str(redis_port)],
        cwd=tmp_path,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_ready(proc, log, port)
        assert _listening(redis_port)
        path = tmp_path / "data" / "state.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        state = json.loads(path.read_text())
        assert state["pid"] == proc.pid
        assert state["web_url"] == f"http://127.0.0.1:{port}"
        assert f"127.0.0.1:{redis_port}" in state["redis_url"]
        assert state["database_url"].startswith("sqlite+aiosqlite:///")
        assert state["skills_path"] == env["SKILLJOBS_SKILLS_PATH"]

        skills = _cli(tmp_path, "skills", "list", "--json")
        assert "bg_sleep" in {s["name"] for s in json.loads(skills.stdout)["items"]}
        listed = _cli(tmp_path, "schedules", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        demo = json.loads(listed.stdout)["items"][0]["name"]
        ran = _cli(tmp_path, "schedules", "run", demo)
        assert ran.returncode == 0 and "queued" in ran.stdout, ran.stdout + ran.stderr
        workers = _cli(tmp_path, "workers", "list", "--json")
        assert workers.returncode == 0, workers.stderr
        doctor = json.loads(_cli(tmp_path, "doctor", "--json").stdout)
        redis_check = next(c for c in doctor if c["name"] == "redis")
        assert redis_check["status"] == "ok", redis_check
        again = _cli(tmp_path, "up", "--port", str(free_port()))
        assert again.returncode != 0 and "already runs" in again.stderr
    finally:
        assert _stop(proc) == 0, log.read_text()[-3000:]
