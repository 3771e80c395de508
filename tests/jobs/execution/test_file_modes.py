"""After `skilljobs up`, what it created belongs to its user alone: data dir and workspaces
0700, database, key and token files 0600."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from jobs.cli.embedded import free_port

pytestmark = pytest.mark.slow


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_up_keeps_its_files_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)  # left by an older version: tightened at start
    data.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
    env.update({"SKILLJOBS_DATA_DIR": str(data), "SKILLJOBS_WORKER_GRACE_SEC": "2"})
    port = free_port()
    log = tmp_path / "up.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli.app", "up", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        token = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not token:
            assert proc.poll() is None, log.read_text()
            m = re.search(r"API token : (\S+)", log.read_text())
            # the banner is printed as the web server starts, not once it listens
            if m and _healthy(port):
                token = m.group(1)
            time.sleep(0.2)
        assert token, log.read_text()
        resp = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/dispatch",
            json={
                "skill": "echo",
                "input": {"hello": "x"},
                "context": {"channel": "web", "role_id": "r_modes", "session_id": "s_modes"},
            },
            headers={"authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
        ws = data / "workspaces" / "r_modes"
        assert _mode(data) == 0o700
        for name in ("skilljobs.db", "secret.key", "api_token"):
            assert _mode(data / name) == 0o600, name
        assert _mode(data / "workspaces") == 0o700
        assert _mode(ws) == 0o700 and _mode(ws / "s_modes") == 0o700
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
