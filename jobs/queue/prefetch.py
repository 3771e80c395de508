"""Claim ahead: the slots of one worker process and the jobs leased ahead of them.

A worker claims a few more jobs than it has free slots (in Redis and in the database), so
a slot that frees starts its next skill at once instead of after a Redis round trip and a
batched database claim. How many is measured, not configured as a count: as many as the
worker's slots free within ``ahead_sec`` at the rate they have been freeing (a rate that
decays within a second or two: none before the first job ends, none while the jobs here run
long), never more than the slots themselves.

A job leased ahead is an ordinary leased job (``running`` in the database, its lease
renewed by the heartbeat, re-run by peers and the reconciler when this worker dies) whose
skill has not started. It waits here for a slot, the lowest priority number first, then in
claim order. It never starts when it should not: cancelled, its lease lost, this worker
paused past its heartbeat, stopping, or kept waiting longer than ``hold_sec`` (then it is
given back to the queue unstarted, for any worker; see ``store.unclaim``).
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from dataclasses import dataclass, field

#: what :meth:`StartGate.enter` answers: the slot is this job's ...
START = "start"
# ... or why the job must not start
CANCEL = "cancel"  # an operator cancelled it while it waited
LOST = "lost"  # its lease was taken over (this worker was presumed dead)
SUSPECT = "suspect"  # this worker was paused long enough to be presumed dead
HOLD = "hold"  # waited longer than hold_sec: back to the queue for any worker
STOP = "stop"  # this worker is stopping

#: time constant (s) of the measured rate at which slots free
_TAU = 1.0


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    key: str = field(compare=False)
    since: float = field(compare=False)
    fut: asyncio.Future[str] = field(compare=False)


class StartGate:
    """``slots`` skills run at once; the jobs claimed ahead wait in :meth:`enter`."""

    def __init__(self, slots: int, *, ahead_sec: float, hold_sec: float) -> None:
        self.slots = slots
        self.free = slots
        self.ahead_sec = ahead_sec
        self.hold_sec = hold_sec
        self.closed = False
        #: slots freed per second, decayed since ``_left`` (monotonic time of the last)
        self._rate = 0.0
        self._left = 0.0
        self._expired = 0.0  # when expire() last looked
        self._heap: list[_Waiter] = []
        self._seq = 0
        self._waiting: dict[str, _Waiter] = {}

    def rate(self) -> float:
        """Slots freed per second lately (by jobs that ran)."""
        return self._rate * math.exp((self._left - time.monotonic()) / _TAU)

    def depth(self) -> int:
        """How many jobs to lease beyond the free slots now."""
        if self.closed or self.ahead_sec <= 0:
            return 0
        return min(self.slots, int(self.rate() * self.ahead_sec))

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def holds(self, key: str) -> bool:
        """Is ``key`` waiting here for a slot?"""
        return key in self._waiting

    async def enter(self, key: str, priority: int) -> str:
        """Wait for a slot: :data:`START` once it is ``key``'s (give it back with
        :meth:`leave`), else why ``key`` must not start."""
        if self.closed:
            return STOP
        if self.free > 0:  # (never while a waiter is live: leave() serves them first)
            self.free -= 1
            return START
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        w = _Waiter(priority, self._seq, key, time.monotonic(), fut)
        self._seq += 1
        heapq.heappush(self._heap, w)
        self._waiting[key] = w
        try:
            return await fut
        except asyncio.CancelledError:
            # cancelled just as the slot was handed over: pass it on
            if fut.done() and not fut.cancelled() and fut.result() == START:
                self.leave(ran=False)
            raise
        finally:
            if self._waiting.get(key) is w:
                del self._waiting[key]

    def leave(self, ran: bool = True) -> None:
        """Give a slot back (``ran``: its job ran; a slot taken and given back at once does
        not count as freed) and hand it to the next waiter."""
        if ran:
            now = time.monotonic()
            self._rate = self.rate() + 1.0 / _TAU
            self._left = now
        while self._heap:
            w = heapq.heappop(self._heap)
            if not w.fut.done():
                w.fut.set_result(START)
                return
        self.free += 1

    def refuse(self, key: str, why: str) -> bool:
        """Tell ``key``, if it waits here, that it must not start (``why``)."""
        w = self._waiting.get(key)
        if w is None or w.fut.done():
            return False
        w.fut.set_result(why)
        return True

    def expire(self) -> int:
        """Send the jobs that have waited longer than ``hold_sec`` back to the queue."""
        now = time.monotonic()
        if not self._waiting or now - self._expired < min(0.1, self.hold_sec / 10):
            return 0  # (looked at most ten times a second)
        self._expired = now
        old = [w.key for w in self._waiting.values() if w.since < now - self.hold_sec]
        if old:  # slots free far slower than measured: lease nothing ahead for now
            self._rate, self._left = 0.0, now
        return sum(self.refuse(key, HOLD) for key in old)

    def close(self) -> None:
        """Stopping: nothing waiting starts any more (each goes back to the queue)."""
        self.closed = True
        for key in list(self._waiting):
            self.refuse(key, STOP)


__all__ = ["CANCEL", "HOLD", "LOST", "START", "STOP", "SUSPECT", "StartGate"]
