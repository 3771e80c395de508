"""Peer queues in the queue benchmark: SAQ, taskiq (Redis stream broker) and streaQ drained
next to raw arq and skilljobs in the same run (``python -m bench.queue --peers``).

Each driver enqueues ``n`` jobs of one shape (``noop``, or ``sleep100``: 100 ms of
``asyncio.sleep``), runs one worker with 100 concurrent jobs in this process until they are
all done, and returns jobs/s over the worker's run (the enqueue is not timed), with this
process's CPU per job. Each uses its own queue name / key prefix and deletes its keys
afterwards. The settings are each library's fastest sane ones, as ``SETTINGS`` says: results
are not kept (as raw arq's ``keep_result=0``), no per-job logging, acks and retries as the
library ships them. Needs the ``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from typing import Any

from bench.common import REDIS

SHAPES = ("noop", "sleep100")
CONCURRENCY = 100

#: what each peer runs with, printed with the results
SETTINGS = {
    "saq": "RedisQueue, Worker(concurrency=100, burst=True, dequeue_timeout=0.05), jobs "
    "ttl=-1 (deleted when done, no result kept)",
    "taskiq": "RedisStreamBroker (xread_count=100, acks), no result backend, "
    "Receiver(max_async_tasks=100, max_prefetch=0, ack when saved), stops after n tasks",
    "streaq": "Worker(concurrency=100, prefetch=default) in burst mode, "
    "coredis.Config.optimized=True, tasks ttl=0 (no result kept) silent=True",
}


class Rate(float):
    """Jobs/s of one drain (the float itself) and this process's CPU per job (µs)."""

    cpu_us: float

    def __new__(cls, n: int, elapsed: float, cpu_s: float) -> Rate:
        self = super().__new__(cls, n / elapsed)
        self.cpu_us = cpu_s / n * 1e6
        return self


def _tag(lib: str) -> str:
    """A fresh queue name: every key a driver writes contains it."""
    return f"bench-{lib}-{uuid.uuid4().hex[:8]}"


async def _delete_matching(redis_url: str, pattern: str) -> None:
    from redis import asyncio as aioredis

    r = aioredis.from_url(redis_url)
    try:
        keys = [k async for k in r.scan_iter(match=pattern, count=1000)]
        for i in range(0, len(keys), 1000):
            await r.delete(*keys[i : i + 1000])
    finally:
        await r.aclose()


class _Clock:
    """Wall and CPU time of the worker's run."""

    def __enter__(self) -> _Clock:
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.c0


# --- SAQ ---------------------------------------------------------------------------------


async def _saq_noop(ctx: Any) -> None:
    return None


async def _saq_sleep(ctx: Any) -> None:
    await asyncio.sleep(0.1)


async def saq_drain(n: int, shape: str, redis_url: str = REDIS, name: str = "") -> Rate:
    from saq import Queue, Worker

    name = name or _tag("saq")
    queue = Queue.from_url(redis_url, name=name)
    await queue.connect()
    try:
        for i in range(0, n, 500):
            await asyncio.gather(*(queue.enqueue(shape, ttl=-1) for _ in range(min(500, n - i))))
        worker = Worker(
            queue,
            [("noop", _saq_noop), ("sleep100", _saq_sleep)],
            concurrency=CONCURRENCY,
            burst=True,
            dequeue_timeout=0.05,
        )
        worker.SIGNALS = []  # the benchmark's own process: leave SIGINT/SIGTERM alone
        with _Clock() as clock:
            await worker.start()
        assert queue.complete == n, f"SAQ completed {queue.complete} of {n}"
    finally:
        await queue.disconnect()
        await _delete_matching(redis_url, f"saq:*{name}*")
    return Rate(n, clock.elapsed, clock.cpu)


# --- taskiq ------------------------------------------------------------------------------


async def _taskiq_noop() -> None:
    return None


async def _taskiq_sleep() -> None:
    await asyncio.sleep(0.1)


