"""Real `skilljobs worker` processes for tests that kill, pause and restart them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from jobs.models import JobAttempt
from tests.helpers.settings import ROOT

_PASSED = (
    "database_url",
    "redis_url",
    "redis_prefix",
    "queue_name",
    "skills_path",
    "trusted_skills",
    "data_dir",
    "worker_lease_sec",
    "worker_heartbeat_sec",
    "reconcile_interval_sec",
    "reconcile_stale_sec",
    "worker_grace_sec",
)


class WorkerProcess:
    """A real `skilljobs worker` in its own process group."""

    def __init__(self, settings: Any, log: Path, *args: str, **overrides: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
        for name in _PASSED:
            env[f"SKILLJOBS_{name.upper()}"] = str(getattr(settings, name))
        env["SKILLJOBS_SECRET_KEY"] = settings.secret_key.get_secret_value()
        env.update(overrides)
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli.app", "worker", *(args or ("--no-scheduler",))],
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(ROOT),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def pid_of(worker_id: str) -> int:
    """The process id inside a worker id (``host:pid:suffix``)."""
    return int(worker_id.split(":")[1])


async def holder(svc: Any, job_id: str, limit: float = 30.0) -> JobAttempt:
    """The attempt currently running the job."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        async with svc.sessionmaker() as s:
            a = await s.scalar(
                select(JobAttempt).where(
                    JobAttempt.job_id == job_id, JobAttempt.finished_at.is_(None)
                )
            )
        if a is not None:
            return a
        await asyncio.sleep(0.05)
    raise AssertionError("the job never started")
