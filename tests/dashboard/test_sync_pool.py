"""The sync line runs in executor processes of `skilljobs web`: a skill computing for
seconds does not stall the API, and a lost executor process is replaced."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.settings import ROOT
from tests.helpers.web import TOKEN, WebProcess

pytestmark = pytest.mark.slow

AUTH = {"authorization": f"Bearer {TOKEN}"}
ENV = {
    "SKILLJOBS_SKILLS_PATH": f"bundled{os.pathsep}{ROOT / 'bench' / 'skills'}",
    "SKILLJOBS_SYNC_PROCESSES": "2",  # the default of `skilljobs web`
}


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmd:
            found.append(int(entry))
    return found


@pytest.mark.slow
def test_a_cpu_bound_skill_does_not_stall_the_api(
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str
) -> None:
    with WebProcess(tmp_path, sqlite_url, redis_server_url, redis_prefix, env=ENV) as proc:
        with proc.client(headers=AUTH) as c:
            echo = {"skill": "echo", "input": {"a": 1}, "context": {"channel": "web"}}
            first = c.post("/api/v1/dispatch", json=echo, timeout=60)
            assert first.status_code == 200 and first.json()["a"] == 1
            answers: list[httpx.Response] = []
            burn = {"skill": "cpu_burn", "input": {"seconds": 3}, "context": {"channel": "web"}}
            worker = threading.Thread(
                target=lambda: answers.append(c.post("/api/v1/dispatch", json=burn, timeout=60))
            )
            worker.start()
            took = []
            with proc.client() as poll:
                time.sleep(0.2)
                while worker.is_alive():
                    t0 = time.perf_counter()
                    assert poll.get("/healthz").status_code == 200
                    took.append(time.perf_counter() - t0)
                    time.sleep(0.02)
            worker.join()
            assert answers[0].status_code == 200 and answers[0].json()["ok"] is True
            # Stalled, the 3 s run would leave room for one or two polls; the machine is
            # shared, so single slow polls are tolerated.
            took.sort()
            assert len(took) > 20 and took[len(took) * 9 // 10] < 0.5, took

            # An executor process that dies is replaced; the next call is served.
            pool = _children(proc.pid)
            assert len(pool) == 2, pool
            for pid in pool:
                os.kill(pid, signal.SIGKILL)
            # (until they have exited, closing their pipes: a loaded host takes a while)
            deadline = time.monotonic() + 15
            while set(_children(proc.pid)) & set(pool) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # the web process reads the end of their pipes
            again = c.post("/api/v1/dispatch", json=echo, timeout=60)
            assert again.status_code == 200 and again.json()["a"] == 1
            # Refusals and background jobs are answered by the web process itself.
            unknown = c.post("/api/v1/dispatch", json={"skill": "nope", "context": {}})
            assert unknown.status_code == 404
            replaced = _children(proc.pid)
            assert replaced and not set(replaced) & set(pool)
    # Stopping the web app stops its executor processes.
    deadline = time.monotonic() + 10
    while [pid for pid in replaced if Path(f"/proc/{pid}").exists()]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not [pid for pid in replaced if Path(f"/proc/{pid}").exists()]
    assert "Traceback" not in proc.log.read_text()
