"""The worker of ``skilljobs up``, as a child process of its own.

Web and worker in one event loop would share one core: every dispatch would wait behind
the worker's bursts and the other way round. ``up`` therefore runs ``skilljobs worker`` as
a child (same interpreter, environment and working directory; it finds the embedded
Redis through the URL file ``up`` writes) and supervises it: a worker that exits on its own
is started again after a short pause, and stopping ``up`` gives it SIGTERM and the grace
period (``SKILLJOBS_WORKER_GRACE_SEC``) before SIGKILL. The child is in a session of its
own (Ctrl-C in the terminal reaches ``up`` only, which forwards one SIGTERM) and is killed
by the kernel if ``up`` dies without stopping it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import sys
import time

log = logging.getLogger("skilljobs.up")

PR_SET_PDEATHSIG = 1
RESTART_PAUSE_S = (1.0, 30.0)  # first and longest pause before starting a worker again
HEALTHY_AFTER_S = 60.0  # a worker that ran this long restarts after the first pause again


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies, however it dies (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class WorkerProcess:
    """``skilljobs worker`` as a supervised child of this process."""

    def __init__(self, *, max_jobs: int = 0, grace_s: float = 30.0) -> None:
        self.argv = [sys.executable, "-m", "jobs.cli.app", "worker"]
        if max_jobs:
            self.argv += ["--max-jobs", str(max_jobs)]
        self.grace_s = grace_s
        self.proc: asyncio.subprocess.Process | None = None
        self._stopping = False

    async def _start(self) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self.argv, start_new_session=True, preexec_fn=_die_with_parent
        )

    async def run(self) -> None:
        """Keep a worker running until :meth:`stop`."""
        pause = RESTART_PAUSE_S[0]
        while not self._stopping:
            started = time.monotonic()
            self.proc = await self._start()
            code = await self.proc.wait()
            if self._stopping:
                return
            if time.monotonic() - started >= HEALTHY_AFTER_S:
                pause = RESTART_PAUSE_S[0]
            log.warning("the worker exited (code %s); starting it again in %.0f s", code, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RESTART_PAUSE_S[1])

    async def stop(self) -> int | None:
        """SIGTERM, up to the grace period (+15 s to hand jobs back), then SIGKILL; the
        worker's exit code (None when none was running)."""
        self._stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return None if proc is None else proc.returncode
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(self.grace_s + 15):
                return await proc.wait()
        except TimeoutError:
            log.warning("the worker did not stop within %.0f s: killing it", self.grace_s + 15)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return await proc.wait()
