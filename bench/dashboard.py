"""Dashboard latency on a large job history in PostgreSQL.

Run: ``.venv/bin/python -m bench.dashboard [--url URL] [--rows 1000000] [--runs 60]``.
Seeds the database with ``bench.seed_jobs`` when it has fewer rows, then times requests
through the real ASGI app in-process (app + SQL, no network). Budget: p95 ≤ 100 ms for the
overview (``/api/v1/queue``), a filtered job list and ``/metrics``; bulk dry runs (the
count a bulk action asks to confirm) are timed too.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time
from typing import Any

import httpx
from sqlalchemy import text

from bench.seed_jobs import DEFAULT_URL, seed
from dashboard.app import create_app
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.services import Services
from jobs.settings import Settings
from jobs.skill import SkillRegistry

TOKEN = "bench-token"


async def _cases(http: httpx.AsyncClient, engine: Any) -> list[tuple[str, str]]:
    async with engine.connect() as conn:
        job_id = (
            await conn.execute(
                text("SELECT id FROM jobs ORDER BY created_at LIMIT 1 OFFSET 500000")
            )
        ).scalar()
    first = (await http.get("/api/v1/jobs", params={"status": "failed", "limit": 50})).json()
    cursor = first["next_cursor"]
    since = time.time() - 86400
    return [
        ("overview /api/v1/queue", "/api/v1/queue"),
        ("/api/v1/queue?brief=true (SPEC keys only)", "/api/v1/queue?brief=true"),
        ("/metrics", "/metrics"),
        ("jobs, no filter", "/api/v1/jobs?limit=50"),
        ("jobs status=failed", "/api/v1/jobs?status=failed&limit=50"),
        (
            "jobs status=failed, page 2 (cursor)",
            f"/api/v1/jobs?status=failed&limit=50&cursor={cursor}",
        ),
        ("jobs skill=video_cut (rare)", "/api/v1/jobs?skill=video_cut&limit=50"),
        ("jobs channel=feishu, last 24 h", f"/api/v1/jobs?channel=feishu&since={since}&limit=50"),
        ("jobs role=r17 + status=succeeded", "/api/v1/jobs?role=r17&status=succeeded&limit=50"),
        ("jobs q=<job id>", f"/api/v1/jobs?q={job_id}&limit=50"),
        ("jobs q=quota (text), last 24 h", f"/api/v1/jobs?q=quota&since={since}&limit=50"),
        ("jobs q=quota (text), all time", "/api/v1/jobs?q=quota&limit=50"),
        ("jobs q=<absent text>, last 24 h", f"/api/v1/jobs?q=nosuchthing&since={since}&limit=50"),
        ("jobs q=<absent text>, all time", "/api/v1/jobs?q=nosuchthing&limit=50"),
        ("job detail", f"/api/v1/jobs/{job_id}"),
        ("workers", "/api/v1/workers"),
        ("jobs q=<session id>, all time", "/api/v1/jobs?q=s4439&limit=50"),
        ("stats/timeseries 1h, step 60", "/api/v1/stats/timeseries?window=1h&step=60"),
        ("stats/timeseries 24h, step 600", "/api/v1/stats/timeseries?window=24h&step=600"),
        ("stats/timeseries 24h, step 60", "/api/v1/stats/timeseries?window=24h&step=60"),
        ("deliveries (failed, unknown)", "/api/v1/deliveries?limit=100"),
        ("deliveries status=sent", "/api/v1/deliveries?status=sent&limit=100"),
        ("audit", "/api/v1/audit?limit=50"),
        ("incidents", "/api/v1/incidents"),
        ("jobs status=failed,timed_out", "/api/v1/jobs?status=failed,timed_out&limit=50"),
        ("jobs status=failed, since=24h", "/api/v1/jobs?status=failed&since=24h&limit=50"),
        ("schedules (next 5 fires each)", "/api/v1/schedules"),
    ]


def _bulk(name: str, flt: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    return (f"bulk dry run: {name}", "/api/v1/jobs/bulk", {"action": "retry", "filter": flt})


BULK_CASES = [
    _bulk("failed, skill=video_cut (rare)", {"status": "failed", "skill": "video_cut"}),
    _bulk("failed, q=quota, last 24 h", {"status": "failed", "q": "quota", "since": "24h"}),
    _bulk("failed, channel=feishu, last 24 h", {"channel": "feishu", "since": "24h"}),
    _bulk("failed and timed out (every one)", {}),
]


async def run(url: str, rows: int, runs: int) -> list[dict[str, Any]]:
    print(await seed(url, rows))
    settings = Settings(_env_file=None, database_url=url, api_token=TOKEN)  # type: ignore[call-arg]
    engine = create_engine(url)
    from cryptography.fernet import Fernet

    services = Services(
        settings=settings,
        engine=engine,
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(Fernet.generate_key()),
        registry=SkillRegistry(),
    )
    app = create_app(settings, services=services)
    out = []
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
    ) as http:
        cases = [(name, path, None) for name, path in await _cases(http, engine)]
        for name, path, body in [*cases, *BULK_CASES]:

            def call(path: str = path, body: Any = body) -> Any:
                return http.get(path) if body is None else http.post(path, json=body)

            for _ in range(5):  # warm up (connections, plans, caches)
                assert (await call()).status_code == 200, path
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                resp = await call()
                times.append((time.perf_counter() - t0) * 1000)
                assert resp.status_code == 200
            times.sort()
            out.append(
                {
                    "case": name,
                    "p50": statistics.median(times),
                    "p95": times[max(0, int(len(times) * 0.95) - 1)],
                    "max": times[-1],
                }
            )
            print(
                f"{name:40s} p50 {out[-1]['p50']:7.1f} ms  p95 {out[-1]['p95']:7.1f} ms  max {out[-1]['max']:7.1f} ms"
            )
    await services.http.aclose()
    await engine.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    rows = asyncio.run(run(args.url, args.rows, args.runs))
    print()
    print(f"Python {platform.python_version()}, {args.rows:,} jobs, {args.runs} runs per case")
    print("| case | p50 | p95 | max |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['p50']:.1f} ms | {r['p95']:.1f} ms | {r['max']:.1f} ms |")


if __name__ == "__main__":
    main()
