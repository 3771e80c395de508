"""Soak: a million no-op jobs through one worker process on PostgreSQL.

    python -m bench.soak [--jobs 1000000] [--baseline 10000] [--enqueuers 3] [--window 10]

Every job is dispatched through the real dispatch path (``Dispatcher.dispatch``, many
concurrent submits per process, batched by the intake: job row and session in one
statement per batch, one Redis round trip per batch) by ``--enqueuers`` processes, and
run by one ``skilljobs worker`` process (``--max-jobs 100``) through the whole pipeline:
claim with lease and attempt row, the skill, the web message with its ledger row and
receipt, the fenced finish.

1. **Baseline**: ``--baseline`` jobs queued, then drained by a fresh worker process: its
   rate and CPU per job with that many queued.
2. **Soak**: ``--jobs`` queued with no worker running, then one worker process drains them
   all. Every ``--window`` seconds: jobs left in the queue (``ZCARD``), the worker's RSS
   and CPU, Redis's RSS. The drain rate with the full queue (the first windows after the
   first 10,000 jobs) is compared with the baseline's, and the worker's RSS growth from
   the end of its warm-up (10,000 jobs) to the end is reported.

``--cost`` instead measures what one job costs the database and the processes, over an
in-process drain of ``--baseline`` jobs (CPU of the worker, of its PostgreSQL backends and
of Redis; statements, transactions, rows and WAL bytes of this database, the WAL read back
with ``pg_walinspect`` and filtered to this database's relations and transactions).

Uses its own database and its own redis-server (no persistence) on a free port, so the
shared Redis never holds the million entries. Needs PostgreSQL and a redis-server binary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import drop_db, make_db
from bench.queue import CTX, EXT, SKILLS, settings_for
from jobs.cli.embedded import EmbeddedRedis

MiB = 1024 * 1024
WORKER = (sys.executable, "-m", "jobs.cli.app", "worker", "--no-scheduler")
WARM = 10_000  # jobs a fresh worker runs before its RSS counts as the start of the curve


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _env(db_url: str, redis_url: str, data: Path, prefix: str) -> dict[str, str]:
    s = settings_for(db_url, data, prefix)
    return {
        **os.environ,
        "SKILLJOBS_DATABASE_URL": db_url,
        "SKILLJOBS_REDIS_URL": redis_url,
        "SKILLJOBS_DATA_DIR": str(data),
        "SKILLJOBS_SKILLS_PATH": str(SKILLS),
        "SKILLJOBS_REDIS_PREFIX": prefix,
        "SKILLJOBS_QUEUE_NAME": s.queue_name,
        "SKILLJOBS_SECRET_KEY": s.secret_key.get_secret_value() if s.secret_key else "",
        "SKILLJOBS_LOG_LEVEL": "WARNING",
    }


# --- enqueueing ----------------------------------------------------------------------------


async def dispatch_many(settings: Any, n: int, concurrency: int) -> dict[str, float]:
    """Dispatch ``n`` no-op jobs with ``concurrency`` callers at once: each one's receipt
    comes after its job is recorded and enqueued (the intake batches them)."""
    from jobs.queue.dispatcher import Dispatcher
    from jobs.services import Services

    svc = await Services.open(settings)
    d = Dispatcher(svc)
    left = n

    async def caller() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            res = await d.dispatch("noop", {}, CTX, EXT)
            if res.status_code != 202:
                raise RuntimeError(f"dispatch refused: {res.body}")

    t0, c0 = time.perf_counter(), time.process_time()
    try:
        await asyncio.gather(*(caller() for _ in range(min(concurrency, n))))
    finally:
        await svc.close()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"jobs": n, "dispatch_s": n / elapsed, "cpu_us_per_dispatch": cpu / n * 1e6}


def enqueue(env: dict[str, str], n: int, processes: int, concurrency: int) -> dict[str, float]:
    """Dispatch ``n`` jobs from ``processes`` processes at once (``--enqueue-child``)."""
    shares = [n // processes + (1 if i < n % processes else 0) for i in range(processes)]
    t0 = time.perf_counter()
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.soak",
                "--enqueue-child",
                str(k),
                "--concurrency",
                str(concurrency),
            ],
            env=env,
            stdout=subprocess.PIPE,
        )
        for k in shares
        if k
    ]
    outs = [json.loads(c.communicate()[0]) for c in children]
    if any(c.returncode for c in children):
        raise RuntimeError("an enqueueing process failed")
    elapsed = time.perf_counter() - t0
    return {
        "jobs": n,
        "processes": len(children),
        "seconds": elapsed,
        "dispatch_s": n / elapsed,
        "cpu_us_per_dispatch": sum(o["cpu_us_per_dispatch"] * o["jobs"] for o in outs) / n,
    }


# --- the worker and its samples ------------------------------------------------------------


class WorkerProcess:
    """One ``skilljobs worker`` process (no scheduler) of the soak."""

    def __init__(self, env: dict[str, str], max_jobs: int) -> None:
        self.proc = subprocess.Popen(
            [*WORKER, "--max-jobs", str(max_jobs)],
            env=env,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


async def watch(
    redis: Any,
    queue: str,
    total: int,
    worker: WorkerProcess,
    redis_pid: int,
    window: float,
) -> list[dict[str, float]]:
    """Samples every ``window`` s until the queue is empty: time, jobs taken from the queue,
    the worker's RSS and CPU, Redis's RSS."""
    pid = worker.proc.pid
    t0 = time.monotonic()
    samples: list[dict[str, float]] = []
    while True:
        left = int(await redis.zcard(queue))
        samples.append(
            {
                "t": time.monotonic() - t0,
                "taken": total - left,
                "rss": proc_rss(pid),
                "cpu": proc_cpu(pid),
                "redis_rss": proc_rss(redis_pid),
                "load": os.getloadavg()[0],
            }
        )
        if left == 0 or worker.proc.poll() is not None:
            return samples
        await asyncio.sleep(window)


def rate_between(samples: list[dict[str, float]], lo: float, hi: float) -> dict[str, float]:
    """Jobs/s and worker CPU per job between the first samples past ``lo`` and ``hi`` jobs."""
    a = next(s for s in samples if s["taken"] >= lo)
    b = next((s for s in samples if s["taken"] >= hi), samples[-1])
    jobs = b["taken"] - a["taken"]
    if jobs <= 0 or b["t"] <= a["t"]:
        return {"jobs_s": 0.0, "cpu_us_per_job": 0.0, "from": a["taken"], "to": b["taken"]}
    return {
        "jobs_s": jobs / (b["t"] - a["t"]),
        "cpu_us_per_job": (b["cpu"] - a["cpu"]) / jobs * 1e6,
        "from": a["taken"],
        "to": b["taken"],
        "load": (a["load"] + b["load"]) / 2,
    }


async def drained(sm: Any, n: int) -> int:
    from sqlalchemy import func, select

    from jobs.models import Job

    async with sm() as s:
        done = await s.scalar(
            select(func.count()).select_from(Job).where(Job.status == "succeeded")
        )
    if done < n:
        raise RuntimeError(f"only {done} of {n} jobs succeeded")
    return int(done)


async def run_phase(
    env: dict[str, str],
    svc: Any,
    n: int,
    args: argparse.Namespace,
    redis_pid: int,
) -> dict[str, Any]:
    """Enqueue ``n`` jobs (no worker running), then drain them with one worker process."""
    queued = enqueue(env, n, args.enqueuers, args.concurrency)
    before = int(await svc.redis.zcard(svc.settings.queue_name))
    worker = WorkerProcess(env, args.max_jobs)
    try:
        samples = await watch(
            svc.redis, svc.settings.queue_name, before, worker, redis_pid, args.window
        )
        # the last jobs taken are finishing; give them a moment before stopping the worker
        await asyncio.sleep(3)
        final = {"rss": proc_rss(worker.proc.pid), "cpu": proc_cpu(worker.proc.pid)}
    finally:
        worker.stop()
    return {"enqueue": queued, "queued": before, "samples": samples, "final": final}


def _mib(b: float) -> float:
    return round(b / MiB, 1)


def summary(base: dict[str, Any], soak: dict[str, Any], n: int) -> dict[str, Any]:
    bs, ss = base["samples"], soak["samples"]
    warm_jobs = min(WARM, n // 10)
    base_rate = rate_between(bs, 0, base["queued"])
    full = rate_between(ss, warm_jobs, warm_jobs + max(base["queued"], min(50_000, n // 5)))
    mid = rate_between(ss, n * 0.45, n * 0.55)
    end = rate_between(ss, n * 0.9, n)
    warm = next(s for s in ss if s["taken"] >= warm_jobs)
    middle = next(s for s in ss if s["taken"] >= n / 2)
    last = ss[-1]
    return {
        "baseline_rate": base_rate,
        "rate_full_queue": full,
        "rate_middle": mid,
        "rate_end": end,
        "full_vs_baseline": full["jobs_s"] / base_rate["jobs_s"] if base_rate["jobs_s"] else 0,
        "full_vs_baseline_cpu": (
            full["cpu_us_per_job"] / base_rate["cpu_us_per_job"]
            if base_rate["cpu_us_per_job"]
            else 0
        ),
        "rss_mib": {
            "first_sample": _mib(ss[0]["rss"]),
            "warm": _mib(warm["rss"]),
            "middle": _mib(middle["rss"]),
            "end": _mib(last["rss"]),
            "max": _mib(max(s["rss"] for s in ss)),
            "growth_after_warm": _mib(last["rss"] - warm["rss"]),
        },
        "redis_rss_mib": {"full": _mib(ss[0]["redis_rss"]), "end": _mib(last["redis_rss"])},
        "enqueue": soak["enqueue"],
        "drain_seconds": last["t"],
    }


# --- what a job costs ----------------------------------------------------------------------

_PG_COUNTERS = """SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted,
  tup_fetched, tup_returned, blks_hit, blks_read FROM pg_stat_database WHERE datname = $1"""

_BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"

# this database's WAL between two positions: records that touch its relations, and the
# commit records of the transactions that wrote them
_WAL = """WITH r AS (SELECT * FROM pg_get_wal_records_info($1, $2)),
mine AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE $3 AND xid <> 0)
SELECT
  coalesce(sum(record_length) FILTER (WHERE block_ref LIKE $3), 0) AS data_bytes,
  coalesce(sum(fpi_length) FILTER (WHERE block_ref LIKE $3), 0) AS fpi_bytes,
  coalesce(sum(record_length) FILTER (
    WHERE resource_manager = 'Transaction' AND xid IN (SELECT xid FROM mine)), 0)
    AS commit_bytes,
  count(*) FILTER (WHERE block_ref LIKE $3) AS records,
  coalesce(sum(record_length), 0) AS cluster_bytes
