"""Where the slot-time of a sleeper drain goes: ``python -m bench.sleepers``.

The drain of ``bench.queue`` (5,000 jobs of 100 ms, one burst worker, 100 slots, the whole
record and delivery) with a skill that notes when it ran (``sleep100_traced``), and a probe
task in the worker's event loop that sleeps 10 ms at a time. Ideal is 100 slots always
sleeping; what a drain loses against it, per repetition:

- ``lead_in_ms``: the worker's start to the first skill's start (its registration, the
  first claim); ``tail_ms``: the last skill's end to the worker's return (the last records);
- ``run_ms``: the mean of the skill's own 100 ms as it saw them (timer lateness included);
- ``gap_ms``: a skill's end to the next start anywhere in the worker (p50/p90);
- ``lateness_ms``: how late the probe's 10 ms timers fired while the drain ran (how busy
  the event loop is: a timer due during a burst of callbacks waits for its end);
- ``window_pct``: slot-time sleeping between the first start and the last end.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import spans
from bench.common import drop_db, make_db
from bench.queue import CTX, EXT, settings_for
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.worker import build_worker
from jobs.services import Services

SLOTS = 100


def _pct(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(len(values) * q))] * 1000, 2)


async def one_drain(svc: Services, n: int) -> dict[str, Any]:
    d = Dispatcher(svc)
    for i in range(0, n, 200):
        await asyncio.gather(
            *(d.dispatch("sleep100_traced", {}, CTX, EXT) for _ in range(min(200, n - i)))
        )
    spans.SPANS.clear()
    late: list[tuple[float, float]] = []

    async def probe() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            late.append((t, time.perf_counter() - t - 0.01))

    w = build_worker(svc, burst=True, handle_signals=False, scheduler=False, max_jobs=SLOTS)
    prober = asyncio.create_task(probe())
    t0 = time.perf_counter()
    await w.async_run()
    t1 = time.perf_counter()
    prober.cancel()
    await w.close()
    runs = list(spans.SPANS)
    assert len(runs) >= n, f"only {len(runs)} of {n} runs noted"
    starts, ends = sorted(s for s, _ in runs), sorted(e for _, e in runs)
    first, last = starts[0], ends[-1]
    gaps = []
    for e in ends[: -SLOTS * 2]:  # (the last rounds have no next start to wait for)
        i = bisect.bisect_left(starts, e)
        if i < len(starts):
            gaps.append(starts[i] - e)
    in_drain = [x for t, x in late if first <= t <= last]
    busy = sum(e - s for s, e in runs)
    return {
        "jobs_s": round(n / (t1 - t0)),
        "pct_of_ideal": round(n / (t1 - t0) / (SLOTS / 0.1) * 100, 1),
        "lead_in_ms": round((first - t0) * 1000, 1),
        "tail_ms": round((t1 - last) * 1000, 1),
        "run_ms": round(busy / len(runs) * 1000, 2),
        "gap_ms": {"p50": _pct(gaps, 0.5), "p90": _pct(gaps, 0.9)},
        "lateness_ms": {
            "mean": round(sum(in_drain) / max(1, len(in_drain)) * 1000, 2),
            "p50": _pct(in_drain, 0.5),
            "p99": _pct(in_drain, 0.99),
        },
        "window_pct": round(busy / (SLOTS * (last - first)) * 100, 1),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="skilljobs-bench-"))
    db_url, name = await make_db()
    svc = await Services.open(settings_for(db_url, data, f"bench{uuid.uuid4().hex[:6]}"))
    out = []
    try:
        for rep in range(args.reps):
            out.append(await one_drain(svc, args.jobs))
            print(f"rep {rep + 1}/{args.reps}: {json.dumps(out[-1])}", flush=True)
    finally:
        await svc.close()
        await drop_db(name)


if __name__ == "__main__":
    asyncio.run(main())
