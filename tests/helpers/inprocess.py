"""Helpers of the tests of delayed jobs, run-time limits and schedule options: a real worker
running in the test's loop, the API in process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import SecretStr

from dashboard.app import create_app
from jobs.queue.worker import build_worker

TOKEN = "inprocess-token-7c1e"


@contextlib.asynccontextmanager
async def running_worker(services: Any, **kw: Any) -> AsyncIterator[Any]:
    w = build_worker(services, handle_signals=False, scheduler=kw.pop("scheduler", False), **kw)
    task = asyncio.create_task(w.async_run())
    try:
        yield w
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await w.close()


@contextlib.asynccontextmanager
async def api(services: Any) -> AsyncIterator[httpx.AsyncClient]:
    services.settings.api_token = SecretStr(TOKEN)
    application = create_app(services.settings, services=services)
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
    ) as c:
        yield c
