"""The stall detector: a thread that watches the worker's event loop.

A blocked event loop stops everything at once — heartbeats, lease renewals, deliveries —
and from outside it looks like a dead worker. The loop stamps a tick every ``interval``;
a thread checks the stamp, and when the loop has been blocked longer than ``threshold``
it logs the stack of the code blocking it (once per stall) and counts the stall, so
"stopped heartbeating" has a cause. A block the thread could not see while it lasted
(the whole process was stopped, SIGSTOP or a frozen VM: the thread stops too, and the
loop may run first on resuming) is counted by the first tick after it, without a stack.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger("skilljobs.stall")


class StallWatch:
    """Watch one event loop from a daemon thread. ``stalls`` (blocks past the threshold)
    and ``max_lag`` (the longest block seen, seconds) are the metrics, written with the
    worker's heartbeat."""

    def __init__(
        self,
        threshold: float = 3.0,
        interval: float = 0.25,
        on_block: Callable[[float], None] | None = None,
    ) -> None:
        self.threshold = threshold
        self.interval = interval
        #: called on the loop with the block's length when a block past the threshold
        #: ends, before any code the block held up runs (see :meth:`_tick`)
        self.on_block = on_block
        self.stalls = 0
        self.max_lag = 0.0
        self._last = time.monotonic()
        self._reported = False  # the current block is counted already
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start watching the running loop (call from the loop's thread)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._last = time.monotonic()
        self._handle = self._loop.call_later(self.interval, self._tick)
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _tick(self) -> None:
        """On the loop: the block (if any) that delayed this tick is over.

        This tick's timer expired during the block, so it runs in the loop's first pass
        after it, with the other expired timers; the tasks those timers wake run only in
        the next pass. So ``on_block`` acts before any of them takes another step — which
        a SIGCONT handler cannot promise (the signal may reach another thread and wake the
        loop a few passes later)."""
        now = time.monotonic()
        with self._lock:
            lag = max(0.0, now - self._last - self.interval)
            self.max_lag = max(self.max_lag, lag)
            unseen = lag > self.threshold and not self._reported
            if unseen:
                self.stalls += 1
            self._reported = False
            self._last = now
        if unseen:
            log.warning(
                "event loop blocked for %.1fs (stall %d), over before its stack could be "
                "taken: the process was probably stopped (SIGSTOP, a frozen VM)",
                lag,
                self.stalls,
            )
        if lag > self.threshold and self.on_block is not None:
            try:
                self.on_block(lag)
            except Exception:  # the watch goes on
                log.exception("stall handler failed")
        assert self._loop is not None
        self._handle = self._loop.call_later(self.interval, self._tick)

    def lag(self) -> float:
        """How long the loop has been overdue for its next tick."""
        return max(0.0, time.monotonic() - self._last - self.interval)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                lag = self.lag()
                self.max_lag = max(self.max_lag, lag)
                if lag <= self.threshold or self._reported:
                    continue
                self._reported = True
                self.stalls += 1
                n = self.stalls
            frame = sys._current_frames().get(self._loop_thread)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "?"
            log.warning(
                "event loop blocked for %.1fs (stall %d; the process may also have been "
                "paused); the blocking code:\n%s",
                lag,
                n,
                stack,
            )


__all__ = ["StallWatch"]
