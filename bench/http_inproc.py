"""The web process's own cost of a background dispatch, without the network or a worker.

    python -m bench.http_inproc [--n 3000] [--clients 20] [--sqlite] [--key] [--before REF]

``--clients`` concurrent callers send ``POST /api/v1/dispatch`` of the no-op skill from an
``orgdeleg:`` session with a role (configuration read, recorded, enqueued) straight into
the ASGI app (the guard, the dispatch lane, the dispatcher, the intake; no HTTP parser, no
socket), on a fresh PostgreSQL database (``SKILLJOBS_BENCH_DATABASE_URL``) and Redis
(``SKILLJOBS_BENCH_REDIS_URL``, a fresh key prefix), or with ``--sqlite`` on a SQLite file.
``--key`` gives every dispatch an idempotency key. Reports the process's CPU per dispatch
(``time.process_time``: every thread of this process, the app and the callers), the
receipts' p50/p99 and the intake's batches. Every receipt is checked to have its job row
and its queue entry.

``--before REF`` also runs the tree of commit ``REF`` (``git archive``; this script is
copied into it), interleaved run by run with the working tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0123456789abcdef0123456789"
KEY = "t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="


def _body(i: int, keyed: bool) -> bytes:
    body: dict[str, Any] = {
        "skill": "noop",
        "input": {},
        "context": {"channel": "web", "role_id": "bench", "session_id": "bench-session"},
        "external_id": "orgdeleg:bench",
    }
    if keyed:
        body["idempotency_key"] = f"bench-{uuid.uuid4().hex}-{i}"
    return json.dumps(body).encode()


async def _call(app: Any, body: bytes) -> tuple[int, bytes]:
    """One request into the ASGI app, as uvicorn would hand it over."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/v1/dispatch",
        "raw_path": b"/api/v1/dispatch",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "app": app,
        "state": {},
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


async def run(n: int, clients: int, sqlite: bool, keyed: bool) -> dict[str, Any]:
    from sqlalchemy import func, select

    from bench.common import REDIS, drop_db, make_db
    from dashboard.app import create_app
    from jobs.models import Job
    from jobs.services import Services
    from jobs.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="bench-inproc-"))
    db_name = ""
    if sqlite:
        from jobs.db import create_engine
        from jobs.migrate import upgrade

        url = f"sqlite+aiosqlite:///{tmp}/bench.db"
        engine = create_engine(url)
        await upgrade(engine)
        await engine.dispose()
    else:
        url, db_name = await make_db()
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=tmp,
        database_url=url,
        redis_url=REDIS,
        redis_prefix=prefix,
        queue_name=f"{prefix}:queue",
        api_token=TOKEN,
        secret_key=KEY,
        skills_path=f"bundled{os.pathsep}trusted={ROOT / 'bench' / 'skills'}",  # the harness's own
    )
    svc = await Services.open(settings)
    app = create_app(settings, services=svc)
    out: dict[str, Any] = {}
    try:
        for i in range(50):  # warm up: statements prepared, caches, pools
            status, answer = await _call(app, _body(i, keyed))
            assert status == 202, answer
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(_body(i, keyed))
        took: list[float] = []
        ids: list[str] = []

        async def client() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                t0 = time.perf_counter()
                status, answer = await _call(app, body)
                took.append((time.perf_counter() - t0) * 1000)
                assert status == 202, answer
                ids.append(json.loads(answer)["job_id"])

        from jobs.queue import intake

        batcher = intake.intake_of(svc).batcher
        flushes0, items0 = batcher.flushes, batcher.items
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        async with svc.sessionmaker() as s:
            rows = await s.scalar(select(func.count()).select_from(Job).where(Job.id.in_(ids)))
        queued = await svc.redis.zcard(settings.queue_name) if svc.redis is not None else -1
        took.sort()
        out = {
            "n": n,
            "rate": n / wall,
            "cpu_us": cpu / n * 1e6,
            "p50": statistics.median(took),
            "p99": took[min(len(took) - 1, round(0.99 * (len(took) - 1)))],
            "batch": (batcher.items - items0) / max(1, batcher.flushes - flushes0),
            "rows_ok": rows == n,
            "queued": queued,
        }
    finally:
        if svc.redis is not None:
            keys = [k async for k in svc.redis.scan_iter(match=f"{prefix}*", count=1000)]
            if keys:
                await svc.redis.delete(*keys)
        await svc.close()
        if db_name:
            await drop_db(db_name)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _child(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.http_inproc", "--child", "--n", str(args.n)]
    cmd += ["--clients", str(args.clients)]
    cmd += ["--sqlite"] if args.sqlite else []
    cmd += ["--key"] if args.key else []
    env = {**os.environ, "PYTHONPATH": str(tree), "SKILLJOBS_LOG_LEVEL": "WARNING"}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--sqlite", action="store_true")
    ap.add_argument("--key", action="store_true", help="an idempotency key on every dispatch")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before", help="a commit to run as the comparator, interleaved")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(run(args.n, args.clients, args.sqlite, args.key))))
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-trees-"))
    trees = [("after", ROOT)]
    if args.before:
        from bench.http_load import checkout

        before = checkout(args.before, work / "before")
        shutil.copy(Path(__file__), before / "bench" / "http_inproc.py")
        trees.insert(0, ("before", before))
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, {args.clients} clients")
    try:
        for rep in range(args.reps):
            for name, tree in trees:
                r = _child(tree, args)
                print(
                    f"rep {rep} {name:>6}: {r['rate']:6.0f}/s  CPU/dispatch {r['cpu_us']:5.0f} us"
                    f"  p50 {r['p50']:6.2f} p99 {r['p99']:6.2f} ms  batch {r['batch']:5.1f}"
                    f"  rows ok {r['rows_ok']} queued {r['queued']}"
                    f"  load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
