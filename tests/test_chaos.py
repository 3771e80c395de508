"""The chaos harness, 60 seconds of it: every must-be-0 figure is 0 (``make chaos`` runs
the full 5 minutes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from glob import glob
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _tools() -> bool:
    initdb = glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which("initdb")
    return bool(initdb) and shutil.which("redis-server") is not None


@pytest.mark.timeout(420)
@pytest.mark.skipif(not _tools(), reason="needs PostgreSQL server binaries and redis-server")
@pytest.mark.slow
def test_sixty_seconds_of_faults_lose_nothing_and_run_nothing_twice(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--duration", "60", "--jobs", "300",
         "--drain", "90", "--results", str(results)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    table = results.read_text()
    assert "| lost (never terminal) | 0 | ✅ |" in table
    assert "| completed after its outcome was recorded | 0 | ✅ |" in table
    assert "❌" not in table
