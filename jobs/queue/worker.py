"""The arq worker: runs queued jobs through the shared executor, post-processes and delivers
their results, and keeps the queue honest (leases, heartbeats, reconciliation).

Wiring lives here; the rules live in ``jobs.queue.runner`` (a job from claim to record),
``jobs.queue.store`` (fenced state changes), the executor, ``delivery.pipeline`` and ``chains``.
Nothing imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

from arq import Worker
from arq.typing import WorkerCoroutine
from arq.worker import func

from chains.runner import chain_job, handed_back, stop_attempts
from chains.runs import take_over_runs
from chains.scheduler import Scheduler
from delivery import notices
from delivery.outbox import Outbox
from delivery.pipeline import postprocess
from jobs.batching import Batcher
from jobs.constants import (
    CANCEL_CHANNEL,
    FN_RUN_CHAIN,
    FN_RUN_JOB,
    WAKE_CHANNEL,
    WORKER_DRAIN,
    WORKER_HEARTBEAT,
    WORKER_PAUSE,
)
from jobs.queue import broker, delayed, heap, limits, prefetch, prune, rates, store
from jobs.queue.runner import JobRunner, WorkerContext, retry_db
from jobs.queue.stall import StallWatch
from jobs.services import Services
from jobs.skill import MAX_WALL_SEC

log = logging.getLogger("skilljobs.worker")
_JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")

try:
    from redis.exceptions import ConnectionError as _RedisConnectionError
    from redis.exceptions import TimeoutError as _RedisTimeoutError

    REDIS_ERRORS: tuple[type[BaseException], ...] = (
        _RedisConnectionError,
        _RedisTimeoutError,
        ConnectionError,
        OSError,
        TimeoutError,
    )
except ImportError:  # pragma: no cover
    REDIS_ERRORS = (ConnectionError, OSError, TimeoutError)


class SkillJobsWorker(Worker):
    """arq's worker, woken by a pub/sub message the moment work is enqueued instead of
    polling every 0.5 s (the idle poll stays as a safety net for delayed retries)."""

    def __init__(
        self,
        *args: Any,
        idle_poll: float = 0.5,
        wake_channel: str,
        runner: JobRunner | None = None,
        limits: str = "",
        heartbeat_prefix: str = "",
        pause_key: str = "",
        drain_key: str = "",
        **kw: Any,
    ) -> None:
        super().__init__(*args, poll_delay=idle_poll, **kw)
        # running skills are bounded by the runner's gate; entries claimed ahead of a free
        # slot count here too (at most max_jobs more)
        self.sem = asyncio.BoundedSemaphore(2 * self.max_jobs + 1)
        self.runner = runner
        self._limits = limits  # jobs.queue.limits.for_claim of the settings
        self._heartbeat_prefix = heartbeat_prefix
        self._pause_key = pause_key  # set by an operator (dashboard): claim nothing new
        self._drain_key = drain_key  # set by an operator: claim nothing new, finish, exit
        self._paused = False
        self._draining = False
        self._pause_checked = 0.0
        self._wake = asyncio.Event()
        self._wake_channel = wake_channel
        self._last_read = 0
        self._cleanup: Batcher[tuple[str, bool], None] = Batcher(self._cleanup_many, name="arq")

    # --- running one arq job ---------------------------------------------------------------
    #
    # arq's own run_job costs two Redis transactions per job (read + retry counter, then
    # finish) around a task and a wait_for. The record of a job lives in the database, so
    # here the payload arrives with the claim (one Lua call for many jobs) and the arq keys
    # of finished jobs are removed in batches. arq's retry counter is not kept: our
    # functions decide re-runs from the database, and a counter must never fail a job
    # that the policy would run.

    async def run_job(self, job_id: str, score: int, payload: bytes | None = None) -> None:
        if payload is None:
            payload = await broker.load(self.pool, job_id)
        if not payload:
            log.warning("arq job %s: record expired or missing, dropped", job_id)
            self.jobs_failed += 1
            await self._cleanup.submit((job_id, True))
            return
        try:
            name, args, kwargs, priority = broker.decode(payload)
            function = self.functions[name]
        except (broker.SerializationError, KeyError) as exc:
            log.error("arq job %s: unusable (%s: %s), dropped", job_id, type(exc).__name__, exc)
            self.jobs_failed += 1
            await self._cleanup.submit((job_id, True))
            return
        ctx = {**self.ctx, "job_id": job_id, "job_try": 1, "score": score, "priority": priority}
        gate = self.runner.gate if self.runner is not None else None
        entered = False
        try:
            if gate is not None and name != FN_RUN_JOB:
                # (a job's own claim comes before its turn: runner.run waits for the slot)
                if await gate.enter(job_id, priority) != prefetch.START:
                    self._cleanup.push((job_id, False))  # back to its lane, nothing started
                    return
                entered = True
            async with asyncio.timeout(function.timeout_s or self.job_timeout_s):
                await function.coroutine(ctx, *args, **kwargs)
        except asyncio.CancelledError:
            # Worker stopping: the entry stays queued for the next worker (the function
            # has handed its job back, or the reconciler will), only "in progress" goes.
            self.jobs_retried += 1
            self._cleanup.push((job_id, False))
            raise
        except Exception:
            log.exception("arq job %s (%s) failed", job_id, name)
            self.jobs_failed += 1
        else:
            self.jobs_complete += 1
        finally:
            if gate is not None and entered:
                gate.leave()
        # Not waited for: the in-progress key keeps the entry from running twice meanwhile,
        # and close() flushes what is left.
        self._cleanup.push((job_id, True))

    async def _cleanup_many(self, items: list[tuple[str, bool]]) -> list[None]:
        await broker.tidy(self.pool, self.queue_name, items)
        return [None] * len(items)

    def wake(self) -> None:
        self._wake.set()

    def set_limits(self, limits: str) -> None:
        """The limits the claim applies from now on (``jobs.queue.rates.for_claim``)."""
        if limits != self._limits:
            self._limits = limits
            self._wake.set()  # a limit raised or removed: waiting jobs may start now

    def _release_sem_dec_counter_on_complete(self) -> None:
        super()._release_sem_dec_counter_on_complete()
        if self._last_read or self.burst:
            # a slot freed while work may be waiting (a burst worker also looks whether the
            # queue is empty now, rather than at its next idle poll)
            self._wake.set()

    async def _poll_iteration(self) -> None:
        """Find and claim due jobs in one Redis round trip (arq reads the queue, then runs a
        WATCH/MULTI transaction per job), start them, and tidy finished tasks."""
        gate = self.runner.gate if self.runner is not None else None
        ahead = 0
        if gate is not None:
            gate.expire()  # claimed ahead and kept waiting too long: back to the queue
            ahead = gate.depth()
        free = self.max_jobs + ahead - self.job_counter
        if self.job_counter >= self.max_jobs and free < max(1, ahead // 4):
            # Every slot busy: the jobs claimed ahead are topped up in batches, not one
            # Redis call and database statement per freed slot.
            free = 0
        if self.allow_pick_jobs and free > 0 and not await self._is_paused():
            self._last_read, claimed = await broker.claim(
                self.pool,
                self.queue_name,
                free=free,
                in_progress_ms=int(self.in_progress_timeout_s * 1000),
                # entries running here are still in the queue: read past them
                read_limit=self.queue_read_limit + self.job_counter,
                limits=self._limits,
                holder=self.runner.worker_id if self.runner is not None else "",
                heartbeat_prefix=self._heartbeat_prefix,
            )
            for job_id, score, payload in claimed:
                await self.sem.acquire()
                self.job_counter += 1
                t = self.loop.create_task(self.run_job(job_id, score, payload))
                t.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
                self.tasks[job_id] = t
        for job_id, t in list(self.tasks.items()):
            if t.done():
                del self.tasks[job_id]
                exc = None if t.cancelled() else t.exception()
                if exc is not None:  # arq's own bookkeeping failed (e.g. Redis went away)
                    log.warning("arq job %s: %s: %s", job_id, type(exc).__name__, exc)
        await self.heart_beat()

    async def _is_paused(self) -> bool:
        """Whether an operator paused or is draining this worker (read at most once a
        second; running jobs are not affected)."""
        now = time.monotonic()
        if self._pause_key and now - self._pause_checked >= 1.0:
            self._pause_checked = now
            pause, drain = await self.pool.mget(self._pause_key, self._drain_key or self._pause_key)
            self._paused = pause is not None
            self._draining = bool(self._drain_key) and drain is not None
        return self._paused or self._draining

    def _drained(self) -> bool:
        """Draining and nothing left running or finishing here: time to exit."""
        return self._draining and not any(
            not t.done() for t in [*self.tasks.values(), *self._finishing()]
        )

    async def main(self) -> None:
        from arq.connections import create_pool

        if self._pool is None:
            self._pool = await create_pool(self.redis_settings, default_queue_name=self.queue_name)
        self.ctx["redis"] = self.pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        listener = asyncio.create_task(self._listen())
        try:
            while True:
                self._wake.clear()
                try:
                    await self._poll_iteration()
                except REDIS_ERRORS as exc:
                    # Redis restarting or unreachable: keep the process, try again shortly.
                    # Whatever Redis lost, the reconciler re-enqueues from the database.
                    log.warning("queue poll failed (%s: %s); retrying", type(exc).__name__, exc)
                    await asyncio.sleep(1.0)
                    continue
                if self._drained():
                    log.info("worker drained on request: nothing running, exiting")
                    return
                if self.burst:
                    if 0 <= self.max_burst_jobs <= self._jobs_started():
                        await asyncio.gather(*self.tasks.values())
                        if self.runner is not None:
                            await self.runner.wait_finishing()
                        return
                    if self.job_counter == 0:
                        # nothing here any more: the entries of finished jobs leave the
                        # queue before it is counted
                        await self._cleanup.flush()
                    if await self.pool.zcard(self.queue_name) == 0:
                        await asyncio.gather(*self.tasks.values())
                        if self.runner is not None:
                            await self.runner.wait_finishing()
                            if self.runner.svc.outbox is not None:  # parked deliveries too
                                await self.runner.svc.outbox.settle()
                        await self._cleanup.flush()
                        if await self.pool.zcard(self.queue_name) == 0:
                            return
                        continue
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that arrives just as the wake-up does, and the worker would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_delay_s):
                        await self._wake.wait()
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener

    # --- stopping: jobs in the finishing stage count as running ----------------------------

    def _finishing(self) -> set[asyncio.Task[Any]]:
        return self.runner.finishing if self.runner is not None else set()

    async def _sleep_until_tasks_complete(self) -> None:
        while pending := [t for t in [*self.tasks.values(), *self._finishing()] if not t.done()]:
            await asyncio.wait(pending)

    async def _wait_for_tasks_to_complete(self, signum: signal.Signals) -> None:
        """SIGTERM: running skills and deliveries get the grace period, then whatever is
        left is cancelled (and handed back to the queue by the job function). Jobs claimed
        ahead that have not started go back to the queue at once."""
        if self.runner is not None and self.runner.gate is not None:
            self.runner.gate.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._job_completion_wait):
                await self._sleep_until_tasks_complete()
        self._cancel_all()
        if self.main_task:
            self.main_task.cancel()
        if self.on_stop:
            self.on_stop(signum)

    def _cancel_all(self) -> None:
        for t in [*self.tasks.values(), *self._finishing()]:
            if not t.done():
                t.cancel()

    async def close(self) -> None:
        """Stop running jobs and background loops; the Redis pool belongs to ``Services``."""
        if not self._handle_signals:
            self.handle_sig(signal.SIGUSR1)
        if self.runner is not None and self.runner.gate is not None:
            self.runner.gate.close()  # claimed ahead, not started: back to the queue
        self._cancel_all()
        await asyncio.gather(*self.tasks.values(), *self._finishing(), return_exceptions=True)
        await self._cleanup.flush()
        if self.runner is not None and self.runner.slots is not None:
            with contextlib.suppress(Exception):
                await self.runner.slots.flush()
        with contextlib.suppress(Exception):
            await self.pool.delete(self.health_check_key)
        if self.on_shutdown:
            await self.on_shutdown(self.ctx)
            self.on_shutdown = None

    async def _listen(self) -> None:
        while True:
            try:
                pubsub = self.pool.pubsub()
                await pubsub.subscribe(self._wake_channel)
                async for msg in pubsub.listen():
                    if msg.get("type") == "message":
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restart: resubscribe, the idle poll covers the gap
                log.debug("wake listener: %s", exc)
                await asyncio.sleep(1.0)


async def _run_job(ctx: WorkerContext, job_id: str, enqueue_token: int) -> str:
    runner, outcome = ctx["runner"], ""
    try:
        outcome = await runner.run(job_id, int(enqueue_token), ctx["priority"])
        return outcome
    finally:
        if outcome != "finishing":  # else freed once the finishing stage has recorded it
            runner.release_slots(ctx["job_id"])


async def _loop(name: str, interval: float, fn: Callable[[], Awaitable[Any]]) -> None:
    while True:
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s failed: %s: %s", name, exc.__class__.__name__, exc)
        await asyncio.sleep(interval)


async def _listen_cancels(runner: JobRunner) -> None:
    svc = runner.svc
    while True:
        try:
            assert svc.redis is not None
            pubsub = svc.redis.pubsub()
            await pubsub.subscribe(svc.settings.key(CANCEL_CHANNEL))
            async for msg in pubsub.listen():
                if msg.get("type") == "message":
                    await _cancel_if_requested(runner, msg["data"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("cancel listener: %s", exc)
            await asyncio.sleep(1.0)


async def _cancel_if_requested(runner: JobRunner, data: object) -> None:
    """A cancel message is only a hint: anyone who can publish to Redis can send one. The
    job is stopped only when its row says ``cancel_requested`` (C18)."""
    job_id = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    if not _JOB_ID.fullmatch(job_id) or job_id not in runner.held:
        return  # not a job id, or not running (or claimed ahead) here
    job = await store.get_job(runner.svc.sessionmaker, job_id)
    if job is None or not job.cancel_requested:
        log.warning("cancel message for job %s ignored: its record asks for no cancel", job_id)
        return
    runner.cancel_local(job_id)


def _pause_handlers(runner: JobRunner) -> tuple[Callable[[], None], Callable[[float], None]]:
    """The SIGCONT handler and the stall detector's end-of-block handler: after a pause long
    enough for peers to presume this worker dead, its skills and chain steps stop before
    they take another step and hand their work back (fenced)."""

    def resumed() -> None:
        if time.time() - runner.last_beat >= runner.missing_after - 0.5:
            stop_attempts()  # chain runs: as runner.resumed does for jobs
        runner.resumed()

    def blocked(lag: float) -> None:
        # Renewals stopped for the whole block: only a block this long, on top of the
        # interval before it, can have let peers presume this worker dead.
        if lag >= runner.missing_after - runner.svc.settings.worker_heartbeat_sec - 0.5:
            resumed()

    return resumed, blocked


def _run_time_limits(
    services: Services, runner: JobRunner, built: list[SkillJobsWorker]
) -> Callable[[], Awaitable[None]]:
    """Limits may be set at run time (jobs.queue.rates): slots are always released, and the
    returned refresh hands the limits in force to the worker in ``built`` and rebuilds the
    rate buckets Redis lost from the database."""

    async def release(arq_ids: list[str]) -> list[None]:
        await broker.release(services, arq_ids)
        return [None] * len(arq_ids)

    runner.slots = Batcher(release, name="slots")

    async def refresh() -> None:
        eff = await rates.current(services)
        if built:
            built[0].set_limits(rates.for_claim(eff))
        await rates.rebuild_once(services, eff)

    return refresh


def build_worker(
    services: Services,
    *,
    executor: Any | None = None,
    burst: bool = False,
    max_jobs: int | None = None,
    scheduler: bool = True,
    worker_id: str | None = None,
    handle_signals: bool = True,
) -> SkillJobsWorker:
    """An arq worker wired to ``services``. ``burst=True`` drains the queue and returns."""
    if executor is None:
        executor = services.executor
    settings = services.settings
    wid = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    slots = max_jobs or settings.worker_max_jobs
    runner = JobRunner(
        services, executor, wid, finisher=postprocess, notices=notices, max_finishing=2 * slots
    )
    runner.concurrency = slots
    ahead = settings.worker_prefetch_sec
    runner.gate = prefetch.StartGate(slots, ahead_sec=ahead, hold_sec=max(1.0, 10 * ahead))
    background: list[asyncio.Task[Any]] = []

    built: list[SkillJobsWorker] = []
    refresh_limits = _run_time_limits(services, runner, built)

    async def on_startup(ctx: dict[str, Any]) -> None:
        ctx.update(runner=runner, services=services, executor=executor, worker_id=wid)
        await retry_db(
            "register worker",
            store.worker_heartbeat,
            services.sessionmaker,
            wid,
            socket.gethostname(),
            os.getpid(),
            [],
        )
        background.append(
            asyncio.create_task(
                _loop("heartbeat", settings.worker_heartbeat_sec, runner.heartbeat_once)
            )
        )
        background.append(
            asyncio.create_task(
                _loop("reconciler", settings.reconcile_interval_sec, runner.reconcile_once)
            )
        )
        with contextlib.suppress(Exception):  # the loop below tries again
            await refresh_limits()
        background.append(
            asyncio.create_task(_loop("limits", settings.limits_refresh_sec, refresh_limits))
        )
        # Peers presumed dead (heartbeat missing for 3 intervals + 1 s): checked every second
        # (the read visits every index entry a job left as running until vacuum, ~5 ms of
        # PostgreSQL after a 20,000-job drain), and 4 times a second the live peers'
        # heartbeat keys, whose going triggers the take-over at once.
        takeover_every = min(1.0, settings.worker_heartbeat_sec)
        background.append(
            asyncio.create_task(_loop("take-over", takeover_every, runner.take_over_once))
        )

        async def take_over_chains() -> None:
            await take_over_runs(services, wid, runner.missing_after)

        background.append(
            asyncio.create_task(_loop("chain take-over", takeover_every, take_over_chains))
        )

        async def watch_peers() -> None:
            if await runner.peer_just_gone():
                await runner.take_over_once()
                await take_over_chains()

        background.append(asyncio.create_task(_loop("peer watch", takeover_every / 4, watch_peers)))

        # Continued after a stop (SIGSTOP, a frozen VM) or a long block: handled before any
        # skill resumes, by the stall detector's first tick after it (and on SIGCONT).
        resumed, blocked = _pause_handlers(runner)
        runner.stall = StallWatch(threshold=settings.worker_stall_sec, on_block=blocked)
        runner.stall.start()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGCONT, resumed)
        background.append(asyncio.create_task(_listen_cancels(runner)))
        prune_stop = asyncio.Event()
        ctx["prune_stop"] = prune_stop
        background.append(
            asyncio.create_task(prune.run_forever(services.sessionmaker, settings, prune_stop))
        )
        services.outbox = Outbox(services, wid)
        outbox_stop = asyncio.Event()
        ctx["outbox_stop"] = outbox_stop
        background.append(asyncio.create_task(services.outbox.run_forever(outbox_stop)))
        promoter_stop = asyncio.Event()
        ctx["promoter_stop"] = promoter_stop
        background.append(asyncio.create_task(delayed.run_forever(services, promoter_stop)))
        if scheduler:
            stop = asyncio.Event()
            ctx["scheduler_stop"] = stop
            background.append(asyncio.create_task(Scheduler(services).run_forever(stop)))
        heap.settle()  # (undone in on_shutdown)
        log.info(
            "worker %s started: queue %s, max_jobs %s",
            wid,
            settings.queue_name,
            max_jobs or settings.worker_max_jobs,
        )

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        heap.restore()
        await handed_back()  # chain runs going back to the queue need Redis a moment more
        for key in ("scheduler_stop", "prune_stop", "outbox_stop", "promoter_stop"):
            if key in ctx:
                ctx[key].set()
        if runner.stall is not None:
            runner.stall.stop()
        for t in background:
            t.cancel()
        for t in background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        with contextlib.suppress(Exception):
            await store.worker_heartbeat(
                services.sessionmaker, wid, socket.gethostname(), os.getpid(), [], stopped=True
            )

    timeout = MAX_WALL_SEC + 300  # the executor enforces each skill's wall clock itself
    # arq types the context as a plain dict; ours declares its keys (WorkerContext).
    run_job, run_chain = cast(WorkerCoroutine, _run_job), cast(WorkerCoroutine, chain_job)
    functions = [
        func(run_job, name=FN_RUN_JOB, max_tries=1_000_000, timeout=timeout),
        func(run_chain, name=FN_RUN_CHAIN, max_tries=1_000_000, timeout=timeout),
    ]

    assert services.redis is not None
    worker = SkillJobsWorker(
        functions,
        redis_pool=services.redis,
        queue_name=settings.queue_name,
        wake_channel=settings.key(WAKE_CHANNEL),
        runner=runner,
        limits=limits.for_claim(settings.limits),
        heartbeat_prefix=settings.key(WORKER_HEARTBEAT, ""),
        pause_key=settings.key(WORKER_PAUSE, runner.worker_id),
        drain_key=settings.key(WORKER_DRAIN, runner.worker_id),
        burst=burst,
        max_jobs=max_jobs or settings.worker_max_jobs,
        keep_result=0,
        handle_signals=handle_signals,
        job_completion_wait=int(settings.worker_grace_sec),
        on_startup=on_startup,
        on_shutdown=on_shutdown,
        ctx={},
        log_results=False,
        job_serializer=broker.dumps,
        job_deserializer=broker.loads,
    )
    built.append(worker)
    return worker


__all__ = ["SkillJobsWorker", "build_worker"]
