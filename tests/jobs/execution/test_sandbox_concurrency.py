"""Sandboxed runs with network, many at once through the real subprocess path
(``jobs.execution.subproc.run_process`` under bubblewrap and slirp4netns): each run ends —
done, failed with its reason, or cancelled — and leaves no network helper or sandbox
behind, also when runs are cancelled while their network is being attached (a lease lost,
a worker paused past its heartbeat)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import time
from pathlib import Path

import pytest

from jobs.execution import sandbox, subproc

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        sandbox.Sandbox().problem() is not None, reason="no bubblewrap/slirp4netns here"
    ),
]

RUNS = 40
AT_ONCE = 20
# the sandboxed program: writes on the channel it was handed, then ends
PROGRAM = "import os, sys; os.write(int(sys.argv[1]), b'ok')"


def _children(name: str) -> list[int]:
    """Our live (not zombie) child processes called ``name``."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if comm == name and int(ppid) == me and state != "Z":
            found.append(int(entry))
    return found


async def _settled(deadline: float) -> tuple[list[int], list[int]]:
    """The helpers and sandboxes still alive once they had until ``deadline`` to go."""
    while True:
        slirps, bwraps = _children("slirp4netns"), _children("bwrap")
        if (not slirps and not bwraps) or time.monotonic() > deadline:
            return slirps, bwraps
        await asyncio.sleep(0.05)


async def test_concurrent_runs_all_end_and_leave_no_network_helper(tmp_path: Path) -> None:
    box = sandbox.Sandbox(network="slirp4netns")
    rng = random.Random(7)
    gate = asyncio.Semaphore(AT_ONCE)
    outcomes: list[str] = []

    async def one(i: int) -> None:
        parent, child = socket.socketpair()
        try:
            async with gate:
                run = asyncio.ensure_future(
                    subproc.run_process(
                        [sys.executable, "-I", "-c", PROGRAM, str(child.fileno())],
                        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                        cwd=str(tmp_path),
                        timeout=30,
                        sandbox=box,
                        plan=sandbox.Plan(cwd=str(tmp_path), rw=[str(tmp_path)]),
                        limits=box.limits.rlimits(),
                        pass_fds=(child.fileno(),),
                    )
                )
                if i % 2:  # every other run is cancelled while it starts (network attaching)
                    await asyncio.sleep(rng.uniform(0.0, 0.03))
                    run.cancel()
                try:
                    res = await run
                except asyncio.CancelledError:
                    outcomes.append("cancelled")
                    return
                except sandbox.SandboxUnavailable as exc:
                    outcomes.append(f"unavailable: {exc}")
                    return
            child.close()
            parent.settimeout(5)
            said = parent.recv(16)
            outcomes.append("ok" if res.returncode == 0 and said == b"ok" else f"bad: {res}")
        finally:
            child.close()
            parent.close()

    async with asyncio.timeout(60):  # (before the fix: runs stuck, helpers left running)
        await asyncio.gather(*(one(i) for i in range(RUNS)))
    slirps, bwraps = await _settled(time.monotonic() + 10)
    assert not slirps, f"{len(slirps)} slirp4netns helpers outlived their runs"
    assert not bwraps, f"{len(bwraps)} sandboxes outlived their runs"
    assert len(outcomes) == RUNS
    assert outcomes.count("ok") >= RUNS // 2, outcomes  # none of the uncancelled runs failed
    assert set(outcomes) <= {"ok", "cancelled"}, outcomes
