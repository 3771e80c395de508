"""Executor benchmark: in-process throughput and subprocess overhead.

1. An in-process no-op skill (``async def execute(...): return {"ok": True}``) through
   ``Executor.run`` — sequential calls on one core, with a minimal context and with a
   full chat-line context (fixed segment + configs); budget ≥ 10,000 calls/s.
2. A Python CLI skill (argparse + ``__main__``, prints JSON) through ``Executor.run``
   against a bare ``python script.py`` run of the same script with the same arguments,
   alternated so both see the same machine load; budget ≤ 25 % overhead.
3. The same no-op handler from an untrusted folder: it runs in the sandbox through the
   runner (one bubblewrap start and one interpreter start per run); median ms per run.

    .venv/bin/python -m bench.executor [--calls 50000] [--cli-runs 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobs.catalog.loader import load_registry
from jobs.context import background_context
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.execution.executor import Executor
from jobs.settings import Settings

KEY = b"t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="

NOOP = "async def execute(input_data, runtime_context):\n    return {'ok': True}\n"
CLI = """\
import argparse
import json

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--label", default="")
    a = p.parse_args()
    print(json.dumps({"ok": True, "n": a.n * 2, "label": a.label}))
"""


def make_skills(root: Path) -> None:
    for name, body in (("bench_noop", NOOP), ("bench_cli", CLI), ("bench_noop_box", NOOP)):
        d = root / name
        d.mkdir(parents=True)
        (d / "SKILL.md").write_text(f"---\nname: {name}\ndescription: benchmark skill\n---\n")
        (d / "handler.py").write_text(body)


def pin_one_core() -> str:
    try:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    except (AttributeError, OSError):
        return "not pinned"


async def in_process(ex: Executor, ctx: dict, calls: int) -> tuple[float, float]:
    """(calls/s by wall clock, calls/s by CPU time) for ``calls`` sequential runs."""
    skill = ex.registry.get("bench_noop")
    for _ in range(2000):
        await ex.run(skill, {}, ctx)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await ex.run(skill, {}, ctx)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return calls / wall, calls / cpu


async def cli_overhead(ex: Executor, runs: int) -> tuple[float, float, float]:
    """(median bare ms, median executor ms, overhead fraction)."""
    skill = ex.registry.get("bench_cli")
    assert skill is not None and skill.entry is not None
    script = str(skill.entry)
    argv = [sys.executable, script, "--n", "21", "--label", "x"]
    inp = {"n": 21, "label": "x"}
    ctx = {"role_id": "r1", "session_id": "bench"}
    r = await ex.run(skill, inp, ctx)
    assert r == {"ok": True, "n": 42, "label": "x"}, r
    bare, execd = [], []
    for _ in range(runs):
        t = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, check=True)  # noqa: ASYNC221 - the baseline
        bare.append(time.perf_counter() - t)
        assert b'"n": 42' in done.stdout
        t = time.perf_counter()
        await ex.run(skill, inp, ctx)
        execd.append(time.perf_counter() - t)
    b, e = statistics.median(bare), statistics.median(execd)
    return b * 1000, e * 1000, e / b - 1


async def sandboxed_noop(ex: Executor, runs: int) -> str:
    """Median and p90 ms of the no-op handler run by the sandbox runner."""
    skill = ex.registry.get("bench_noop_box")
    ctx = {"role_id": "r1", "session_id": "bench"}
    first = await ex.execute(skill, {}, ctx)
    if first.status != "succeeded":
        return f"not measured: {first.error}"
    took = []
    for _ in range(runs):
        t = time.perf_counter()
        await ex.run(skill, {}, ctx)
        took.append((time.perf_counter() - t) * 1000)
    took.sort()
    return f"{statistics.median(took):.1f} ms median, {took[int(len(took) * 0.9)]:.1f} ms p90"


async def main(calls: int, cli_runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_skills(root / "skills")
        # the in-process no-op is the operator's own (trusted): the worker's own path
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None,
            data_dir=root / "data",
            trusted_skills=str(root / "skills" / "bench_noop"),
        )
        engine = create_engine(f"sqlite+aiosqlite:///{root / 'bench.db'}")
        ex = Executor(
            settings=settings,
            registry=load_registry([root / "skills"]),
            sessionmaker=create_sessionmaker(engine),
            box=SecretBox(KEY),
        )
        minimal = {"role_id": "r1", "session_id": "s1"}
        full = background_context(
            {
                "role_id": "r1",
                "org_id": "o1",
                "session_id": "s1",
                "channel": "feishu",
                "actor_name": "Li Lei",
                "actor_key": "ou_1",
                "actor_tags": ["a", "b"],
                "raw_input": "run the report",
                "triggered_at": time.time(),
            },
            skill="bench_noop",
            configs={"region": "eu", "api_token": "tok-1234567890", "limit": 50},
        )
        print(f"Python {sys.version.split()[0]}, {pin_one_core()}, {calls:,} calls per case")
        for label, ctx in (("minimal context", minimal), ("full chat context", full)):
            wall_rate, cpu_rate = await in_process(ex, ctx, calls)
            print(
                f"in-process no-op, {label}: {wall_rate:,.0f} calls/s (wall), "
                f"{cpu_rate:,.0f} calls/s (CPU time), {1e6 / wall_rate:.1f} µs/call"
            )
        b, e, over = await cli_overhead(ex, cli_runs)
        print(
            f"python CLI skill, {cli_runs} alternated runs: bare python {b:.1f} ms, "
            f"through the executor {e:.1f} ms (median), overhead {over * 100:+.1f} %"
        )
        box_runs = max(10, cli_runs // 2)
        box = await sandboxed_noop(ex, box_runs)
        print(f"in-process no-op of an untrusted folder (sandboxed), {box_runs} runs: {box}")
        await ex.aclose()
        await engine.dispose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50_000)
    ap.add_argument("--cli-runs", type=int, default=60)
    a = ap.parse_args()
    asyncio.run(main(a.calls, a.cli_runs))
