"""The front door under a chat platform's peak: ``POST /api/v1/dispatch`` over real HTTP.

    python -m bench.http_load [--reps 3] [--seconds 10] [--before REF] [--only pg,embedded]

Starts the servers (the worker draining the same jobs meanwhile) and loads them with ``wrk -t2 -c20`` (``apt-get install -y wrk``), for each backend:

- ``pg``: ``skilljobs web`` + ``skilljobs worker`` on PostgreSQL
  (``SKILLJOBS_BENCH_DATABASE_URL``, a fresh database per run) and Redis
  (``SKILLJOBS_BENCH_REDIS_URL``, a fresh key prefix per run);
- ``embedded``: ``skilljobs up``, the embedded default (SQLite in the data directory,
  bundled Redis; the web app in the process, its worker a child process of its own).

``--pause-ms N`` adds a paced background run after the maximum one: each connection waits
N ms after an answer (wrk's ``delay()``), so the rate sits below the maximum (N = 7 gives
about 2,000/s at 20 connections where a receipt takes ~3 ms) and the latency is that of a
front door with headroom, not of a saturated host.

Per run: ``GET /healthz`` (the HTTP floor), background dispatches of the no-op skill from an
``orgdeleg:`` session (recorded, enqueued, run by the worker meanwhile) and sync dispatches
of the bundled ``echo`` (the executor processes of the web app). Afterwards it counts the
job rows against the 202 receipts (every receipt must have its row) and greps the server's
log for "database is locked". The CPU of the web process and of the worker process during
the background load is reported as a share of one core.

``--before REF`` also runs the tree of commit ``REF`` (``git archive``) with the same
interpreter, interleaved with the working tree run by run, as the comparator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from bench.common import PG, REDIS

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0123456789abcdef0123456789"
KEY = "t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
BACKGROUND = {
    "skill": "noop",
    "input": {},
    "context": {"channel": "web", "role_id": "bench", "session_id": "bench-session"},
    "external_id": "orgdeleg:bench",
}
SYNC = {
    "skill": "echo",
    "input": {"text": "hello", "n": 3},
    "context": {"channel": "web", "session_id": "bench", "actor_name": "bench"},
}
UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def wrk(
    url: str, seconds: int, body: dict[str, Any] | None, tmp: Path, pause_ms: int = 0
) -> dict[str, float]:
    """One ``wrk -t2 -c20`` run: requests/s, latency percentiles (ms), errors.
    ``pause_ms``: each connection waits that long after an answer before its next request
    (wrk's ``delay()``), so the load is below the server's maximum."""
    cmd = ["wrk", "-t2", "-c20", f"-d{seconds}s", "--latency"]
    if body is not None:
        script = tmp / "post.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            f"wrk.body = {json.dumps(json.dumps(body))}\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = "Bearer {TOKEN}"\n'
            + (f"function delay() return {pause_ms} end\n" if pause_ms else "")
        )
        cmd += ["-s", str(script)]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    res: dict[str, float] = {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "requests": float(re.search(r"(\d+) requests in", out).group(1)),  # type: ignore[union-attr]
        "non2xx": 0.0,
        "sock_err": 0.0,
    }
    lat = re.search(r"Latency\s+(\S+)\s+(\S+)\s+(\S+)", out)
    if lat:
        res["mean"], res["max"] = ms(lat.group(1)), ms(lat.group(3))
    for p in ("50", "90", "99"):
        m = re.search(rf"^\s+{p}%\s+(\S+)\s*$", out, re.M)
        if m:
            res[f"p{p}"] = ms(m.group(1))
    if m := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out):
        res["non2xx"] = float(m.group(1))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        res["sock_err"] = float(sum(int(g) for g in m.groups()))
    return res


async def _pg_db(action: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(make_url(PG).set(drivername="postgresql").render_as_string(False))
    try:
        if action == "create":
            await conn.execute(f'CREATE DATABASE "{name}"')
        else:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def _pg_count(url: str) -> tuple[int, int]:
    import asyncpg

    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    try:
        total = await conn.fetchval("SELECT count(*) FROM jobs WHERE skill = 'noop'")
        done = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE skill = 'noop' AND status = 'succeeded'"
        )
    finally:
        await conn.close()
    return int(total), int(done)


async def _migrate(url: str) -> None:
    from jobs.db import create_engine
    from jobs.migrate import upgrade

    engine = create_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


def _cpu(pid: int) -> float:
    """CPU seconds used by process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _worker_child(pid: int) -> int:
    """The ``skilljobs worker`` child of ``skilljobs up`` (process ``pid``); ``pid`` itself
    when there is none (a tree whose ``up`` runs the worker in its own process)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"worker" in argv:
            return int(stat.parent.name)
    return pid


def _sqlite_count(path: Path) -> tuple[int, int]:
    db = sqlite3.connect(path)
    try:
        total = db.execute("SELECT count(*) FROM jobs WHERE skill = 'noop'").fetchone()[0]
        done = db.execute(
            "SELECT count(*) FROM jobs WHERE skill = 'noop' AND status = 'succeeded'"
        ).fetchone()[0]
    finally:
        db.close()
    return int(total), int(done)


def one_run(tree: Path, backend: str, seconds: int, pause_ms: int = 0) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-http-"))
    port = free_port()
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "SKILLJOBS_DATA_DIR": str(tmp / "data"),
        "SKILLJOBS_SKILLS_PATH": f"bundled{os.pathsep}{ROOT / 'bench' / 'skills'}",
        "SKILLJOBS_API_TOKEN": TOKEN,
        "SKILLJOBS_SECRET_KEY": KEY,
        "SKILLJOBS_LOG_LEVEL": "WARNING",
    }
    for k in ("SKILLJOBS_DATABASE_URL", "SKILLJOBS_REDIS_URL"):
        env.pop(k, None)
    db_name = ""
    if backend == "pg":
        db_name = f"skilljobs_http_{uuid.uuid4().hex[:8]}"
        asyncio.run(_pg_db("create", db_name))
        env["SKILLJOBS_DATABASE_URL"] = make_url(PG).set(database=db_name).render_as_string(False)
        env["SKILLJOBS_REDIS_URL"] = REDIS
        env["SKILLJOBS_REDIS_PREFIX"] = prefix
        env["SKILLJOBS_QUEUE_NAME"] = f"{prefix}:queue"
    log_path = tmp / "server.log"
    # PostgreSQL: one web process and a worker process (the deployed shape); embedded:
    # `skilljobs up`, which starts its worker as a child process.
    commands = (
        [["web", "--port", str(port)], ["worker", "--no-scheduler"]]
        if backend == "pg"
        else [["up", "--port", str(port)]]
    )
    if backend == "pg":
        asyncio.run(_migrate(env["SKILLJOBS_DATABASE_URL"]))
    procs = []
    with log_path.open("wb") as log:
        for command in commands:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "jobs.cli.app", *command],
                    cwd=tree,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    proc = procs[0]
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"backend": backend, "tree": tree.name}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"server did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.3)
        url = base + "/api/v1/dispatch"
        wrk(url, 2, BACKGROUND, tmp)  # warm up: connections, caches, the worker
        wrk(url, 2, SYNC, tmp)
        out["healthz"] = wrk(base + "/healthz", seconds, None, tmp)
        out["sync"] = wrk(url, seconds, SYNC, tmp)  # before the worker has a backlog
        if pause_ms:  # paced first (no backlog yet): what a receipt costs with headroom
            out["paced"] = wrk(url, seconds, BACKGROUND, tmp, pause_ms)
            time.sleep(2)  # (the worker drains what it took)
        worker = procs[1].pid if len(procs) > 1 else _worker_child(proc.pid)
        cpu0, wcpu0, t0 = _cpu(proc.pid), _cpu(worker), time.monotonic()
        out["background"] = wrk(url, seconds, BACKGROUND, tmp)
        out["web_cpu"] = (_cpu(proc.pid) - cpu0) / (time.monotonic() - t0)
        out["worker_cpu"] = (_cpu(worker) - wcpu0) / (time.monotonic() - t0)
        time.sleep(1)
        if backend == "pg":
            total, done = asyncio.run(_pg_count(env["SKILLJOBS_DATABASE_URL"]))
        else:
            total, done = _sqlite_count(next((tmp / "data").glob("*.db")))
        out["rows"], out["drained"] = total, done
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        text = log_path.read_text(errors="replace")
        out["locked"] = text.count("database is locked")
        out["errors_logged"] = text.count("Traceback")
        if db_name:
            asyncio.run(_pg_db("drop", db_name))
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def checkout(ref: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def line(r: dict[str, Any]) -> str:
    def part(name: str) -> str:
        x = r[name]
        return (
            f"{name} {x['rps']:7.0f}/s p50 {x.get('p50', 0):6.1f} p99 {x.get('p99', 0):6.1f} "
            f"max {x.get('max', 0):7.1f} ms non2xx {x['non2xx']:.0f}"
        )

    paced = f" | {part('paced')}" if "paced" in r else ""
    return (
        f"{r['tree']:>8} {r['backend']:>8} | {part('healthz')} | {part('background')}{paced} | "
        f"{part('sync')} | web CPU {r['web_cpu']:.0%} worker {r['worker_cpu']:.0%} | rows {r['rows']} (drained {r['drained']}) locked {r['locked']} "
        f"tracebacks {r['errors_logged']}"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--before", help="a commit to run as the comparator, interleaved")
    ap.add_argument("--only", default="pg,embedded")
    ap.add_argument("--json", type=Path, help="append every run's figures here")
    ap.add_argument(
        "--pause-ms",
        type=int,
        default=0,
        help="also run the background load paced: each connection waits this long between "
        "requests (e.g. 7: about 2,000/s at 20 connections on a 2-vCPU host)",
    )
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install -y wrk")
        return 1
    work = Path(tempfile.mkdtemp(prefix="bench-trees-"))
    trees = [ROOT]
    if args.before:
        trees.insert(0, checkout(args.before, work / "before"))
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}, HEAD {commit}")
    try:
        for rep in range(args.reps):
            for backend in args.only.split(","):
                for tree in trees:
                    r = one_run(tree, backend, args.seconds, args.pause_ms)
                    r["tree"] = "before" if tree != ROOT else "after"
                    r["rep"] = rep
                    print(line(r), flush=True)
                    if args.json:
                        with args.json.open("a") as fh:
                            fh.write(json.dumps(r) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
