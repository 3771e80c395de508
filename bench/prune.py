"""Retention while draining: the no-op drain with a retention pass deleting a 1M-job
history at the same time, against the drain without it (same database, same table size).

Run: ``.venv/bin/python -m bench.prune [--history 1000000] [--jobs 8000] [--reps 3]``.

The history is 30 days of finished jobs (``bench.seed_jobs``); ``SKILLJOBS_RETENTION_DAYS``
is set to 1, so ~97 % of it is prunable. Each repetition measures the drain without
pruning, then with ``jobs.queue.prune.prune`` running in the worker's process (as in
production: the pruner runs inside the workers) from the first dispatch to the drain's
end. Repetitions alternate which comes first, so both see the same (shrinking) table; the pass is
interrupted when the drain ends, so every "with" run prunes. Also printed: rows deleted
during each drain and the pruner's rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text

from bench.common import drop_db, make_db
from bench.queue import ours_drain, settings_for
from bench.seed_jobs import seed
from jobs.models import Job
from jobs.queue import prune
from jobs.services import Services


async def _count(svc: Services) -> int:
    async with svc.sessionmaker() as s:
        return int(await s.scalar(select(func.count()).select_from(Job)) or 0)


async def drain_with_pruning(svc: Services, jobs: int) -> tuple[float, int, float]:
    """Drain rate, history rows deleted meanwhile, and the pruner's rows/s."""
    before = await _count(svc)
    t0 = time.perf_counter()
    task = asyncio.create_task(prune.prune(svc.sessionmaker, svc.settings, pause=0.05))
    try:
        rate = await ours_drain(svc, jobs, "noop", 100)
        assert not task.done(), "the retention pass ended before the drain: use a larger history"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    elapsed = time.perf_counter() - t0
    deleted = before + jobs - await _count(svc)
    return rate, deleted, deleted / elapsed


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--history", type=int, default=1_000_000)
    ap.add_argument("--jobs", type=int, default=8000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    url, name = await make_db()
    data = Path(tempfile.mkdtemp(prefix="skilljobs-bench-"))
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    settings = settings_for(url, data, prefix)
    settings.retention_days = 1
    svc = await Services.open(settings)
    out: dict[str, Any] = {"history": args.history, "jobs": args.jobs, "reps": []}
    try:
        out["seed"] = await seed(url, args.history)
        async with svc.sessionmaker() as s:  # the seeded "now" jobs belong to no worker here
            await s.execute(text("DELETE FROM jobs WHERE status IN ('queued', 'running')"))
            await s.commit()
        await ours_drain(svc, 1000, "noop", 100)  # warm up
        for rep in range(args.reps):
            # ABBA: the order alternates, so a drift of the host hits both alike
            if rep % 2 == 0:
                plain = await ours_drain(svc, args.jobs, "noop", 100)
                pruning, deleted, rate = await drain_with_pruning(svc, args.jobs)
            else:
                pruning, deleted, rate = await drain_with_pruning(svc, args.jobs)
                plain = await ours_drain(svc, args.jobs, "noop", 100)
            out["reps"].append(
                {
                    "no_pruning_jobs_s": round(plain),
                    "pruning_jobs_s": round(pruning),
                    "ratio": round(pruning / plain, 3),
                    "history_rows_deleted": deleted,
                    "prune_rows_s": round(rate),
                }
            )
        ratios = [r["ratio"] for r in out["reps"]]
        out["ratio_min_median_max"] = [min(ratios), statistics.median(ratios), max(ratios)]
        out["history_left"] = await _count(svc)
    finally:
        await svc.close()
        await drop_db(name)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
