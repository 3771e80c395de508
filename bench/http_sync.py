"""The sync line end to end: one client, ``POST /api/v1/dispatch`` of the bundled ``echo``
against a real ``skilljobs web`` (its executor processes run the skill).

    python -m bench.http_sync [--calls 2000] [--reps 3] [--before REF]

A kept-alive connection (``http.client``, so the client costs little), sequential calls
after 200 warm-up calls; SQLite database, Redis from ``SKILLJOBS_BENCH_REDIS_URL`` with a
fresh key prefix. Reports p50/p99 and the web process's CPU per call. Budget (issue 20):
p50 ≤ 2 ms end to end. ``--before REF`` runs the tree of commit ``REF`` too (``git
archive``), interleaved.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import REDIS, pct
from bench.http_load import _cpu, checkout, free_port

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0123456789abcdef0123456789"
BODY = json.dumps(
    {
        "skill": "echo",
        "input": {"text": "hello", "n": 3},
        "context": {"channel": "web", "session_id": "bench", "actor_name": "bench"},
    }
)


def one_run(tree: Path, calls: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
    env.update(
        PYTHONPATH=str(tree),
        SKILLJOBS_DATA_DIR=str(tmp),
        SKILLJOBS_DATABASE_URL=f"sqlite+aiosqlite:///{tmp}/bench.db",
        SKILLJOBS_REDIS_URL=REDIS,
        SKILLJOBS_REDIS_PREFIX=prefix,
        SKILLJOBS_QUEUE_NAME=f"{prefix}:queue",
        SKILLJOBS_API_TOKEN=TOKEN,
        SKILLJOBS_LOG_LEVEL="WARNING",
    )
    cli = [sys.executable, "-m", "jobs.cli.app"]
    subprocess.run([*cli, "db", "upgrade"], env=env, cwd=tree, check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen(
        [*cli, "web", "--port", str(port)],
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    headers = {"content-type": "application/json", "authorization": f"Bearer {TOKEN}"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/healthz")
                if conn.getresponse().read() and True:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

        def call() -> None:
            conn.request("POST", "/api/v1/dispatch", BODY, headers)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200, body

        for _ in range(200):
            call()
        took = []
        cpu0 = _cpu(proc.pid)
        for _ in range(calls):
            t0 = time.perf_counter()
            call()
            took.append((time.perf_counter() - t0) * 1000)
        cpu = _cpu(proc.pid) - cpu0
        conn.close()
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "p50": pct(took, 50),
        "p99": pct(took, 99),
        "web_cpu_us": cpu / calls * 1e6,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before", help="a commit to run as the comparator, interleaved")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-trees-"))
    trees = [("after", ROOT)]
    if args.before:
        trees.insert(0, ("before", checkout(args.before, work / "before")))
    print(f"{os.cpu_count()} CPUs, {args.calls} sequential echo dispatches per run")
    try:
        for rep in range(args.reps):
            for name, tree in trees:
                r = one_run(tree, args.calls)
                print(
                    f"rep {rep} {name:>6}: p50 {r['p50']:.2f} ms p99 {r['p99']:.2f} ms "
                    f"web CPU/call {r['web_cpu_us']:.0f} us load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
