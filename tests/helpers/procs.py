"""Finding the processes a test started."""

from __future__ import annotations

import asyncio
import os
import time
import uuid


def procs_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (the orphan check)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            found.append(int(pid))
    return found


def unique_sleep() -> str:
    """A sleep duration unique to this test, so its processes can be found in /proc."""
    return f"300.{uuid.uuid4().int % 10**9:09d}"


async def procs_gone(marker: str, limit: float = 15.0) -> list[int]:
    """Wait until no live process has ``marker`` in its command line (a SIGKILLed process
    needs CPU time of its own to exit: on a loaded host that is not at once); the pids still
    there at ``limit`` (so ``assert await procs_gone(m) == []`` names the leftovers)."""
    deadline = time.monotonic() + limit
    while True:
        left = procs_with(marker)
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.05)


async def procs_started(marker: str, n: int, limit: float = 30.0) -> list[int]:
    """Wait until at least ``n`` live processes have ``marker`` in their command line."""
    deadline = time.monotonic() + limit
    while True:
        found = procs_with(marker)
        if len(found) >= n or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


# --- argv -----------------------------------------------------------------------------
