"""Queue benchmarks: dispatch receipts, wake-up latency, drain throughput vs raw arq.

    python -m bench.queue [--jobs 20000] [--sleep-jobs 5000] [--peers [--reps 3]]

``--peers`` (needs the ``bench`` extra): SAQ, taskiq and streaQ drain the same jobs next to
raw arq and us, in interleaved repetitions (bench/peers.py); ``--only peers`` skips the rest,
``--shapes sleep100`` runs only the sleepers, ``--peer-libs saq`` only those peers,
``--no-ahead`` adds our drain with claim-ahead off (``SKILLJOBS_WORKER_PREFETCH_SEC=0``);
every library first drains ``--warmup`` jobs (500) of each shape, not counted.

``--sqlite`` runs everything on the embedded default instead: a SQLite file and the bundled
redis-server (persisted as ``skilljobs up`` runs it); raw arq then uses that Redis too.
``--only drain_traced`` compares the no-op drain with tracing off and on (needs the otel
extra). Needs PostgreSQL and Redis (SKILLJOBS_BENCH_DATABASE_URL / SKILLJOBS_BENCH_REDIS_URL,
defaults: the local services). Creates and drops its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arq import Worker
from arq.connections import RedisSettings, create_pool
from sqlalchemy import delete, func, select

from bench.common import REDIS, drop_db, make_db, pct
from bench.costs import Meter
from jobs import telemetry
from jobs.cli.embedded import EmbeddedRedis
from jobs.models import Job
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.worker import build_worker
from jobs.services import Services
from jobs.settings import Settings

SKILLS = Path(__file__).resolve().parent / "skills"
CTX = {"channel": "web", "role_id": "bench", "session_id": "bench-session"}
EXT = "orgdeleg:bench"  # background + delivered to the web session: the whole pipeline


def settings_for(db_url: str, data: Path, prefix: str) -> Settings:
    return Settings(
        _env_file=None,
        database_url=db_url,
        redis_url=os.environ.get("SKILLJOBS_REDIS_URL", REDIS),
        data_dir=data,  # type: ignore[call-arg]
        # the harness's own skills, trusted: this measures the queue, bench.sandbox the sandbox
        skills_path=f"trusted={SKILLS}",
        redis_prefix=prefix,
        queue_name=f"{prefix}:queue",
        secret_key="t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q=",
    )


async def bench_receipts(svc: Services, n: int = 2000) -> dict[str, float]:
    d = Dispatcher(svc)
    for _ in range(50):  # warm up connections
        await d.dispatch("noop", {}, CTX, EXT)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        res = await d.dispatch("noop", {}, CTX, EXT)
        lat.append((time.perf_counter() - t0) * 1000)
        assert res.status_code == 202
    # These jobs were only dispatched: drop them from Redis *and* the database, or the
    # reconciler would find them queued and run them during the later measurements.
    await svc.redis.delete(svc.settings.queue_name)
    async with svc.sessionmaker() as s:
        await s.execute(delete(Job).where(Job.status == "queued"))
        await s.commit()
    return {"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_wakeup(svc: Services, db_url: str, data: Path, n: int = 300) -> dict[str, float]:
    s = svc.settings
    env = {
        **os.environ,
        "SKILLJOBS_DATABASE_URL": db_url,
        "SKILLJOBS_REDIS_URL": os.environ.get("SKILLJOBS_REDIS_URL", REDIS),
        "SKILLJOBS_DATA_DIR": str(data),
        "SKILLJOBS_SKILLS_PATH": str(SKILLS),
        "SKILLJOBS_REDIS_PREFIX": s.redis_prefix,
        "SKILLJOBS_QUEUE_NAME": s.queue_name,
        "SKILLJOBS_SECRET_KEY": s.secret_key.get_secret_value(),
        "SKILLJOBS_LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(  # noqa: ASYNC220 - a plain child process we only signal
        [sys.executable, "-m", "jobs.cli.app", "worker", "--no-scheduler"], env=env
    )
    try:
        await asyncio.sleep(3)
        cpu0, t0 = _proc_cpu(proc.pid), time.monotonic()
        await asyncio.sleep(10)
        idle_cpu = (_proc_cpu(proc.pid) - cpu0) / (time.monotonic() - t0) * 100
        d = Dispatcher(svc)
        lat, lat_receipt = [], []
        for _ in range(n):
            t_enq = time.time()
            res = await d.dispatch("stamp", {}, CTX, EXT)
            t_receipt = time.time()
            job_id = res.body["job_id"]
            while True:
                async with svc.sessionmaker() as sess:
                    job = await sess.get(Job, job_id)
                if job.status == "succeeded":
                    break
                await asyncio.sleep(0.002)
            started = svc.box.unseal(job.result)["started"]
            lat.append((started - t_enq) * 1000)
            lat_receipt.append((started - t_receipt) * 1000)
            await asyncio.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait(30)
    # The enqueue happens inside dispatch, after the job row is committed: the true
    # enqueue → start latency lies between these two measures.
    return {
        "dispatch_start_to_skill_start": {"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)},
        "receipt_to_skill_start": {"p50_ms": pct(lat_receipt, 50), "p99_ms": pct(lat_receipt, 99)},
        "idle_cpu_pct": idle_cpu,
    }


async def _noop(ctx: dict, *args: object) -> None:
    return None


async def _sleep100(ctx: dict, *args: object) -> None:
    await asyncio.sleep(0.1)


class Drain(float):
    """A drain's rate (jobs/s, the float itself) and this process's CPU per job (µs): CPU
    time moves less with the load of a shared host than the wall clock does. ``costs``:
    what :class:`bench.costs.Meter` saw (when the drain was measured with one)."""

    cpu_us: float
    costs: dict[str, Any]

    def __new__(
        cls, rate: float, cpu_s: float, n: int, costs: dict[str, Any] | None = None
    ) -> Drain:
        self = super().__new__(cls, rate)
        self.cpu_us = cpu_s / n * 1e6
        self.costs = costs or {}
        return self


async def raw_arq_drain(n: int, fn: str, max_jobs: int, measure: bool = False) -> Drain:
    queue = f"bench-raw-{uuid.uuid4().hex[:6]}"
    redis = os.environ.get("SKILLJOBS_REDIS_URL", REDIS)
    pool = await create_pool(RedisSettings.from_dsn(redis), default_queue_name=queue)
    for i in range(0, n, 500):
        await asyncio.gather(
            *(pool.enqueue_job(fn, _queue_name=queue) for _ in range(min(500, n - i)))
        )
    w = Worker(
        [_noop, _sleep100],
        redis_pool=pool,
        queue_name=queue,
        burst=True,
        max_jobs=max_jobs,
        poll_delay=0.01,
        keep_result=0,
        handle_signals=False,
        log_results=False,
    )
    meter = Meter(None, pool) if measure else None
    if meter is not None:
        await meter.start()
    t0, c0 = time.perf_counter(), time.process_time()
    await w.async_run()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    costs = await meter.stop(n) if meter is not None else None
    await pool.delete(queue)
    await pool.aclose()
    return Drain(n / elapsed, cpu, n, costs)


#: the limits of the "drain with limits" measure: every job counts against two of them
LIMITS = {"org:*": 20, "actor:*": 20, "skill:other": 2}


async def ours_drain(
    svc: Services,
    n: int,
    skill: str,
    max_jobs: int,
    orgs: int = 0,
    measure: bool = False,
    limits: bool | None = None,
) -> Drain:
    """Dispatch ``n`` jobs, then drain them with one burst worker. ``orgs``: spread the jobs
    over that many organisations (and 10× as many actors), with ``LIMITS`` set unless
    ``limits`` is False. ``measure``: the CPU of each process and the database writes per
    job (:class:`bench.costs.Meter`)."""
    d = Dispatcher(svc)
    svc.settings.limits = LIMITS if (orgs if limits is None else limits) else {}

    def ctx(k: int) -> dict[str, str]:
        if not orgs:
            return CTX
        return {**CTX, "org_id": f"org{k % orgs}", "actor_key": f"u{k % (orgs * 10)}"}

    for i in range(0, n, 200):
        await asyncio.gather(
            *(d.dispatch(skill, {}, ctx(i + k), EXT) for k in range(min(200, n - i)))
        )
    w = build_worker(svc, burst=True, handle_signals=False, scheduler=False, max_jobs=max_jobs)
    # SQLite (--sqlite): no PostgreSQL counters, only the CPU of this process and of Redis
    pg = svc.engine if svc.engine.dialect.name == "postgresql" else None
    meter = Meter(pg, svc.redis) if measure else None
    if meter is not None:
        await meter.start()
    t0, c0 = time.perf_counter(), time.process_time()
    await w.async_run()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    costs = await meter.stop(n) if meter is not None else None
    await w.close()
    async with svc.sessionmaker() as sess:
        done = await sess.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.skill == skill, Job.status == "succeeded")
        )
    assert done >= n, f"only {done} of {n} succeeded"
    return Drain(n / elapsed, cpu, n, costs)


async def limits_drains(svc: Services, n: int, orgs: int, reps: int) -> dict[str, Any]:
    """What ``SKILLJOBS_LIMITS`` costs the no-op drain: the jobs spread over ``orgs``
    organisations with ``LIMITS`` set, against the same spread without limits (the budget's
    comparator: within 15 %) and against one organisation without limits (what the spread
    over fair-queuing lanes costs by itself). The order rotates each repetition; CPU per job
    of the worker, PostgreSQL and Redis (:class:`bench.costs.Meter`)."""
    kinds = {
        "limits": {"orgs": orgs, "limits": True},
        "no_limits": {"orgs": orgs, "limits": False},
        "one_org": {"orgs": 0},
    }
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        order = list(kinds)[rep % 3 :] + list(kinds)[: rep % 3]
        run: dict[str, Any] = {"order": order}
        for kind in order:
            d = await ours_drain(svc, n, "noop", 100, measure=True, **kinds[kind])
            run[kind] = {"jobs_s": round(d), "cpu_us_per_job": _rounded(d.costs["cpu_us_per_job"])}
        run["ratio"] = round(run["limits"]["jobs_s"] / run["no_limits"]["jobs_s"], 3)
        run["ratio_one_org"] = round(run["limits"]["jobs_s"] / run["one_org"]["jobs_s"], 3)
        print(
            f"rep {rep + 1}/{reps} limits: {run['limits']['jobs_s']} jobs/s, without"
            f" {run['no_limits']['jobs_s']} ({run['ratio']}), one org {run['one_org']['jobs_s']}"
            f" ({run['ratio_one_org']})",
            file=sys.stderr,
        )
        runs.append(run)
    spread = {
        key: [min(v), statistics.median(v), max(v)]
        for key in ("ratio", "ratio_one_org")
        for v in [[r[key] for r in runs]]
    }
    return {"reps": runs, "min_median_max": spread}


async def noop_drains(svc: Services, n: int, reps: int) -> dict[str, Any]:
    """``reps`` interleaved pairs (raw arq, then us) of the no-op drain, each measured with
    a :class:`bench.costs.Meter`: per rep the rates, their ratio and the costs per job; then
    the range of each figure over the reps."""
    runs = []
    for rep in range(reps):
        raw = await raw_arq_drain(n, "_noop", 100, measure=True)
        ours = await ours_drain(svc, n, "noop", 100, measure=True)
        run = {
            "raw_arq_jobs_s": round(raw),
            "ours_jobs_s": round(ours),
            "ratio": round(ours / raw, 3),
            "cpu_us_per_job": {
                "raw_arq": _rounded(raw.costs["cpu_us_per_job"]),
                "ours": _rounded(ours.costs["cpu_us_per_job"]),
            },
            "load_avg_1m": os.getloadavg()[0],
            "db_per_job": ours.costs.get("db_per_job"),
            "wal_per_job": _rounded(ours.costs.get("wal_per_job", {})),
        }
        cpu = run["cpu_us_per_job"]
        print(
            f"rep {rep + 1}/{reps} drain: raw arq {raw:.0f} jobs/s, ours {ours:.0f} "
            f"({ours / raw:.2f}x); CPU per job us raw arq {cpu['raw_arq']}, ours {cpu['ours']}",
            file=sys.stderr,
        )
        runs.append(run)

    def span(get: Callable[[dict[str, Any]], float]) -> list[float]:
        values = [get(r) for r in runs]
        return [round(min(values), 3), round(max(values), 3)]

    return {
        "reps": runs,
        "range": {
            "ratio": span(lambda r: r["ratio"]),
            "ours_worker_cpu_us": span(lambda r: r["cpu_us_per_job"]["ours"]["worker"]),
            "raw_arq_worker_cpu_us": span(lambda r: r["cpu_us_per_job"]["raw_arq"]["worker"]),
            "ours_total_cpu_us": span(lambda r: r["cpu_us_per_job"]["ours"]["total"]),
            "raw_arq_total_cpu_us": span(lambda r: r["cpu_us_per_job"]["raw_arq"]["total"]),
            "total_cpu_ratio": span(
                lambda r: (
                    r["cpu_us_per_job"]["ours"]["total"] / r["cpu_us_per_job"]["raw_arq"]["total"]
                )
            ),
        },
    }


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in d.items()}


async def traced_drains(svc: Services, n: int) -> dict[str, object]:
    """The no-op drain with tracing off, on (every span through the SDK's batch processor
    into an in-memory exporter), and off again: what tracing costs the worker."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    off = await ours_drain(svc, n, "noop", 100)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1_000_000))
    telemetry.use(provider)
    try:
        on = await ours_drain(svc, n, "noop", 100)
    finally:
        telemetry.disable()
        provider.shutdown()
    again = await ours_drain(svc, n, "noop", 100)
    return {
        "off_jobs_s": off,
        "on_jobs_s": on,
        "off_again_jobs_s": again,
        "on_vs_off_mean": on / ((off + again) / 2),
        "cpu_us_per_job": {"off": off.cpu_us, "on": on.cpu_us, "off_again": again.cpu_us},
        "spans_per_job": len(exporter.get_finished_spans()) / n,
    }


