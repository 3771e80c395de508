"""Idempotent dispatch: the receipt with an ``idempotency_key`` against the receipt without.

Run: ``.venv/bin/python -m bench.idempotency [--n 2000] [--reps 3]``.

Each repetition times ``n`` sequential background dispatches (Python API, PostgreSQL) of
three kinds, interleaved one by one so load changes hit all three alike: no key, a new key
each time (the key is recorded with the job), and a key already used (the stored receipt is
returned, no job is made). Printed: p50/p99 per kind and the p99 differences.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import delete

from bench.common import drop_db, make_db, pct
from bench.queue import CTX, EXT, settings_for
from jobs.models import DispatchKey, Job
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services


async def one_rep(svc: Services, n: int) -> dict[str, dict[str, float]]:
    d = Dispatcher(svc)
    replay_key = f"replay-{uuid.uuid4().hex}"
    first = await d.dispatch("noop", {}, CTX, EXT, idempotency_key=replay_key)
    lat: dict[str, list[float]] = {"no_key": [], "new_key": [], "replayed_key": []}
    for _ in range(n):
        for kind in lat:
            key = {"no_key": None, "new_key": uuid.uuid4().hex, "replayed_key": replay_key}[kind]
            t0 = time.perf_counter()
            res = await d.dispatch("noop", {}, CTX, EXT, idempotency_key=key)
            lat[kind].append((time.perf_counter() - t0) * 1000)
            assert res.status_code == 202, res.body
            if kind == "replayed_key":
                assert res.body["job_id"] == first.body["job_id"]
    # Only dispatched: drop them from Redis and the database before the next repetition.
    assert svc.redis is not None
    await svc.redis.delete(svc.settings.queue_name)
    async with svc.sessionmaker() as s:
        await s.execute(delete(DispatchKey))
        await s.execute(delete(Job).where(Job.status == "queued"))
        await s.commit()
    return {k: {"p50_ms": pct(v, 50), "p99_ms": pct(v, 99)} for k, v in lat.items()}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    url, name = await make_db()
    data = Path(tempfile.mkdtemp(prefix="skilljobs-bench-"))
    svc = await Services.open(settings_for(url, data, f"bench{uuid.uuid4().hex[:6]}"))
    out: dict[str, Any] = {"n": args.n, "reps": []}
    try:
        await one_rep(svc, 100)  # warm up
        for _ in range(args.reps):
            rep = await one_rep(svc, args.n)
            rep["p99_new_key_minus_no_key_ms"] = {
                "value": round(rep["new_key"]["p99_ms"] - rep["no_key"]["p99_ms"], 3)
            }
            out["reps"].append(rep)
    finally:
        await svc.close()
        await drop_db(name)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
