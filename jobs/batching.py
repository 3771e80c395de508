"""Group commit: many concurrent small writes carried by one statement.

A worker runs up to ``max_jobs`` jobs at once and each one claims, finishes and announces
itself. Done one by one, that is a database round trip (and a pooled connection) per job
per step; under load the round trips, not the work, set the throughput. A
:class:`Batcher` coalesces the calls that arrive while its previous flush is in flight
into the next one: an idle system pays no added latency (the flush starts on the next
loop iteration), a busy one pays one round trip per batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - item
R = TypeVar("R")  # result

Flush = Callable[[list[I]], Awaitable[Sequence[R]]]


class Batcher(Generic[I, R]):
    """Coalesce concurrent :meth:`submit` calls into calls of ``flush(items) -> results``.

    ``flush`` returns one result per item, in order. When it raises, every item of that
    batch gets the exception (callers retry as they would a single statement). At most
    ``concurrency`` flushes are in flight (default one, so a batcher holds at most one
    database connection).
    A caller cancelled while waiting does not withdraw its item once the batch has
    started: the write happens, as a single statement already sent would.
    """

    def __init__(
        self,
        flush: Flush[I, R],
        *,
        max_batch: int = 256,
        concurrency: int = 1,
        name: str = "batch",
    ) -> None:
        self._flush = flush
        self.max_batch = max_batch
        self.concurrency = concurrency
        self.name = name
        self._pending: list[tuple[I, asyncio.Future[R]]] = []
        #: the drains taking items (each leaves as it returns)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: batches flushed and items carried (for metrics and the benchmark)
        self.flushes = 0
        self.items = 0

    async def submit(self, item: I) -> R:
        """Add ``item`` to the next batch and wait for its result."""
        return await self._add(item)

    def push(self, item: I) -> asyncio.Future[R]:
        """Add ``item`` to the next batch without waiting (best-effort writes: live events,
        tidying). A failure is logged, not raised; :meth:`flush` waits for what was pushed."""
        fut = self._add(item)
        fut.add_done_callback(self._log_failure)
        return fut

    async def flush(self) -> None:
        """Wait until everything added so far has been written (or has failed)."""
        while pending := [t for t in self._tasks if not t.done()]:
            await asyncio.wait(pending)

    def _add(self, item: I) -> asyncio.Future[R]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # left over from an event loop that is gone: nobody waits for those any more
            self._tasks = {t for t in self._tasks if t.get_loop() is loop}
            self._pending = [(i, f) for i, f in self._pending if f.get_loop() is loop]
            self._loop = loop
        fut: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, fut))
        # (a drain leaves the set as it returns, so an item added after that starts another)
        if len(self._tasks) < self.concurrency:
            self._start(loop)
        return fut

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        task = loop.create_task(self._drain(), name=f"batcher:{self.name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        if task not in self._tasks:
            return
        # cancelled before its first step, so it never took its items: another drain does
        self._tasks.discard(task)
        loop = task.get_loop()
        if (
            loop is self._loop
            and not loop.is_closed()
            and len(self._tasks) < self.concurrency
            and any(not f.done() for _, f in self._pending)
        ):
            self._start(loop)

    def _log_failure(self, fut: asyncio.Future[R]) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            log.warning("%s: a pushed write failed: %r", self.name, fut.exception())

    async def _drain(self) -> None:
        try:
            await self._drain_pending()
        finally:
            self._tasks.discard(asyncio.current_task())

    async def _drain_pending(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            live = [(item, fut) for item, fut in batch if not fut.cancelled()]
            if not live:
                continue
            self.flushes += 1
            self.items += len(live)
            try:
                results = await self._flush([item for item, _ in live])
            except asyncio.CancelledError:
                for _, fut in live:
                    if not fut.done():
                        fut.cancel()
                for _, fut in self._pending:
                    fut.cancel()
                self._pending.clear()
                raise
            except BaseException as exc:  # handed to every waiter
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            if len(results) != len(live):  # a bug in flush: fail loudly, never mismatch
                err = RuntimeError(
                    f"{self.name}: flush returned {len(results)} results for {len(live)} items"
                )
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(err)
                continue
            for (_, fut), res in zip(live, results, strict=True):
                if not fut.done():
                    fut.set_result(res)
