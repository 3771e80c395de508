"""`skilljobs up` on the embedded default (bundled Redis server + SQLite), as a newcomer runs
it: starts, serves, runs the demo from the printed command, stops cleanly, starts again."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from jobs.cli.embedded import free_port

pytestmark = pytest.mark.slow


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
    env["SKILLJOBS_DATA_DIR"] = str(tmp_path / "data")
    env["SKILLJOBS_WORKER_GRACE_SEC"] = "3"
    return env


def _start(tmp_path: Path, port: int, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli.app", "up", "--port", str(port)],
        cwd=tmp_path,
        env=_env(tmp_path) | env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, port: int) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        text = log.read_text()
        m = re.search(r"API token : (\S+)", text)
        if m:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return m.group(1)
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"`skilljobs up` did not become ready:\n{log.read_text()}")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(60)


def _bundled_redis_is_private(data: Path, port: int, banner: str) -> None:
    """The bundled Redis refuses a client without its password; the password and the URL
    holding it are readable by this user only."""
    import redis

    for name in ("redis.password", "redis/url"):
        assert (data / name).stat().st_mode & 0o777 == 0o600, name
    password = (data / "redis.password").read_text().strip()
    assert len(password) >= 32 and password not in banner
    assert password in (data / "redis" / "url").read_text()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port, socket_timeout=5).ping()
    assert redis.Redis(port=port, password=password, socket_timeout=5).ping()


@pytest.mark.slow
def test_up_runs_the_demo_and_stops_without_leftovers(tmp_path):
    port = free_port()
    log = tmp_path / "up.log"
    proc = _start(tmp_path, port, log)
    try:
        token = _wait_ready(proc, log, port)
        banner = log.read_text()
        found = re.search(r"redis\s+: redis://:\*\*\*\*@127\.0\.0\.1:(\d+)", banner)
        assert found, banner  # the password is never printed
        redis_port = int(found.group(1))
        assert _listening(redis_port)
        _bundled_redis_is_private(tmp_path / "data", redis_port, banner)
        # The page and API need the token; health does not.
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/api/v1/jobs").status_code == 401
        # The ready command from the banner, run as printed (CLI → embedded Redis).
        cmd = re.search(r"^\s+(\S*skilljobs dispatch .+)$", banner, re.M).group(1)
        args = [sys.executable, "-m", "jobs.cli.app", *_split(cmd)[1:]]
        done = subprocess.run(
            args, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "succeeded" in done.stdout
        msgs = httpx.get(
            f"{base}/api/v1/sessions/demo/messages", headers={"Authorization": f"Bearer {token}"}
        ).json()["items"]
        assert any("Sales report" in m["text"] for m in msgs)
        assert any(a["filename"].endswith(".png") for m in msgs for a in m["attachments"])
    finally:
        code = _stop(proc)
    assert code == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
    assert not _listening(port) and not _listening(redis_port)

    # Running it twice works: same data dir, same token, state kept.
    log2 = tmp_path / "up2.log"
    proc = _start(tmp_path, port, log2)
    try:
        assert _wait_ready(proc, log2, port) == token
        jobs = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}
        ).json()["items"]
        assert [j["status"] for j in jobs if j["skill"] == "sales_report"] == ["succeeded"]
    finally:
        assert _stop(proc) == 0


def test_up_refuses_a_public_bind_without_a_token(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "jobs.cli.app", "web", "--host", "0.0.0.0"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "refusing to listen on 0.0.0.0: set SKILLJOBS_API_TOKEN first" in done.stderr


def _split(cmd: str) -> list[str]:
    import shlex

    return shlex.split(cmd)


def _workers_of(pid: int) -> list[int]:
    """Child processes of ``pid`` running ``skilljobs worker`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"worker" in cmdline:
            found.append(int(entry.name))
    return found


def _wait_for(predicate, limit: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")


@pytest.mark.slow
def test_up_runs_its_worker_as_a_supervised_child(tmp_path):
    """The worker is a process of its own (a core of its own): killed, it is started again
    and jobs still run; stopping `up` stops it."""
    port = free_port()
    log = tmp_path / "up.log"
    # (no sync-line executors: two interpreters fewer, and nothing here runs on that line)
    proc = _start(tmp_path, port, log, SKILLJOBS_SYNC_PROCESSES="0")
    try:
        token = _wait_ready(proc, log, port)
        first = _wait_for(lambda: _workers_of(proc.pid))
        assert len(first) == 1
        os.kill(first[0], signal.SIGKILL)
        second = _wait_for(lambda: [p for p in _workers_of(proc.pid) if p not in first])
        assert "the worker exited" in log.read_text()
        # The banner's background command still runs, on the new worker.
        cmd = re.search(r"^\s+(\S*skilljobs dispatch .+)$", log.read_text(), re.M).group(1)
        args = [sys.executable, "-m", "jobs.cli.app", *_split(cmd)[1:]]
        done = subprocess.run(
            args, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0 and "succeeded" in done.stdout, done.stdout + done.stderr
        assert token
    finally:
        code = _stop(proc)
    assert code == 0, log.read_text()[-3000:]
    assert (
        not Path(f"/proc/{second[0]}").exists()
        or "zombie" in Path(f"/proc/{second[0]}/status").read_text().lower()
    )