async def taskiq_drain(n: int, shape: str, redis_url: str = REDIS, name: str = "") -> Rate:
    from taskiq.receiver import Receiver
    from taskiq_redis import RedisStreamBroker

    name = name or _tag("taskiq")
    broker = RedisStreamBroker(redis_url, queue_name=name, consumer_group_name=name)
    tasks = {
        "noop": broker.register_task(_taskiq_noop, task_name="noop"),
        "sleep100": broker.register_task(_taskiq_sleep, task_name="sleep100"),
    }
    await broker.startup()  # creates the consumer group, so the jobs below are delivered
    try:
        for i in range(0, n, 500):
            await asyncio.gather(*(tasks[shape].kiq() for _ in range(min(500, n - i))))
        broker.is_worker_process = True
        receiver = Receiver(
            broker,
            max_async_tasks=CONCURRENCY,
            max_tasks_to_execute=n,
            run_startup=False,
        )
        with _Clock() as clock:
            await receiver.listen(asyncio.Event())
        await _check_acked(redis_url, name, n)
    finally:
        await broker.shutdown()
        await _delete_matching(redis_url, f"*{name}*")
    return Rate(n, clock.elapsed, clock.cpu)


async def _check_acked(redis_url: str, stream: str, n: int) -> None:
    """All ``n`` entries of the stream were read by the group and acknowledged."""
    from redis import asyncio as aioredis

    r = aioredis.from_url(redis_url)
    try:
        (group,) = await r.xinfo_groups(stream)
    finally:
        await r.aclose()
    read, pending = group.get("entries-read"), group["pending"]
    assert pending == 0 and read in (None, n), f"taskiq: {read} of {n} read, {pending} unacked"


# --- streaQ ------------------------------------------------------------------------------


def _streaq_worker(redis_url: str, name: str) -> tuple[Any, dict[str, Any]]:
    import coredis
    from streaq import Worker

    coredis.Config.optimized = True  # as streaQ's own benchmarks run it
    worker: Any = Worker(
        redis_url=redis_url, queue_name=name, concurrency=CONCURRENCY, handle_signals=False
    )

    @worker.task(name="noop", ttl=0, silent=True)
    async def noop() -> None:
        return None

    @worker.task(name="sleep100", ttl=0, silent=True)
    async def sleep100() -> None:
        await asyncio.sleep(0.1)

    return worker, {"noop": noop, "sleep100": sleep100}


async def streaq_drain(n: int, shape: str, redis_url: str = REDIS, name: str = "") -> Rate:
    name = name or _tag("streaq")
    producer, tasks = _streaq_worker(redis_url, name)
    try:
        async with producer:
            for i in range(0, n, 1000):
                await producer.enqueue_many(
                    [tasks[shape].enqueue() for _ in range(min(1000, n - i))]
                )
        worker, _ = _streaq_worker(redis_url, name)
        worker.burst = True
        with _Clock() as clock:
            await worker.run_async()
        assert worker.counters["completed"] == n, f"streaQ completed {worker.counters} of {n}"
    finally:
        await _delete_matching(redis_url, f"streaq:{name}*")
    return Rate(n, clock.elapsed, clock.cpu)


PEERS: dict[str, Callable[..., Awaitable[Rate]]] = {
    "saq": saq_drain,
    "taskiq": taskiq_drain,
    "streaq": streaq_drain,
}
#: the distributions whose versions go with the results
DISTS = ("arq", "redis", "saq", "taskiq", "taskiq-redis", "streaq", "coredis")


# --- the comparison ----------------------------------------------------------------------

#: ``(n, shape) -> jobs/s`` (a float carrying ``cpu_us``): skilljobs' and raw arq's drains
Drain = Callable[[int, str], Awaitable[float]]


