"""Seed a PostgreSQL database with a realistic job history, fast (binary COPY via asyncpg).

Run: ``.venv/bin/python -m bench.seed_jobs [--url URL] [--rows 1000000] [--fresh]``.
Default URL: ``postgresql+asyncpg://postgres@127.0.0.1:5432/skilljobs_bench``; the database
is created (and migrated) when missing. ``--fresh`` empties it first.

Shape: 30 days of jobs, Zipf-like skill mix, a few hundred queued/running now, ~8 % failed
or timed out, ~2 % cancelled; one delivery per job for a fifth of them (some failed); a
few schedules with runs; four workers; 30 days of audit trail (~50,000 operator actions
and an hourly retention pass) and an incident per skill and error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from jobs.db import create_engine
from jobs.migrate import upgrade

DEFAULT_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/skilljobs_bench"
DAYS = 30
SKILLS = [
    "sales_report", "word_count", "csv_stats", "summarize", "translate", "cat_picture",
    "invoice_ocr", "crm_sync", "price_watch", "video_cut", "disk_usage", "notify",
]  # fmt: skip
CHANNELS = ["telegram", "feishu", "wecom", "dingtalk", "web"]
ERRORS = [
    "upstream API answered 503 Service Unavailable",
    "skill ran over 300 s and was stopped",
    "ConnectionError: connection reset by peer",
    "quota exceeded for this role",
    "input file is not a valid CSV",
]
JOB_COLUMNS = [
    "id", "skill", "status", "attempts", "input", "context", "result", "error", "error_type",
    "fetches", "wall_sec", "channel", "session_id", "external_id", "actor_key", "role_id",
    "org_id", "lease_token", "cancel_requested", "created_at", "queued_at", "started_at",
    "finished_at", "duration_ms", "updated_at",
]  # fmt: skip
DELIVERY_COLUMNS = [
    "ledger_key", "job_id", "recipient", "channel", "kind", "item", "status", "error", "tries",
    "created_at", "updated_at", "sent_at",
]  # fmt: skip
BATCH = 50_000


def dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def ensure_database(url: str) -> None:
    parsed = make_url(url)
    admin = dsn(parsed.set(database="postgres").render_as_string(hide_password=False))
    conn = await asyncpg.connect(admin)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname=$1", parsed.database)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{parsed.database}"')
    finally:
        await conn.close()
    engine = create_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


def job_rows(n: int, now: float, rng: random.Random) -> Any:
    weights = [1 / (i + 1) for i in range(len(SKILLS))]
    start = now - DAYS * 86400
    result = json.dumps({"ok": True, "message": "done"})
    empty = json.dumps({})
    fetches = json.dumps([])
    n_live = min(n, 300)
    for i in range(n):
        if i >= n - n_live:  # the newest few: still waiting or running
            created = now - rng.uniform(0, 600)
            status = "queued" if i % 4 else "running"
        else:
            created = start + (i / n) * (DAYS * 86400 - 600) + rng.uniform(0, 1)
            r = rng.random()
            status = (
                "succeeded" if r < 0.90 else "failed" if r < 0.96 else
                "timed_out" if r < 0.98 else "cancelled"
            )  # fmt: skip
        skill = rng.choices(SKILLS, weights)[0]
        channel = rng.choice(CHANNELS)
        role = f"r{rng.randrange(200)}"
        started = finished = duration = None
        if status in ("succeeded", "failed", "timed_out"):
            duration = min(rng.lognormvariate(7.6, 1.1), 1_800_000.0)
            started = created + rng.uniform(0.005, 2.0)
            finished = started + duration / 1000.0
        elif status == "cancelled":
            finished = created + rng.uniform(1, 60)
        elif status == "running":
            started = created + 0.5
        failed = status in ("failed", "timed_out")
        yield (
            uuid.UUID(int=rng.getrandbits(128)).hex,
            skill,
            status,
            1 if started else 0,
            empty,
            empty,
            None if status in ("queued", "running") else result,
            rng.choice(ERRORS) if failed else None,
            "transient" if failed else None,
            fetches,
            600.0,
            channel,
            f"s{rng.randrange(50_000)}",
            "",
            f"u{rng.randrange(100_000)}",
            role,
            f"o{rng.randrange(20)}",
            1,
            status == "cancelled",
            created,
            created,
            started,
            finished,
            duration,
            finished or created,
        )


async def seed(url: str, rows: int, *, fresh: bool = False) -> dict[str, Any]:
    await ensure_database(url)
    conn = await asyncpg.connect(dsn(url))
    try:
        if fresh:
            await conn.execute(
                "TRUNCATE jobs, job_attempts, artifacts, deliveries, chain_steps, chain_runs,"
                " schedules, workers, ops_actions RESTART IDENTITY CASCADE"
            )
        have = await conn.fetchval("SELECT count(*) FROM jobs")
        audit = await _audit_and_incidents(conn, time.time(), random.Random(20261201))
        if have >= rows:
            if audit:
                await conn.execute("VACUUM ANALYZE")
            return {"jobs": have, "seeded": 0, "audit": audit, "seconds": 0.0}
        t0 = time.perf_counter()
        now = time.time()
        rng = random.Random(20261130)
        todo = rows - have
        batch: list[tuple[Any, ...]] = []
        deliveries: list[tuple[Any, ...]] = []
        for row in job_rows(todo, now, rng):
            batch.append(row)
            if row[2] in ("succeeded", "failed", "timed_out") and rng.random() < 0.2:
                ok = rng.random() < 0.93
                deliveries.append(
                    (
                        f"{row[0]}:text", row[0], f"{row[11]}:{row[14]}", row[11], "text", "",
                        "sent" if ok else "failed", None if ok else "403 bot was blocked",
                        1 if ok else 3, row[22], row[22], row[22] if ok else None,
                    )
                )  # fmt: skip
            if len(batch) >= BATCH:
                await conn.copy_records_to_table("jobs", records=batch, columns=JOB_COLUMNS)
                batch.clear()
        if batch:
            await conn.copy_records_to_table("jobs", records=batch, columns=JOB_COLUMNS)
        for i in range(0, len(deliveries), BATCH):
            await conn.copy_records_to_table(
                "deliveries", records=deliveries[i : i + BATCH], columns=DELIVERY_COLUMNS
            )
        if have == 0:
            await _schedules_and_workers(conn, now, rng)
        # what a table autovacuum keeps looks like: statistics and the visibility map
        await conn.execute("VACUUM ANALYZE")
        return {
            "jobs": rows,
            "seeded": todo,
            "deliveries": len(deliveries),
            "seconds": round(time.perf_counter() - t0, 1),
        }
    finally:
        await conn.close()


AUDIT_ACTIONS = ["retry", "cancel", "bulk.retry", "resend", "dismiss", "incident.ack", "pause"]


async def _audit_and_incidents(conn: asyncpg.Connection, now: float, rng: random.Random) -> int:
    """When the audit trail is empty: 30 days of operator actions (~50,000, one retention
    pass an hour among them) and one incident per skill and error."""
    if await conn.fetchval("SELECT count(*) FROM ops_actions"):
        return 0
    start = now - DAYS * 86400
    rows: list[tuple[Any, ...]] = []
    for i in range(50_000):
        at = start + i * (DAYS * 86400 / 50_000)
        action = rng.choice(AUDIT_ACTIONS)
        details = {"result": "ok"}
        rows.append((action, uuid.UUID(int=rng.getrandbits(128)).hex, "admin", details, at))
    for h in range(DAYS * 24):
        counts = {"jobs": rng.randrange(1000), "chain_runs": 2, "messages": 40, "files": 3}
        rows.append(("prune", "retention", "system", {**counts, "envs": 0}, start + h * 3600))
    rows.sort(key=lambda r: r[4])
    await conn.copy_records_to_table(
        "ops_actions",
        records=[(a, t, who, json.dumps(d), at) for a, t, who, d, at in rows],
        columns=["action", "target", "actor", "details", "created_at"],
    )
    incidents = [
        (uuid.uuid4().hex, f"sig-{skill}-{e}", skill, "transient", error, error,
         rng.randrange(1, 500), json.dumps([]), "open" if e % 2 else "acked",
         start + rng.uniform(0, 86400), now - rng.uniform(0, 86400 * 3), "")
        for skill in SKILLS
        for e, error in enumerate(ERRORS)
    ]  # fmt: skip
    await conn.copy_records_to_table(
        "incidents",
        records=incidents,
        columns=["id", "signature", "skill", "error_type", "pattern", "sample_error", "count",
                 "sample_job_ids", "status", "first_seen", "last_seen", "acked_by"],
    )  # fmt: skip
    return len(rows)


async def _schedules_and_workers(conn: asyncpg.Connection, now: float, rng: random.Random) -> None:
    for i in range(5):
        sid = uuid.uuid4().hex
        await conn.execute(
            "INSERT INTO schedules (id, name, cron, timezone, identity, steps, policy, enabled,"
            " next_fire_at, created_at, updated_at) VALUES ($1,$2,'0 9 * * *','UTC','{}',"
            "'[{\"id\":\"a\",\"skill\":\"sales_report\"}]','{}',true,$3,$4,$4)"
            " ON CONFLICT (name) DO NOTHING",
            sid, f"bench-{i}", now + 3600, now - 86400 * DAYS,
        )  # fmt: skip
        runs = [
            (uuid.uuid4().hex, sid, f"cron:{sid}:{d}", "cron", now - d * 86400,
             rng.choice(["succeeded", "succeeded", "stopped_empty", "failed"]),
             now - d * 86400, now - d * 86400 + 5, 0)
            for d in range(DAYS)
        ]  # fmt: skip
        await conn.copy_records_to_table(
            "chain_runs",
            records=runs,
            columns=["id", "schedule_id", "fire_key", "trigger", "fire_at", "status",
                     "created_at", "finished_at", "lease_token"],
        )  # fmt: skip
    for w in range(4):
        await conn.execute(
            "INSERT INTO workers (id, host, pid, started_at, last_heartbeat, running)"
            " VALUES ($1, 'bench', $2, $3, $4, '[]') ON CONFLICT (id) DO NOTHING",
            f"bench-w{w}", 1000 + w, now - 3600, now - (2 if w < 3 else 600),
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--fresh", action="store_true", help="empty the tables first")
    args = parser.parse_args()
    print(asyncio.run(seed(args.url, args.rows, fresh=args.fresh)))


if __name__ == "__main__":
    main()
