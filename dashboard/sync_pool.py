"""The sync line off the web app's event loop: ``POST /api/v1/dispatch`` calls that run
now (not in the background) are run by a small pool of executor processes, so a skill
that computes for seconds — in a sync entry or an async one that never awaits — cannot
stall the API, the dashboard or ``/healthz``.

Each process runs its own event loop, Services and Dispatcher, and many dispatches at
once (an LLM-bound skill waiting on the network does not hold a process). Requests and
answers travel over a pipe as plain dicts (trusted: both ends are this program). A process
that dies or overruns the longest wall clock is replaced; its callers get a transient
error envelope."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from jobs.envelope import failure
from jobs.logs import setup_logging
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services
from jobs.settings import Settings

log = logging.getLogger(__name__)

# What travels over a process's pipe: (request id, the dispatch's keywords) to the process,
# (request id, HTTP status, body) back.
Request = tuple[int, dict[str, Any]]
Answer = tuple[int, int, dict[str, Any]]

# Beyond every wall clock (1800 s cap) plus the executor's own grace: the process is stuck.
HARD_TIMEOUT_S = 1800 + 60
BIG_SEND = 64 * 1024


class _Child:
    """One executor process and the calls waiting for it."""

    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a threaded event loop
        ours, theirs = ctx.Pipe()
        self.proc = ctx.Process(
            target=child_main, args=(settings, theirs), name="skilljobs-sync-line", daemon=True
        )
        self.proc.start()
        theirs.close()
        self.conn: Connection = ours
        self.loop = loop
        self.pending: dict[int, asyncio.Future[tuple[int, dict[str, Any]]]] = {}
        self.alive = True
        self.send_lock = threading.Lock()
        threading.Thread(target=self._read, name="sync-line-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                rid, status, body = self.conn.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:  # an answer that cannot be decoded: never hang its caller
                log.warning("sync line: unreadable answer: %s", type(exc).__name__)
                continue
            with contextlib.suppress(RuntimeError):  # the loop is gone at shutdown
                self.loop.call_soon_threadsafe(self._settle, rid, status, body)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._died)

    def _settle(self, rid: int, status: int, body: dict[str, Any]) -> None:
        fut = self.pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result((status, body))

    def _died(self) -> None:
        self.alive = False
        for fut in self.pending.values():
            if not fut.done():
                fut.set_result(
                    (
                        503,
                        failure("the sync-line process stopped; try again", error_type="transient"),
                    )
                )
        self.pending.clear()

    def _send(self, message: Request) -> None:
        with self.send_lock:
            self.conn.send(message)

    async def call(
        self, rid: int, request: dict[str, Any], size: int
    ) -> tuple[int, dict[str, Any]]:
        fut: asyncio.Future[tuple[int, dict[str, Any]]] = self.loop.create_future()
        self.pending[rid] = fut
        message = (rid, request)
        try:
            if size > BIG_SEND:
                await asyncio.to_thread(self._send, message)  # a large copy off the loop
            else:
                self._send(message)
        except (OSError, ValueError) as exc:
            self.pending.pop(rid, None)
            self.alive = False
            return 503, failure(
                f"the sync-line process is unavailable ({exc})", error_type="transient"
            )
        try:
            async with asyncio.timeout(HARD_TIMEOUT_S):
                return await asyncio.shield(fut)
        except TimeoutError:
            self.pending.pop(rid, None)
            self.stop()
            return 504, failure("the skill did not finish and was stopped", error_type="transient")

    def stop(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.proc.is_alive():
            self.proc.terminate()


class SyncPool:
    """``size`` executor processes, started with the app, used least-busy first."""

    def __init__(self, settings: Settings, size: int) -> None:
        self.settings = settings
        self.size = max(1, size)
        self.children: list[_Child] = []
        self.ids = itertools.count(1)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.children = [_Child(self.settings, loop) for _ in range(self.size)]

    def _pick(self) -> _Child:
        loop = asyncio.get_running_loop()
        for i, child in enumerate(self.children):
            if not child.alive:
                child.stop()
                self.children[i] = _Child(self.settings, loop)
        return min(self.children, key=lambda c: len(c.pending))

    async def dispatch(self, size: int = 0, **request: Any) -> tuple[int, dict[str, Any]]:
        """``Dispatcher.dispatch(**request)`` in a pool process: (status, body). ``size``
        (the request body's length) decides whether pickling it is done off the loop."""
        if not self.children:
            self.start()
        return await self._pick().call(next(self.ids), request, size)

    def close(self) -> None:
        for child in self.children:
            child.stop()
        for child in self.children:
            child.proc.join(3)
            if child.proc.is_alive():
                child.proc.kill()
        self.children = []


# --- the executor process ---------------------------------------------------------------


def child_main(settings: Settings, conn: Connection) -> None:
    """Entry of a pool process: serve dispatches until the web app closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the web app stops us by closing the pipe
    setup_logging(settings)
    asyncio.run(_serve(settings, conn))


async def _serve(settings: Settings, conn: Connection) -> None:
    svc = await Services.open(settings, redis=bool(settings.redis_url))
    dispatcher = Dispatcher(svc)
    loop = asyncio.get_running_loop()
    closed = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()
    send_lock = threading.Lock()

    def send(message: Answer) -> None:
        with send_lock:
            conn.send(message)

    async def handle(rid: int, request: dict[str, Any]) -> None:
        try:
            answer = await dispatcher.dispatch(**request)
            out: Answer = (rid, answer.status_code, answer.body)
        except Exception as exc:
            log.exception("sync-line dispatch failed")
            out = (
                rid,
                500,
                failure(f"internal error ({type(exc).__name__})", error_type="transient"),
            )
        try:
            send(out)  # the web app's reader thread drains the pipe: this only copies
        except (OSError, ValueError):
            closed.set()
        except Exception as exc:  # an answer that does not pickle
            send(
                (
                    rid,
                    500,
                    failure(f"the result could not be returned ({exc})", error_type="transient"),
                )
            )

    def start(message: Request) -> None:
        rid, request = message
        task = loop.create_task(handle(rid, request))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            loop.call_soon_threadsafe(start, message)
        loop.call_soon_threadsafe(closed.set)

    threading.Thread(target=read, name="sync-line-requests", daemon=True).start()
    try:
        await closed.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await svc.close()