async def compare(
    ours: Drain,
    raw: Drain,
    jobs: int,
    sleep_jobs: int,
    reps: int,
    *,
    shapes: tuple[str, ...] = SHAPES,
    only: tuple[str, ...] = (),
    variants: dict[str, Drain] | None = None,
    warmup: int = 0,
) -> dict[str, Any]:
    """``reps`` interleaved repetitions: in each, every library drains ``jobs`` no-ops and
    then ``sleep_jobs`` sleepers (``shapes``: one of them only), in an order rotated from
    one repetition to the next. The ratios us / them are taken per repetition and reported
    as min–max. ``only``: these peers only; ``variants``: more drains of ours (another
    setting), run and compared like the peers. ``warmup``: each library drains that many
    jobs of each shape first, not counted (the first drain of a process pays for imports,
    first connections and cold caches, whichever library it is)."""
    missing = [m for m in ("saq", "taskiq_redis", "streaq") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(
            f"--peers needs the bench extra (not installed: {', '.join(missing)}): "
            "pip install -e '.[bench]'"
        )
    peers = {k: v for k, v in PEERS.items() if not only or k in only}
    runners: dict[str, Drain] = {"skilljobs": ours, **(variants or {}), "arq": raw, **peers}
    libs = list(runners)
    rates: dict[str, dict[str, list[float]]] = {s: {lib: [] for lib in libs} for s in shapes}
    load = [os.getloadavg()[0]]
    for lib in libs if warmup > 0 else ():
        for shape in shapes:
            await runners[lib](warmup, shape)
    for rep in range(reps):
        order = libs[rep % len(libs) :] + libs[: rep % len(libs)]
        for shape, n in (("noop", jobs), ("sleep100", sleep_jobs)):
            if shape not in shapes:
                continue
            for lib in order:
                rate = await runners[lib](n, shape)
                rates[shape][lib].append(rate)
                load.append(os.getloadavg()[0])
                print(
                    f"rep {rep + 1}/{reps} {shape:8} {lib:9} {rate:8.0f} jobs/s "
                    f"{getattr(rate, 'cpu_us', 0):6.0f} µs CPU/job  load {load[-1]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    out: dict[str, Any] = {
        "reps": reps,
        "jobs": jobs,
        "sleep_jobs": sleep_jobs,
        "warmup_jobs": warmup,
        "concurrency": CONCURRENCY,
        "load_avg_1m": {"min": min(load), "max": max(load)},
        "versions": {d: version(d) for d in DISTS},
        "settings": SETTINGS,
    }
    for shape in shapes:
        per = rates[shape]
        section: dict[str, Any] = {
            "jobs_s": {lib: _span(v) for lib, v in per.items()},
            "cpu_us_per_job": {
                lib: _span([getattr(r, "cpu_us", 0.0) for r in v]) for lib, v in per.items()
            },
            "ratio_us_over": {
                lib: _span([u / t for u, t in zip(per["skilljobs"], v, strict=True)])
                for lib, v in per.items()
                if lib != "skilljobs"
            },
        }
        if shape == "sleep100":  # ideal: 100 concurrent × 10 jobs/s each
            section["pct_of_ideal"] = {
                lib: _span([r / (CONCURRENCY * 10) * 100 for r in v]) for lib, v in per.items()
            }
        out[shape] = section
    print(table(out), file=sys.stderr, flush=True)
    return out


def _span(values: list[float]) -> dict[str, Any]:
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "per_rep": [round(v, 3) for v in values],
    }


def table(out: dict[str, Any]) -> str:
    """The comparison as a Markdown table: min–max over the repetitions."""
    shapes = [s for s in SHAPES if s in out]
    libs = list(out[shapes[0]]["jobs_s"])

    def cell(span: dict[str, Any] | None, fmt: str) -> str:
        return "–" if span is None else f"{span['min']:{fmt}}–{span['max']:{fmt}}"

    rows = []
    if "noop" in out:
        rows += [
            ("no-op drain, jobs/s", out["noop"]["jobs_s"], ",.0f"),
            ("no-op, CPU µs/job (this process)", out["noop"]["cpu_us_per_job"], ",.0f"),
            ("no-op, ratio us / them (per rep)", out["noop"]["ratio_us_over"], ".2f"),
        ]
    if "sleep100" in out:
        rows += [
            ("100 ms sleepers, jobs/s", out["sleep100"]["jobs_s"], ",.0f"),
            ("sleepers, CPU µs/job (this process)", out["sleep100"]["cpu_us_per_job"], ",.0f"),
            ("sleepers, % of ideal", out["sleep100"]["pct_of_ideal"], ".0f"),
            ("sleepers, ratio us / them (per rep)", out["sleep100"]["ratio_us_over"], ".2f"),
        ]
    lines = ["| figure | " + " | ".join(libs) + " |", "|---" * (len(libs) + 1) + "|"]
    for label, spans, fmt in rows:
        lines.append(f"| {label} | " + " | ".join(cell(spans.get(lib), fmt) for lib in libs) + " |")
    return "\n".join(lines)
