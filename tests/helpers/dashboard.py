"""Helpers of the dashboard tests: services on a test database, a live server, seeding."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.models import Job, new_id
from jobs.services import Services
from jobs.skill import SkillRegistry
from tests.helpers.settings import make_settings

TOKEN = "dash-token-5d1f0c"


async def make_services(
    tmp_path: Path, database_url: str, redis_url: str, prefix: str, redis: Any, **kw: Any
) -> Services:
    settings = make_settings(
        tmp_path, redis_url=redis_url, prefix=prefix, database_url=database_url, **kw
    )
    engine = create_engine(database_url)
    key = settings.secret_key.get_secret_value().encode()  # type: ignore[union-attr]
    return Services(
        settings=settings,
        engine=engine,
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(key),
        registry=SkillRegistry(),
        redis=redis,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """The app under a real uvicorn on a loopback port, in the test's event loop."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=1,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LiveServer:
        self.task = asyncio.create_task(self.server.serve())
        deadline = time.monotonic() + 30  # its lifespan start-up, on a loaded host
        while time.monotonic() < deadline:
            if self.server.started:
                return self
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.02)
        raise RuntimeError("uvicorn did not start")

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)


# --- seeding ---------------------------------------------------------------------------


async def seed_job(services: Services, **kw: Any) -> Job:
    now = time.time()
    values: dict[str, Any] = {
        "id": new_id(),
        "skill": "demo",
        "status": "succeeded",
        "attempts": 1,
        "channel": "telegram",
        "role_id": "r1",
        "org_id": "o1",
        "session_id": "s1",
        "actor_key": "12345",
        "created_at": now,
        "queued_at": now,
    }
    values.update(kw)
    if values["status"] in ("succeeded", "failed", "timed_out", "cancelled"):
        values.setdefault("started_at", values["created_at"] + 0.1)
        values.setdefault("finished_at", values["created_at"] + 1.0)
        values.setdefault("duration_ms", 900.0)
    job = Job(**values)
    async with services.sessionmaker() as s:
        s.add(job)
        await s.commit()
    return job


async def seed_rows(services: Services, *rows: Any) -> None:
    async with services.sessionmaker() as s:
        s.add_all(rows)
        await s.commit()
