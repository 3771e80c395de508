"""What an index on ``jobs`` costs the worker's hot path, measured in PostgreSQL itself.

Run: ``.venv/bin/python -m bench.index_cost [--url URL] [--jobs 2000] [--reps 3]``.
A scratch copy of the ``jobs`` table's shape and indexes (``jobs_write_cost``, in the
bench database, dropped at the end) takes the life of ``--jobs`` jobs, one transaction per
step as the dispatcher and worker write them: insert (queued), claim (running), finish
(succeeded, or failed for ``--failed`` of them). Reps alternate without and with the
index under test; each reports the PostgreSQL backend's CPU time per job (from
``/proc/<backend pid>/stat``: the server's own work, far less sensitive to the host's load
than wall time) and the wall time per job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

import asyncpg

from bench.seed_jobs import DEFAULT_URL, dsn

CANDIDATES = {
    "partial": (
        "CREATE INDEX ix_wc_failures_skill ON jobs_write_cost (skill, status, created_at)"
        " WHERE status IN ('failed', 'timed_out')"
    ),
    "full": "CREATE INDEX ix_wc_failures_skill ON jobs_write_cost (skill, status, created_at)",
    "partial_created": (
        "CREATE INDEX ix_wc_failures_skill ON jobs_write_cost (created_at)"
        " WHERE status IN ('failed', 'timed_out')"
    ),
}
TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def one_rep(conn: asyncpg.Connection, pid: int, n: int, failed: float) -> tuple[float, float]:
    await conn.execute("TRUNCATE jobs_write_cost")
    ids = [uuid.uuid4().hex for _ in range(n)]
    cpu0, t0 = backend_cpu(pid), time.perf_counter()
    for i, job_id in enumerate(ids):
        now = time.time()
        await conn.execute(
            "INSERT INTO jobs_write_cost (id, skill, status, attempts, input, context, fetches,"
            " wall_sec, channel, session_id, external_id, actor_key, role_id, org_id,"
            " lease_token, cancel_requested, created_at, queued_at, updated_at, priority)"
            " VALUES ($1, $2, 'queued', 0, '{}', '{}', '[]', 600, 'telegram', 's1', '', 'u1',"
            " 'r1', 'o1', 0, false, $3, $3, $3, 5)",
            job_id, f"skill{i % 12}", now,
        )  # fmt: skip
    for job_id in ids:
        await conn.execute(
            "UPDATE jobs_write_cost SET status='running', attempts=attempts+1, started_at=$2,"
            " lease_token=lease_token+1, updated_at=$2 WHERE id=$1",
            job_id, time.time(),
        )  # fmt: skip
    for i, job_id in enumerate(ids):
        status = "failed" if i < n * failed else "succeeded"
        await conn.execute(
            "UPDATE jobs_write_cost SET status=$2, finished_at=$3, duration_ms=5, updated_at=$3,"
            " result='{}' WHERE id=$1",
            job_id, status, time.time(),
        )  # fmt: skip
    wall = time.perf_counter() - t0
    return (backend_cpu(pid) - cpu0) / n * 1e6, wall / n * 1e6


async def run(url: str, n: int, reps: int, failed: float, which: str) -> None:
    conn = await asyncpg.connect(dsn(url))
    try:
        await conn.execute("DROP TABLE IF EXISTS jobs_write_cost")
        await conn.execute(
            "CREATE TABLE jobs_write_cost (LIKE jobs INCLUDING DEFAULTS INCLUDING INDEXES)"
        )
        await conn.execute("DROP INDEX IF EXISTS jobs_write_cost_skill_status_created_at_idx")
        # the copy of the index under test, if the source table has it, goes: reps add it
        for name in await conn.fetch(
            "SELECT indexname FROM pg_indexes WHERE tablename='jobs_write_cost'"
            " AND indexdef LIKE '%WHERE%failed%'"
        ):
            await conn.execute(f'DROP INDEX "{name[0]}"')
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        results: dict[str, list[tuple[float, float]]] = {"without": [], "with": []}
        for _ in range(reps):
            for side in ("without", "with"):
                await conn.execute("DROP INDEX IF EXISTS ix_wc_failures_skill")
                if side == "with":
                    await conn.execute(CANDIDATES[which])
                results[side].append(await one_rep(conn, pid, n, failed))
                load = os.getloadavg()[0]
                cpu, wall = results[side][-1]
                print(
                    f"{side:8s} backend CPU {cpu:7.1f} us/job  wall {wall:7.1f} us/job  load {load:.1f}"
                )
        for side, rs in results.items():
            cpus = [c for c, _ in rs]
            walls = [w for _, w in rs]
            print(
                f"{which} index {side}: backend CPU per job median {statistics.median(cpus):.1f} us"
                f" ({min(cpus):.1f}-{max(cpus):.1f}), wall median {statistics.median(walls):.1f} us"
            )
    finally:
        await conn.execute("DROP TABLE IF EXISTS jobs_write_cost")
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--failed", type=float, default=0.08, help="share of jobs that fail")
    parser.add_argument("--index", choices=sorted(CANDIDATES), default="partial")
    args = parser.parse_args()
    asyncio.run(run(args.url, args.jobs, args.reps, args.failed, args.index))


if __name__ == "__main__":
    main()
