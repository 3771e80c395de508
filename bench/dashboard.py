"""Dashboard latency on a large job history in PostgreSQL.

Run: ``.venv/bin/python -m bench.dashboard [--url URL] [--rows 1000000] [--runs 40]``.
Seeds the database with ``bench.seed_jobs`` when it has fewer rows, then times every
request the dashboard page makes (and ``/metrics``) through the real ASGI app in-process
(app + SQL + JSON, no network). Budget: p95 ≤ 100 ms per endpoint.

The requests are interleaved: each round asks every case once, in a shuffled order, so a
change of load on a shared host reaches every case alike. ``/api/v1/me`` (no SQL) is the
comparator: what the host's load alone costs a request. Each case's SQL is then run once
more under ``EXPLAIN ANALYZE`` (median of 3): the execution times are what the database
spent, far less sensitive to the load than the wall-clock figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import time
from typing import Any

import httpx
from sqlalchemy import event, text

from bench.seed_jobs import DEFAULT_URL, seed
from dashboard.app import create_app
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.services import Services, connect_redis
from jobs.settings import Settings
from jobs.skill import SkillRegistry

TOKEN = "bench-token"
Case = tuple[str, str, str, Any]  # name, method, path, JSON body


def _get(name: str, path: str) -> Case:
    return (name, "GET", path, None)


def _bulk(name: str, flt: dict[str, Any]) -> Case:
    return (
        f"bulk dry run: {name}",
        "POST",
        "/api/v1/jobs/bulk",
        {"action": "retry", "filter": flt},
    )


async def _cases(http: httpx.AsyncClient, engine: Any) -> list[Case]:
    async with engine.connect() as conn:
        job_id = (
            await conn.execute(
                text("SELECT id FROM jobs ORDER BY created_at LIMIT 1 OFFSET 500000")
            )
        ).scalar()
        schedule_id = (await conn.execute(text("SELECT id FROM schedules LIMIT 1"))).scalar()
        run_id = (
            await conn.execute(text("SELECT id FROM chain_runs ORDER BY created_at DESC LIMIT 1"))
        ).scalar()
    first = (await http.get("/api/v1/jobs", params={"status": "failed", "limit": 50})).json()
    cursor = first["next_cursor"]
    since = time.time() - 86400
    return [
        _get("comparator /api/v1/me (no SQL)", "/api/v1/me"),
        _get("overview /api/v1/queue", "/api/v1/queue"),
        _get("/api/v1/queue?brief=true", "/api/v1/queue?brief=true"),
        _get("/metrics", "/metrics"),
        _get("stats/timeseries 1h, step 60", "/api/v1/stats/timeseries?window=1h&step=60"),
        _get("stats/timeseries 24h, step 600", "/api/v1/stats/timeseries?window=24h&step=600"),
        _get("stats/timeseries 24h, step 60", "/api/v1/stats/timeseries?window=24h&step=60"),
        _get(
            "stats/timeseries deliveries 24h/3600",
            "/api/v1/stats/timeseries?metric=deliveries&window=24h&step=3600",
        ),
        _get("jobs, no filter", "/api/v1/jobs?limit=50"),
        _get("jobs status=failed", "/api/v1/jobs?status=failed&limit=50"),
        _get(
            "jobs status=failed, page 2 (cursor)",
            f"/api/v1/jobs?status=failed&limit=50&cursor={cursor}",
        ),
        _get("jobs status=failed,timed_out", "/api/v1/jobs?status=failed,timed_out&limit=50"),
        _get("jobs status=failed, since=24h", "/api/v1/jobs?status=failed&since=24h&limit=50"),
        _get("jobs skill=video_cut (rare)", "/api/v1/jobs?skill=video_cut&limit=50"),
        _get(
            "jobs skill=video_cut, status=failed",
            "/api/v1/jobs?skill=video_cut&status=failed&limit=50",
        ),
        _get(
            "jobs channel=feishu, last 24 h", f"/api/v1/jobs?channel=feishu&since={since}&limit=50"
        ),
        _get("jobs role=r17 + status=succeeded", "/api/v1/jobs?role=r17&status=succeeded&limit=50"),
        _get("jobs q=<job id>", f"/api/v1/jobs?q={job_id}&limit=50"),
        _get("jobs q=<session id>, all time", "/api/v1/jobs?q=s4439&limit=50"),
        _get("jobs q=quota (text), last 24 h", f"/api/v1/jobs?q=quota&since={since}&limit=50"),
        _get("jobs q=quota (text), all time", "/api/v1/jobs?q=quota&limit=50"),
        _get("jobs q=VIDEO (skill name part), all time", "/api/v1/jobs?q=VIDEO&limit=50"),
        _get("jobs q=VIDEO, status=failed", "/api/v1/jobs?q=VIDEO&status=failed&limit=50"),
        _get(
            "jobs q=<absent text>, last 24 h", f"/api/v1/jobs?q=nosuchthing&since={since}&limit=50"
        ),
        _get("jobs q=<absent text>, all time", "/api/v1/jobs?q=nosuchthing&limit=50"),
        _get("jobs q=<absent text>, failed", "/api/v1/jobs?q=nosuchthing&status=failed&limit=50"),
        _get("job detail", f"/api/v1/jobs/{job_id}"),
        _get("workers", "/api/v1/workers"),
        _get("workers/state", "/api/v1/workers/state"),
        _get("schedules (next 5 fires each)", "/api/v1/schedules"),
        _get("schedule runs", f"/api/v1/schedules/{schedule_id}/runs?limit=20"),
        _get("chain run", f"/api/v1/chain-runs/{run_id}"),
        _get("deliveries (failed, unknown)", "/api/v1/deliveries?limit=100"),
        _get("deliveries status=sent", "/api/v1/deliveries?status=sent&limit=100"),
        (
            "deliveries bulk dry run (failed, unknown)",
            "POST",
            "/api/v1/deliveries/bulk",
            {"action": "dismiss", "filter": {}, "dry_run": True},
        ),
        _get("incidents", "/api/v1/incidents"),
        _get("audit", "/api/v1/audit?limit=50"),
        _bulk("failed, skill=video_cut (rare)", {"status": "failed", "skill": "video_cut"}),
        _bulk("retry, skill=video_cut (failed + timed out)", {"skill": "video_cut"}),
        _bulk("failed, q=quota, last 24 h", {"status": "failed", "q": "quota", "since": "24h"}),
        _bulk("channel=feishu, last 24 h", {"channel": "feishu", "since": "24h"}),
        _bulk("failed and timed out (every one)", {}),
    ]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.95) - 1)]


class Capture:
    """The SQL statements (and parameters) the engine runs while ``on``."""

    def __init__(self, engine: Any) -> None:
        self.on = False
        self.seen: list[tuple[str, Any]] = []

        @event.listens_for(engine.sync_engine, "before_cursor_execute")
        def _seen(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if self.on and statement.lstrip().upper().startswith("SELECT"):
                self.seen.append((statement, params))


async def explain(engine: Any, statements: list[tuple[str, Any]]) -> list[tuple[float, str]]:
    """Execution time (ms, median of 3 ``EXPLAIN ANALYZE``) of each statement."""
    out = []
    async with engine.connect() as conn:
        for statement, params in statements:
            times = []
            for _ in range(3):
                plan = (
                    await conn.exec_driver_sql(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params
                    )
                ).scalar()
                if isinstance(plan, str):
                    import json

                    plan = json.loads(plan)
                times.append(float(plan[0]["Execution Time"]))
            out.append((statistics.median(times), " ".join(statement.split())[:160]))
        await conn.rollback()
    return out


async def run(
    url: str,
    rows: int,
    runs: int,
    *,
    redis_url: str | None,
    only: str | None,
    plans: bool,
    seeding: bool = True,
) -> list[dict[str, Any]]:
    if seeding:
        print(await seed(url, rows))
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=url,
        api_token=TOKEN,
        redis_url=redis_url,
        redis_prefix=f"benchdash{os.getpid()}",
    )
    engine = create_engine(url)
    from cryptography.fernet import Fernet

    redis = None
    if redis_url:
        try:
            redis = await connect_redis(settings)
        except Exception as exc:  # workers/state then answers 503 and is left out
            print(f"redis: {type(exc).__name__}: {exc}")
    services = Services(
        settings=settings,
        engine=engine,
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(Fernet.generate_key()),
        registry=SkillRegistry(),
        redis=redis,
    )
    app = create_app(settings, services=services)
    capture = Capture(engine)
    loads: list[float] = []
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=120.0,
    ) as http:
        cases = await _cases(http, engine)
        if redis is None:
            cases = [c for c in cases if c[2] != "/api/v1/workers/state"]
        if only:
            cases = [c for c in cases if only in c[0] or c[0].startswith("comparator")]

        async def call(case: Case) -> float:
            _, method, path, body = case
            t0 = time.perf_counter()
            resp = await (http.get(path) if method == "GET" else http.post(path, json=body))
            took = (time.perf_counter() - t0) * 1000
            assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
            return took

        first: dict[str, float] = {}
        for case in cases:  # the first answer: caches empty (what a cold page pays)
            first[case[0]] = await call(case)
        for _ in range(2):  # warm up (connections, plans)
            for case in cases:
                await call(case)
        times: dict[str, list[float]] = {c[0]: [] for c in cases}
        rng = random.Random(7)
        for _ in range(runs):
            order = list(cases)
            rng.shuffle(order)
            for case in order:
                times[case[0]].append(await call(case))
            loads.append(os.getloadavg()[0])
        explained: dict[str, list[tuple[float, str]]] = {}
        if plans:
            for case in cases:
                capture.seen.clear()
                _expire(app)
                capture.on = True
                await call(case)
                capture.on = False
                explained[case[0]] = await explain(engine, list(capture.seen))
    out = []
    for case in cases:
        name = case[0]
        ts = times[name]
        ex = explained.get(name, [])
        out.append(
            {
                "case": name,
                "first": first[name],
                "p50": statistics.median(ts),
                "p95": p95(ts),
                "max": max(ts),
                "sql_ms": sum(t for t, _ in ex),
                "slowest": max(ex, default=(0.0, "")),
            }
        )
    if redis is not None:
        await redis.aclose()
    await services.http.aclose()
    await engine.dispose()
    print(f"load average during the timed rounds: {min(loads):.1f}-{max(loads):.1f}")
    return out


def _expire(app: Any) -> None:
    """Forget every shared answer, so the next request runs its SQL."""
    for name in ("aggregates",):
        cache = getattr(app.state, name, None)
        if cache is not None:
            cache.values.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=40, help="timed rounds (each case once)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="'' for none")
    parser.add_argument("--only", help="cases whose name contains this (and the comparator)")
    parser.add_argument("--no-explain", action="store_true")
    parser.add_argument("--no-seed", action="store_true", help="time the database as it is")
    args = parser.parse_args()
    rows = asyncio.run(
        run(
            args.url,
            args.rows,
            args.runs,
            redis_url=args.redis or None,
            only=args.only,
            plans=not args.no_explain,
            seeding=not args.no_seed,
        )
    )
    print()
    print(
        f"Python {platform.python_version()}, {args.rows:,} jobs, {args.runs} interleaved rounds;"
        f" {os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.1f}"
    )
    print(
        "| case | first (cold) | p50 | p95 | max | SQL (EXPLAIN ANALYZE, sum) | slowest statement |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['first']:.1f} ms | {r['p50']:.1f} ms | {r['p95']:.1f} ms |"
            f" {r['max']:.1f} ms | {r['sql_ms']:.2f} ms | {r['slowest'][0]:.2f} ms |"
        )
    print("\nslowest statement per case (EXPLAIN ANALYZE execution time):")
    for r in rows:
        if r["slowest"][1]:
            print(f"  {r['case']}: {r['slowest'][0]:.2f} ms  {r['slowest'][1]}")


if __name__ == "__main__":
    main()
