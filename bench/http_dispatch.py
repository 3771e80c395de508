"""Sync-line dispatch through the HTTP endpoint, in process.

Run: ``.venv/bin/python -m bench.http_dispatch [--runs 5000]``. ``POST /api/v1/dispatch``
of the bundled ``echo`` skill on a web channel (the sync line: the answer is the result)
through the whole ASGI app — the guard (Host, token, body cap, JSON check), FastAPI
validation, the dispatcher and the executor — with ``httpx.ASGITransport`` (no network).
No role, so no configuration lookup and no database round trip. Budget: p50 ≤ 0.5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import pct
from dashboard.app import create_app
from jobs.catalog.loader import load_registry
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.services import Services
from jobs.settings import Settings

TOKEN = "bench-token-0123456789abcdef0123456789"
KEY = "t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
BODY = {
    "skill": "echo",
    "input": {"text": "hello", "n": 3},
    "context": {"channel": "web", "session_id": "bench", "actor_name": "bench"},
}


async def main(runs: int) -> None:
    # httpx's ASGITransport tries `import trio` on every request; when trio is not
    # installed that failed import (a path search) costs the client ~0.1 ms a call.
    # Mark it absent once so the figure is the app's, not the test client's.
    if "trio" not in sys.modules and importlib.util.find_spec("trio") is None:
        sys.modules["trio"] = None  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None,
            data_dir=Path(tmp),
            database_url=f"sqlite+aiosqlite:///{tmp}/bench.db",
            api_token=TOKEN,
            secret_key=KEY,
        )
        engine = create_engine(settings.resolved_database_url)
        svc = Services(
            settings=settings,
            engine=engine,
            sessionmaker=create_sessionmaker(engine),
            box=SecretBox(KEY.encode()),
            registry=load_registry(settings.skill_dirs),
        )
        app = create_app(settings, services=svc)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://127.0.0.1",
            headers={"authorization": f"Bearer {TOKEN}"},
        ) as http:
            for _ in range(200):  # warm up: imports, entry cache, pydantic schemas
                resp = await http.post("/api/v1/dispatch", json=BODY)
                assert resp.status_code == 200 and resp.json()["text"] == "hello", resp.text
            gc.collect()
            took = []
            for _ in range(runs):
                t0 = time.perf_counter()
                resp = await http.post("/api/v1/dispatch", json=BODY)
                took.append((time.perf_counter() - t0) * 1000)
                assert resp.status_code == 200
        await svc.close()
    print(f"python {platform.python_version()}, {runs} dispatches of echo (sync line)")
    print(
        f"p50 {statistics.median(took):.3f} ms · p95 {pct(took, 95):.3f} ms · "
        f"p99 {pct(took, 99):.3f} ms · budget p50 ≤ 0.5 ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5000)
    asyncio.run(main(parser.parse_args().runs))
