"""``/healthz`` latency of a real ``skilljobs web`` while CPU-bound skills run on the sync
line, with the executor pool (``SKILLJOBS_SYNC_PROCESSES=2``) and without it (``0``).

Run: ``.venv/bin/python -m bench.sync_line [--burns 3] [--seconds 2]``. Needs Redis
(``SKILLJOBS_BENCH_REDIS_URL``, default ``redis://127.0.0.1:6379/0``); the database is a
throw-away SQLite file. A thread dispatches ``cpu_burn`` (bench/skills: an async entry that
computes for N seconds without awaiting) back to back, while ``/healthz`` is polled every
20 ms (one kept-alive connection). Budget: p99 ≤ 50 ms with the pool.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from bench.common import REDIS, pct

TOKEN = "bench-token-0123456789abcdef0123456789"
SKILLS = Path(__file__).resolve().parent / "skills"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(processes: int, burns: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        env.update(
            {
                "SKILLJOBS_DATA_DIR": tmp,
                "SKILLJOBS_DATABASE_URL": f"sqlite+aiosqlite:///{tmp}/bench.db",
                "SKILLJOBS_REDIS_URL": REDIS,
                "SKILLJOBS_REDIS_PREFIX": prefix,
                "SKILLJOBS_QUEUE_NAME": f"{prefix}:queue",
                "SKILLJOBS_API_TOKEN": TOKEN,
                "SKILLJOBS_SKILLS_PATH": f"bundled{os.pathsep}{SKILLS}",
                "SKILLJOBS_SYNC_PROCESSES": str(processes),
            }
        )
        cli = [sys.executable, "-m", "jobs.cli.app"]
        subprocess.run([*cli, "db", "upgrade"], env=env, cwd=tmp, check=True, capture_output=True)
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [*cli, "web", "--port", str(port)],
            env=env,
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(300):
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            auth = {"authorization": f"Bearer {TOKEN}"}
            body = {
                "skill": "cpu_burn",
                "input": {"seconds": seconds},
                "context": {"channel": "web"},
            }
            # warm-up (pool processes import and load the skills)
            httpx.post(
                base + "/api/v1/dispatch",
                json={**body, "input": {"seconds": 0.01}},
                headers=auth,
                timeout=60,
            ).raise_for_status()
            done = threading.Event()
            answers: list[int] = []

            def burn() -> None:
                for _ in range(burns):
                    r = httpx.post(base + "/api/v1/dispatch", json=body, headers=auth, timeout=120)
                    answers.append(r.status_code)
                done.set()

            worker = threading.Thread(target=burn)
            worker.start()
            took: list[float] = []
            with httpx.Client(base_url=base, timeout=30) as poll:  # one kept-alive connection
                while not done.is_set():
                    t0 = time.perf_counter()
                    poll.get("/healthz")
                    took.append((time.perf_counter() - t0) * 1000)
                    time.sleep(0.02)
            worker.join()
            assert answers == [200] * burns, answers
        finally:
            proc.terminate()
            proc.wait(20)
    return {"n": len(took), "p50": pct(took, 50), "p99": pct(took, 99), "max": max(took)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burns", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {args.burns} × cpu_burn {args.seconds} s")
    for processes in (0, 2):
        r = run(processes, args.burns, args.seconds)
        print(
            f"SKILLJOBS_SYNC_PROCESSES={processes}: /healthz n={r['n']:.0f} "
            f"p50 {r['p50']:.1f} ms · p99 {r['p99']:.1f} ms · max {r['max']:.1f} ms"
        )


if __name__ == "__main__":
    main()
