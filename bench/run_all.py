"""Run every benchmark in turn (``make bench``). Each prints its own results; the recorded
numbers, with machine and method, are in bench/RESULTS.md."""

from __future__ import annotations

import subprocess
import sys
import time

BENCHES = [
    "bench.offload",
    "bench.render",
    "bench.executor",
    "bench.envs",
    "bench.queue",
    "bench.materialize",
    "bench.web_delivery",
    "bench.scheduler",
    "bench.dashboard",
]


def main() -> int:
    failed = []
    for name in BENCHES:
        print(f"\n=== {name} ===", flush=True)
        t0 = time.monotonic()
        code = subprocess.call([sys.executable, "-m", name])
        print(f"=== {name}: exit {code} in {time.monotonic() - t0:.0f}s ===", flush=True)
        if code:
            failed.append(name)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