# --- several worker processes (``--workers 1,2,3``) -------------------------------------------


def _worker_env(svc: Services, db_url: str, data: Path) -> dict[str, str]:
    s = svc.settings
    return {
        **os.environ,
        "SKILLJOBS_DATABASE_URL": db_url,
        "SKILLJOBS_REDIS_URL": os.environ.get("SKILLJOBS_REDIS_URL", REDIS),
        "SKILLJOBS_DATA_DIR": str(data),
        "SKILLJOBS_SKILLS_PATH": str(SKILLS),
        "SKILLJOBS_REDIS_PREFIX": s.redis_prefix,
        "SKILLJOBS_QUEUE_NAME": s.queue_name,
        "SKILLJOBS_SECRET_KEY": s.secret_key.get_secret_value() if s.secret_key else "",
        "SKILLJOBS_LOG_LEVEL": "WARNING",
    }


def _burst_processes(args: list[str], env: dict[str, str], count: int, n: int) -> Drain:
    """``count`` processes of ``python -m bench.queue <args>`` draining ``n`` jobs at once;
    each reports the wall-clock instants around its own drain and its CPU (start-up and
    shut-down excluded). Rate: ``n`` over the first start to the last end."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.queue", *args], env=env, stdout=subprocess.PIPE
        )
        for _ in range(count)
    ]
    outs = [json.loads(p.communicate()[0]) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a worker process failed: {args}")
    span = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    return Drain(n / span, sum(o["cpu"] for o in outs), n)


async def _ready_at(at: float) -> None:
    """Sleep until the wall-clock instant ``at``: every process starts draining together."""
    await asyncio.sleep(max(0.0, at - time.time()))


async def workers_child(kind: str, queue: str, at: float) -> None:
    """One process of :func:`workers_curve`: ``ours`` (build_worker on the environment's
    settings) or ``arq`` (raw arq on ``queue``), in burst mode."""
    if kind == "arq":
        redis = os.environ.get("SKILLJOBS_REDIS_URL", REDIS)
        pool = await create_pool(RedisSettings.from_dsn(redis), default_queue_name=queue)
        w = Worker(
            [_noop], redis_pool=pool, queue_name=queue, burst=True, max_jobs=100,
            poll_delay=0.01, keep_result=0, handle_signals=False, log_results=False,
        )  # fmt: skip
        await _ready_at(at)
        t0, c0 = time.time(), time.process_time()
        await w.async_run()
        out = {"start": t0, "end": time.time(), "cpu": time.process_time() - c0}
        await pool.aclose()
    else:
        svc = await Services.open(Settings(_env_file=None))  # type: ignore[call-arg]
        w = build_worker(svc, burst=True, handle_signals=False, scheduler=False, max_jobs=100)
        await _ready_at(at)
        t0, c0 = time.time(), time.process_time()
        await w.async_run()
        out = {"start": t0, "end": time.time(), "cpu": time.process_time() - c0}
        await w.close()
        await svc.close()
    print(json.dumps(out))


async def workers_curve(
    svc: Services, db_url: str, data: Path, n: int, counts: list[int]
) -> dict[str, object]:
    """The no-op drain of ``n`` jobs by 1, 2, 3… worker processes (raw arq with as many
    processes on the same Redis first, for each count): jobs/s and CPU per job of the
    worker processes together."""
    env = _worker_env(svc, db_url, data)
    curve: dict[str, object] = {}
    for count in counts:
        queue = f"bench-raw-{uuid.uuid4().hex[:6]}"
        pool = await create_pool(
            RedisSettings.from_dsn(env["SKILLJOBS_REDIS_URL"]), default_queue_name=queue
        )
        for i in range(0, n, 500):
            await asyncio.gather(
                *(pool.enqueue_job("_noop", _queue_name=queue) for _ in range(min(500, n - i)))
            )
        await pool.aclose()
        at = str(time.time() + 8)  # the processes import and connect before that instant
        raw = _burst_processes(
            ["--workers-child", "arq", "--queue", queue, "--at", at], env, count, n
        )
        d = Dispatcher(svc)
        for i in range(0, n, 200):
            await asyncio.gather(
                *(d.dispatch("noop", {}, CTX, EXT) for _ in range(min(200, n - i)))
            )
        at = str(time.time() + 8)
        ours = _burst_processes(["--workers-child", "ours", "--at", at], env, count, n)
        curve[str(count)] = {
            "ours_jobs_s": ours,
            "raw_arq_jobs_s": raw,
            "ratio": ours / raw,
            "ours_cpu_us_per_job": ours.cpu_us,
            "raw_arq_cpu_us_per_job": raw.cpu_us,
            "load": os.getloadavg()[0],
        }
    return curve


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--sleep-jobs", type=int, default=5000)
    ap.add_argument("--only", default="")
    ap.add_argument("--orgs", type=int, default=100, help="organisations of drain_limits")
    ap.add_argument("--peers", action="store_true", help="SAQ, taskiq, streaQ in the same run")
    ap.add_argument(
        "--reps", type=int, default=0, help="interleaved repetitions (drain: 1, --peers: 3)"
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=500,
        help="--peers: jobs of each shape each library drains first, not counted (0: none)",
    )
    ap.add_argument("--shapes", default="noop,sleep100", help="--peers: which drains")
    ap.add_argument("--peer-libs", default="", help="--peers: these peers only (saq,taskiq)")
    ap.add_argument(
        "--no-ahead", action="store_true", help="--peers: ours with claim-ahead off too"
    )
    ap.add_argument(
        "--own-redis", action="store_true", help="a redis-server of its own (its CPU is ours)"
    )
    ap.add_argument("--sqlite", action="store_true", help="SQLite + bundled Redis")
    ap.add_argument("--workers", default="", help="worker processes of a drain each, e.g. 1,2,3")
    ap.add_argument("--workers-child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--queue", default="", help=argparse.SUPPRESS)
    ap.add_argument("--at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workers_child:
        await workers_child(args.workers_child, args.queue, args.at)
        return
    data = Path(tempfile.mkdtemp(prefix="skilljobs-bench-"))
    embedded = _embedded(data, persist=True) if args.sqlite else None
    if args.own_redis and embedded is None:
        embedded = _embedded(data, persist=False)
    db_url, name = (
        (f"sqlite+aiosqlite:///{data / 'skilljobs.db'}", "") if args.sqlite else await make_db()
    )
    if args.sqlite:
        await _migrate(db_url)
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    svc = await Services.open(settings_for(db_url, data, prefix))
    out: dict[str, object] = {}
    try:
        if not args.only or "receipt" in args.only:
            out["receipt"] = await bench_receipts(svc)
        if not args.only or "wake" in args.only:
            out["wakeup"] = await bench_wakeup(svc, db_url, data)
        if not args.only or "drain" in args.only.split(","):
            out["drain_noop"] = await noop_drains(svc, args.jobs, args.reps or 1)
        if "drain_limits" in args.only:  # not by default: ``--only drain_limits``
            out["drain_limits"] = await limits_drains(svc, args.jobs, args.orgs, args.reps or 1)
        if "drain_traced" in args.only:  # not by default: needs the otel extra
            out["drain_traced"] = await traced_drains(svc, args.jobs)
        if not args.only or "sleep" in args.only:
            raw = await raw_arq_drain(args.sleep_jobs, "_sleep100", 100)
            ours = await ours_drain(svc, args.sleep_jobs, "sleep100", 100)
            out["sleep100"] = {
                "raw_arq_jobs_s": raw,
                "ours_jobs_s": ours,
                "ours_pct_of_ideal": ours / 1000 * 100,
                "raw_pct_of_ideal": raw / 1000 * 100,
                "ratio": ours / raw,
            }
        if args.workers:  # ``--workers 1,2,3``: separate processes, timed between them
            counts = [int(c) for c in args.workers.split(",")]
            out["workers"] = await workers_curve(svc, db_url, data, args.jobs, counts)
        if args.peers:  # imported only when asked for: the peers are the bench extra
            from bench.peers import compare

            async def no_ahead(n: int, shape: str) -> Drain:
                svc.settings.worker_prefetch_sec, kept = 0.0, svc.settings.worker_prefetch_sec
                try:
                    return await ours_drain(svc, n, shape, 100)
                finally:
                    svc.settings.worker_prefetch_sec = kept

            out["peers"] = await compare(
                lambda n, shape: ours_drain(svc, n, shape, 100),
                lambda n, shape: raw_arq_drain(n, f"_{shape}", 100),
                args.jobs,
                args.sleep_jobs,
                args.reps or 3,
                shapes=tuple(args.shapes.split(",")),
                only=tuple(p for p in args.peer_libs.split(",") if p),
                variants={"skilljobs-no-ahead": no_ahead} if args.no_ahead else None,
                warmup=args.warmup,
            )
    finally:
        await svc.close()
        if embedded is not None:
            embedded.stop()
        else:
            await drop_db(name)
    print(json.dumps(out, indent=2))


def _embedded(data: Path, persist: bool) -> EmbeddedRedis:
    """The bundled redis-server (``persist``: as ``skilljobs up`` starts it); its URL in the
    environment."""
    redis = EmbeddedRedis(data / "redis", persist=persist)
    os.environ["SKILLJOBS_REDIS_URL"] = redis.start()
    return redis


async def _migrate(url: str) -> None:
    from jobs.db import create_engine
    from jobs.migrate import upgrade

    engine = create_engine(url)
    await upgrade(engine)
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
