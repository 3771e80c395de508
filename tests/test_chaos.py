"""The chaos harness, about a minute of it: every must-be-0 figure is 0 — nothing lost,
executed twice, delivered twice, failed because of a fault or left undelivered, every cron
tick fired once (``make chaos`` runs the full 5 minutes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from glob import glob
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.chaos]


def _tools() -> bool:
    initdb = glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which("initdb")
    return bool(initdb) and shutil.which("redis-server") is not None


@pytest.mark.timeout(300)
@pytest.mark.skipif(not _tools(), reason="needs PostgreSQL server binaries and redis-server")
def test_a_minute_of_faults_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--duration", "20", "--jobs", "100",
         "--drain", "40", "--results", str(results)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    table = results.read_text()
    for figure in (
        "lost (never terminal)",
        "executed twice (overlapping, or after the record)",
        "delivered twice",
        "failed because of faults",
        "deliveries not arrived at the end",
        "cron ticks missing",
    ):
        assert f"| {figure} | 0 | ✅ |" in table, table
    assert "❌" not in table
