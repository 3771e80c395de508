"""Finding the processes a test started."""

from __future__ import annotations

import os
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


# --- argv -----------------------------------------------------------------------------
