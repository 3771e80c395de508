"""What the sandbox costs a run (issue budget: ≤ 15 ms p50 added per run).

One shell script (``echo`` a line, exit) started through ``jobs.execution.subproc`` three
ways, alternated so all see the same machine load:

* ``bare``: a plain subprocess (what a trusted skill gets);
* ``bwrap``: inside bubblewrap, no network (``SKILLJOBS_SANDBOX_NETWORK=none``);
* ``bwrap+net``: inside bubblewrap with slirp4netns (the default).

Measured: start to first line (from the call until the line is read, one run at a time)
and a burst of 100 runs started at once (their wall time).

    .venv/bin/python -m bench.sandbox [--runs 100] [--burst 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import pct
from jobs.execution import sandbox, subproc

SCRIPT = "#!/bin/sh\necho first\n"


async def first_line(mode: str, box: sandbox.Sandbox, net: sandbox.Sandbox, ws: str) -> float:
    """Seconds from the call until the first line is read (the process then ends)."""
    script = str(Path(ws) / "run.sh")
    argv = ["/bin/sh", script]
    env = {"PATH": "/usr/bin:/bin", "SKILL_WORKSPACE": ws}
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    using = {"bare": None, "bwrap": box, "bwrap+net": net}[mode]
    plan = sandbox.Plan(cwd=ws, ro=[], rw=[ws], network=mode == "bwrap+net")
    res = await subproc.run_process(
        argv, env=env, cwd=ws, timeout=30, sandbox=using, plan=plan if using else None
    )
    took = loop.time() - t0
    assert res.stdout.startswith(b"first"), (mode, res)
    return took


async def main(runs: int, burst: int) -> None:
    box = sandbox.Sandbox(network="none")
    net = sandbox.Sandbox()
    problem = net.problem()
    if problem:
        raise SystemExit(f"the sandbox cannot start here: {problem}")
    modes = ["bare", "bwrap", "bwrap+net"]
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as ws:
        (Path(ws) / "run.sh").write_text(SCRIPT)
        for mode in modes:  # warm-up
            await first_line(mode, box, net, ws)
        times: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(runs):
            for mode in modes:
                times[mode].append(await first_line(mode, box, net, ws))
        bursts: dict[str, float] = {}
        for mode in modes:
            t0 = time.perf_counter()
            await asyncio.gather(*(first_line(mode, box, net, ws) for _ in range(burst)))
            bursts[mode] = time.perf_counter() - t0
    print(f"host: {platform.platform()}, {os.cpu_count()} CPUs; {runs} runs each, alternated")
    print(f"| start | p50 ms | p90 ms | p99 ms | p50 added ms | burst of {burst} s | per run ms |")
    print("|---|---|---|---|---|---|---|")
    base = statistics.median(times["bare"])
    for mode in modes:
        t = times[mode]
        added = (statistics.median(t) - base) * 1000
        print(
            f"| {mode} | {statistics.median(t) * 1000:.1f} | {pct(t, 90) * 1000:.1f} | "
            f"{pct(t, 99) * 1000:.1f} | {added:+.1f} | {bursts[mode]:.2f} | "
            f"{bursts[mode] / burst * 1000:.1f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--burst", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.burst))