FROM r"""


def _backend_cpu(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            out[pid] = proc_cpu(pid)
        except OSError:
            pass
    return out


class Meter:
    """What a stretch of work cost: this process's CPU, Redis's, this database's backends',
    statements sent (asyncpg's query log), and this database's counters and WAL."""

    def __init__(self, admin: Any, name: str, db_oid: int, redis_pid: int) -> None:
        self.admin, self.name, self.db_oid, self.redis_pid = admin, name, db_oid, redis_pid
        self.statements = 0

    def count(self, _query: Any) -> None:
        self.statements += 1

    async def _backends(self) -> dict[int, float]:
        return _backend_cpu([r[0] for r in await self.admin.fetch(_BACKENDS, self.name)])

    async def start(self) -> None:
        await asyncio.sleep(11)  # backends report their counters at least every 10 s idle
        self.counters = dict(await self.admin.fetchrow(_PG_COUNTERS, self.name))
        self.lsn = await self.admin.fetchval("SELECT pg_current_wal_lsn()")
        self.backends = await self._backends()
        self.cpu, self.redis_cpu = time.process_time(), proc_cpu(self.redis_pid)
        self.statements, self.t0 = 0, time.perf_counter()

    async def stop(self, n: int) -> dict[str, float]:
        elapsed = time.perf_counter() - self.t0
        cpu = time.process_time() - self.cpu
        redis_cpu = proc_cpu(self.redis_pid) - self.redis_cpu
        sent = self.statements
        backends = await self._backends()
        pg_cpu = sum(c - self.backends.get(pid, 0.0) for pid, c in backends.items())
        lsn = await self.admin.fetchval("SELECT pg_current_wal_lsn()")
        await asyncio.sleep(11)
        after = dict(await self.admin.fetchrow(_PG_COUNTERS, self.name))
        d = {k: after[k] - self.counters[k] for k in after}
        wal = await self.admin.fetchrow(_WAL, self.lsn, lsn, f"%/{self.db_oid}/%")
        return {
            "jobs": n,
            "jobs_s": n / elapsed,
            "process_cpu_us_per_job": cpu / n * 1e6,
            "postgres_cpu_us_per_job": pg_cpu / n * 1e6,
            "redis_cpu_us_per_job": redis_cpu / n * 1e6,
            "statements_per_job": sent / n,
            "transactions_per_job": (d["xact_commit"] + d["xact_rollback"]) / n,
            "rows_inserted_per_job": d["tup_inserted"] / n,
            "rows_updated_per_job": d["tup_updated"] / n,
            "rows_deleted_per_job": d["tup_deleted"] / n,
            "wal_bytes_per_job": (wal["data_bytes"] + wal["commit_bytes"]) / n,
            "wal_full_page_bytes_per_job": wal["fpi_bytes"] / n,
            "wal_records_per_job": wal["records"] / n,
            "wal_cluster_bytes_per_job": wal["cluster_bytes"] / n,
        }


async def job_cost(
    db_url: str, name: str, settings: Any, n: int, redis_pid: int
) -> dict[str, dict[str, float]]:
    """Dispatch ``n`` no-op jobs, then drain them in this process (one worker, 100 at a
    time), and what each stretch cost per job (:class:`Meter`)."""
    import asyncpg
    from sqlalchemy import event
    from sqlalchemy.engine import make_url

    from jobs.queue.dispatcher import Dispatcher
    from jobs.queue.worker import build_worker
    from jobs.services import Services

    admin = await asyncpg.connect(
        make_url(db_url).set(drivername="postgresql").render_as_string(False)
    )
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    # a temporary slot (gone with this session) keeps the WAL until it is read back
    await admin.execute(
        "SELECT pg_create_physical_replication_slot($1, true, true)", f"{name}_cost"
    )
    db_oid = await admin.fetchval("SELECT oid FROM pg_database WHERE datname = $1", name)
    meter = Meter(admin, name, db_oid, redis_pid)
    svc = await Services.open(settings)

    @event.listens_for(svc.engine.sync_engine, "connect")
    def _log(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.driver_connection.add_query_logger(meter.count)

    await svc.engine.dispose()  # every pooled connection from now on is counted
    try:
        d = Dispatcher(svc)
        await meter.start()
        for i in range(0, n, 500):
            await asyncio.gather(
                *(d.dispatch("noop", {}, CTX, EXT) for _ in range(min(500, n - i)))
            )
        dispatch = await meter.stop(n)
        w = build_worker(svc, burst=True, handle_signals=False, scheduler=False, max_jobs=100)
        await meter.start()
        await w.async_run()
        drain = await meter.stop(n)
        await w.close()
    finally:
        await svc.close()
        await admin.close()
    return {"dispatch": dispatch, "drain": drain}


def start_pgbouncer(db_url: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A pgbouncer (transaction mode) in front of ``db_url``'s server on a free port, as
    the PgBouncer tests run it; the URL through it, flagged for skilljobs."""
    import socket

    from sqlalchemy.engine import make_url

    from jobs.cli.embedded import free_port

    url = make_url(db_url)
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="skilljobs-soak-pgbouncer-"))
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        f"[databases]\n{url.database} = host={url.host} port={url.port or 5432} "
        f"dbname={url.database} user={url.username}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
        "auth_type = any\npool_mode = transaction\n"
        "max_client_conn = 500\ndefault_pool_size = 20\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
        f"unix_socket_dir = {folder}\n"
    )
    cmd = ["pgbouncer", str(ini)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        shutil.chown(folder, "postgres")
        shutil.chown(ini, "postgres")
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    through = url.set(port=port).update_query_dict({"pgbouncer": "true"})
    return proc, through.render_as_string(False), folder


# --- main ----------------------------------------------------------------------------------


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--baseline", type=int, default=10_000)
    ap.add_argument("--enqueuers", type=int, default=3, help="dispatching processes")
    ap.add_argument("--concurrency", type=int, default=1000, help="callers per process")
    ap.add_argument("--max-jobs", type=int, default=100)
    ap.add_argument("--window", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--cost", action="store_true", help="what one job costs, then stop")
    ap.add_argument("--pgbouncer", action="store_true", help="--cost through a local pgbouncer")
    ap.add_argument("--enqueue-child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.enqueue_child:
        from jobs.settings import Settings

        child = Settings(_env_file=None)  # type: ignore[call-arg]
        print(json.dumps(await dispatch_many(child, args.enqueue_child, args.concurrency)))
        return
    data = Path(tempfile.mkdtemp(prefix="skilljobs-soak-"))
    redis = EmbeddedRedis(data / "redis", persist=False)
    redis_url = redis.start()
    assert redis.proc is not None
    db_url, name = await make_db()
    prefix = f"soak{uuid.uuid4().hex[:6]}"
    os.environ["SKILLJOBS_REDIS_URL"] = redis_url
    settings = settings_for(db_url, data, prefix)
    out: dict[str, Any] = {"host_cpus": os.cpu_count()}
    try:
        if args.cost and args.pgbouncer:
            bouncer, through, folder = start_pgbouncer(db_url)
            try:
                out["cost_pgbouncer"] = await job_cost(
                    db_url,
                    name,
                    settings_for(through, data, prefix),
                    args.baseline,
                    redis.proc.pid,
                )
            finally:
                bouncer.terminate()
                bouncer.wait(10)
                shutil.rmtree(folder, ignore_errors=True)
        elif args.cost:
            out["cost"] = await job_cost(db_url, name, settings, args.baseline, redis.proc.pid)
        else:
            from jobs.services import Services

            env = _env(db_url, redis_url, data, prefix)
            svc = await Services.open(settings)
            try:
                base = await run_phase(env, svc, args.baseline, args, redis.proc.pid)
                soak = await run_phase(env, svc, args.jobs, args, redis.proc.pid)
                await drained(svc.sessionmaker, args.baseline + args.jobs)
            finally:
                await svc.close()
            out["summary"] = summary(base, soak, args.jobs)
            out["samples"] = [
                {k: (_mib(v) if "rss" in k else round(v, 2)) for k, v in s.items()}
                for s in soak["samples"]
            ]
    finally:
        redis.stop()
        await drop_db(name)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
