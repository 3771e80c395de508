"""The arq worker: runs queued jobs through the shared executor, post-processes and delivers
their results, and keeps the queue honest (leases, heartbeats, reconciliation).

Wiring lives here; the rules live in ``jobs.store`` (fenced state changes), the executor,
``delivery.pipeline`` and ``chains``. Nothing imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from arq import Worker
from arq.constants import (
    abort_jobs_ss,
    in_progress_key_prefix,
    job_key_prefix,
    retry_key_prefix,
)
from arq.jobs import SerializationError, deserialize_job_raw
from arq.utils import timestamp_ms
from arq.worker import func

from jobs import store
from jobs.batching import Batcher
from jobs.constants import CANCEL_CHANNEL, FN_RUN_CHAIN, FN_RUN_JOB, WAKE_CHANNEL, WORKER_HEARTBEAT
from jobs.dispatcher import job_event
from jobs.models import CANCELLED, FAILED, SUCCEEDED, TIMED_OUT
from jobs.queue import enqueue
from jobs.services import Services
from jobs.skill import MAX_WALL_SEC

log = logging.getLogger("skilljobs.worker")
T = TypeVar("T")

MAX_RUNS = 3  # SPEC §7: a transient failure is re-run, at most 3 runs in all
DB_ERRORS: tuple[type[BaseException], ...] = (OSError, ConnectionError, TimeoutError)
try:  # SQLAlchemy's connection-level errors also mean "the database went away"
    from sqlalchemy.exc import InterfaceError, OperationalError

    DB_ERRORS = (*DB_ERRORS, OperationalError, InterfaceError)
except ImportError:  # pragma: no cover
    pass


async def retry_db(
    what: str, fn: Callable[..., Awaitable[T]], *args: Any, patience: float = 300.0, **kw: Any
) -> T:
    """Run a bookkeeping call, retrying while the database is unreachable.

    A PostgreSQL restart must not crash-loop the worker: we wait it out (up to
    ``patience`` seconds) instead of losing the outcome of a finished skill.
    """
    delay, deadline = 0.2, time.monotonic() + patience
    while True:
        try:
            return await fn(*args, **kw)
        except DB_ERRORS as exc:
            if time.monotonic() > deadline:
                raise
            log.warning(
                "%s: database unavailable (%s), retrying in %.1fs",
                what,
                exc.__class__.__name__,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


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


class JobRunner:
    """Per-process state shared by the job functions and the background loops."""

    def __init__(
        self,
        services: Services,
        executor: Any,
        worker_id: str,
        *,
        max_finishing: int = 200,
        linger: float = 0.01,
    ) -> None:
        self.svc = services
        self.executor = executor
        self.worker_id = worker_id
        self.held: dict[str, int] = {}  # job id → lease token
        self.inner: dict[str, asyncio.Task[Any]] = {}  # job id → running executor task
        self.cancel_asked: set[str] = set()
        self.lost: set[str] = set()
        # Jobs whose skill has finished, being post-processed and delivered. They no longer
        # hold a worker slot (max_jobs bounds running skills); at most ``max_finishing``
        # (twice max_jobs: the stage lingers ``linger`` seconds before each batch).
        self.finishing: set[asyncio.Task[Any]] = set()
        self.max_finishing = max_finishing
        self._gate: asyncio.Semaphore | None = None
        self.linger = linger
        self._linger_fut: asyncio.Future[None] | None = None
        # job id → until when our lease is certainly ours (as of the last claim/renewal).
        self.lease_until: dict[str, float] = {}
        # Group commit: the claims, outcomes and live events of concurrent jobs travel
        # together, one statement (or one Redis round trip) per batch.
        sm, s = services.sessionmaker, services.settings
        self.claims: Batcher[tuple[str, int], store.Claim | None] = Batcher(
            lambda wanted: store.claim_many(sm, wanted, worker_id, s.worker_lease_sec),
            concurrency=2,
            name="claim",
        )
        self.outcomes: Batcher[store.Outcome, bool] = Batcher(
            lambda outcomes: store.finish_many(sm, outcomes), concurrency=2, name="finish"
        )
        self.events: Batcher[tuple[str, str, str], None] = Batcher(
            self._publish_events, name="events"
        )

    # --- the job function ----------------------------------------------------------------

    async def run(self, job_id: str, enqueue_token: int) -> str:
        s = self.svc.settings
        asked_at = time.time()
        claim = await retry_db("claim", self.claims.submit, (job_id, enqueue_token))
        if claim is None:
            return "superseded"  # cancelled, re-enqueued or already running elsewhere
        job, token = claim.job, claim.token
        self.held[job_id] = token
        self.lease_until[job_id] = asked_at + s.worker_lease_sec
        handed_off = False
        try:
            done = await self._run_claimed(job, token, claim.attempt)
            if isinstance(done, str):
                return done
            # The skill has finished: its post-processing and delivery go on in the
            # finishing stage, and this slot takes the next job.
            await self._finish_gate().acquire()
            task = asyncio.create_task(self._finish(job, token, done))
            self.finishing.add(task)
            task.add_done_callback(self._finished)
            handed_off = True
            return "finishing"
        finally:
            if not handed_off:
                self._release(job_id)

    def _linger(self) -> asyncio.Future[None]:
        """The finishing stage lingers a moment (one shared timer, not one per job): the
        jobs whose skills finish together are post-processed and recorded together, in
        bigger batches, after the slots they left have taken their next jobs."""
        fut = self._linger_fut
        if fut is None or fut.done():
            loop = asyncio.get_running_loop()
            fut = self._linger_fut = loop.create_future()
            loop.call_later(self.linger, _resolve, fut)
        return fut

    def _release(self, job_id: str) -> None:
        self.held.pop(job_id, None)
        self.lease_until.pop(job_id, None)
        self.inner.pop(job_id, None)
        self.cancel_asked.discard(job_id)
        self.lost.discard(job_id)

    def _finish_gate(self) -> asyncio.Semaphore:
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.max_finishing)
        return self._gate

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self.finishing.discard(task)
        if self._gate is not None:
            self._gate.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("finishing stage failed: %r", task.exception())

    async def wait_finishing(self) -> None:
        """Wait until every handed-off job is post-processed, delivered and recorded."""
        while self.finishing:
            await asyncio.wait(list(self.finishing))

    async def _run_claimed(self, job: Any, token: int, attempt: int) -> Any:
        """Run the skill; a str when the job is settled here (cancelled, lost, re-queued),
        else the skill's outcome for the finishing stage."""
        svc = self.svc
        job_id = job.id
        input_data = svc.box.unseal(job.input or {})
        ctx = svc.box.unseal(job.context or {})
        task = asyncio.create_task(self.executor.execute(job.skill, input_data, ctx))
        self.inner[job_id] = task
        # Published while the skill starts, not before: the event is for people watching.
        await self.event(job_id, "running", job.skill)
        try:
            outcome = await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                # Worker shutdown (grace period over): hand the job back, nothing recorded.
                await asyncio.shield(
                    self._hand_back(job, token, "worker stopped before it finished")
                )
                raise
            if job_id in self.lost:
                log.warning("job %s: lease lost, dropping this attempt's outcome", job_id)
                return "lost"
            await asyncio.shield(
                self._record(job, token, CANCELLED, None, "cancelled by an operator", None)
            )
            return CANCELLED

        if outcome.transient and attempt < MAX_RUNS:
            failures = await retry_db(
                "breaker", store.recent_failures, svc.sessionmaker, job.skill, job.role_id
            )
            # The attempt that just failed is not closed yet, so it is not counted here.
            if failures < 2:
                delay = svc.settings.retry_backoff_sec * 4 ** (attempt - 1)
                new = await retry_db(
                    "requeue",
                    store.requeue,
                    svc.sessionmaker,
                    job_id,
                    token,
                    reason=outcome.error or "transient failure",
                    error_type="transient",
                    delay=delay,
                )
                if new is not None:
                    await self._enqueue(job_id, new, defer=delay)
                    await self.event(job_id, "queued", job.skill)
                    return "retrying"
                return "lost"

        return outcome

    async def _finish(self, job: Any, token: int, outcome: Any) -> str:
        """The finishing stage of one job: post-processing, delivery, the fenced record."""
        job_id = job.id
        status = outcome.status if outcome.status in (SUCCEEDED, FAILED, TIMED_OUT) else FAILED
        result = outcome.result
        post: Any = None
        try:
            await self._linger()
            try:
                post = await self._postprocess(job, token, result)
                result = post.result
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # post-processing never loses the skill's result
                log.exception("job %s: post-processing failed", job_id)
                result = dict(result)
                result.setdefault("postprocess_error", f"{exc.__class__.__name__}: {exc}")
            fetches = getattr(post, "fetches", None)
            await self._record(
                job, token, status, result, outcome.error, outcome.error_type, fetches
            )
            return status
        except asyncio.CancelledError:
            # Worker shutdown (grace period over) mid-delivery: hand the job back; the
            # delivery ledger keeps the next attempt from sending anything twice.
            await asyncio.shield(self._hand_back(job, token, "worker stopped before it finished"))
            raise
        finally:
            self._release(job_id)

    async def _postprocess(self, job: Any, token: int, result: dict[str, Any]) -> Any:
        from delivery.pipeline import postprocess

        margin = self.svc.settings.worker_lease_sec / 3  # room for clock skew between hosts

        async def fence() -> bool:
            # Nobody can take a lease before it expires, so while ours is comfortably
            # unexpired the answer is known without asking the database.
            if job.id in self.lost:
                return False
            if time.time() < self.lease_until.get(job.id, 0.0) - margin:
                return True
            return await store.holds_lease(self.svc.sessionmaker, job.id, token)

        return await postprocess(self.svc, job, result, fence=fence)

    async def _record(
        self,
        job: Any,
        token: int,
        status: str,
        result: dict[str, Any] | None,
        error: str | None,
        error_type: str | None,
        fetches: list[Any] | None = None,
    ) -> None:
        stored = self._for_storage(job, result)
        outcome = store.Outcome(job.id, token, status, stored, error, error_type, fetches=fetches)
        ok = await retry_db("finish", self.outcomes.submit, outcome)
        if ok:
            await self.event(job.id, status, job.skill)
        else:
            log.warning("job %s: not recorded, this attempt no longer holds the lease", job.id)

    def _for_storage(self, job: Any, result: dict[str, Any] | None) -> dict[str, Any] | None:
        if result is None:
            return None
        from jobs.context import workspace_dir
        from jobs.envelope import offload

        workspace = workspace_dir(
            self.svc.settings.resolved_workspace_root, job.role_id, job.session_id
        )
        try:
            result = offload(result, workspace, job.skill)
        except Exception as exc:  # a full disk must not lose the outcome
            log.warning("job %s: offload failed (%s); storing a summary", job.id, exc)
            result = {
                "ok": result.get("ok", True),
                "error": result.get("error"),
                "offload_error": str(exc),
            }
        return self.svc.box.seal(result)

    async def _hand_back(self, job: Any, token: int, reason: str) -> None:
        new = await retry_db(
            "hand back",
            store.requeue,
            self.svc.sessionmaker,
            job.id,
            token,
            reason=reason,
            error_type="transient",
            attempt_outcome="requeued",
            patience=10.0,
        )
        if new is not None:
            with contextlib.suppress(Exception):
                await self._enqueue(job.id, new)
                await self.event(job.id, "queued", job.skill)

    async def event(self, job_id: str, status: str, skill: str) -> None:
        """Tell live dashboards (best effort: the row is the record)."""
        if self.svc.redis is None:
            return
        self.events.push((job_id, status, skill))  # nobody waits for a live event

    async def _publish_events(self, events: list[tuple[str, str, str]]) -> list[None]:
        assert self.svc.redis is not None
        async with self.svc.redis.pipeline(transaction=False) as pipe:
            for job_id, status, skill in events:
                pipe.publish(*job_event(self.svc, job_id, status, skill))
            await pipe.execute()
        return [None] * len(events)

    async def _enqueue(self, job_id: str, token: int, defer: float = 0.0) -> None:
        await enqueue(
            self.svc, FN_RUN_JOB, job_id, token, job_id=store.arq_id(job_id, token), defer=defer
        )

    # --- background loops ----------------------------------------------------------------

    def cancel_local(self, job_id: str) -> bool:
        task = self.inner.get(job_id)
        if task is None or task.done():
            return False
        self.cancel_asked.add(job_id)
        task.cancel()
        return True

    async def heartbeat_once(self) -> None:
        s = self.svc.settings
        held = dict(self.held)
        asked_at = time.time()
        still, cancel = await store.renew_leases(
            self.svc.sessionmaker, self.worker_id, held, s.worker_lease_sec
        )
        for job_id in still:
            if job_id in self.lease_until:
                self.lease_until[job_id] = asked_at + s.worker_lease_sec
        for job_id in held:
            if job_id not in still and job_id in self.held and self.held[job_id] == held[job_id]:
                # Someone else owns it now (we were presumed dead): stop, record nothing.
                self.lost.add(job_id)
                task = self.inner.get(job_id)
                if task and not task.done():
                    task.cancel()
        for job_id in cancel:
            self.cancel_local(job_id)
        await store.worker_heartbeat(
            self.svc.sessionmaker,
            self.worker_id,
            socket.gethostname(),
            os.getpid(),
            sorted(self.held),
        )
        if self.svc.redis is not None:
            await self.svc.redis.set(
                s.key(WORKER_HEARTBEAT, self.worker_id),
                json.dumps({"id": self.worker_id, "running": sorted(self.held), "at": time.time()}),
                ex=max(int(s.worker_lease_sec), 10),
            )

    async def reconcile_once(self) -> int:
        """Re-enqueue what the database says must run but Redis no longer has.

        * running jobs whose lease expired (their worker died, e.g. ``kill -9``);
        * queued jobs whose arq entry is missing (Redis flushed or restarted without
          persistence) or stuck in-progress on a worker that died before claiming it.
        """
        svc = self.svc
        redis = svc.redis
        assert redis is not None
        n = 0
        for job_id, token in await store.expire_leases(svc.sessionmaker):
            await self._enqueue(job_id, token)
            n += 1
        stale = await store.stale_queued(
            svc.sessionmaker, older_than=svc.settings.reconcile_stale_sec
        )
        if not stale:
            return n
        async with redis.pipeline(transaction=False) as pipe:
            for job_id, token, arq_job_id in stale:
                aid = arq_job_id or store.arq_id(job_id, token)
                pipe.exists(job_key_prefix + aid)
                pipe.exists(in_progress_key_prefix + aid)
            found = await pipe.execute()
        for i, (job_id, token, _) in enumerate(stale):
            has_job, in_progress = found[2 * i], found[2 * i + 1]
            if has_job and not in_progress:
                continue  # waiting its turn in the queue
            new = await store.bump_queued(svc.sessionmaker, job_id, token)
            if new is not None:
                log.info("job %s: lost from Redis, re-enqueued", job_id)
                await self._enqueue(job_id, new)
                n += 1
        return n


# Reads the due part of the queue, marks up to ARGV[3] jobs not already running as in
# progress (arq's own key, so arq's bookkeeping stays valid) and returns
# [number read, id, score, payload, id, score, payload, ...] of those it claimed
# (payload: the arq job record, false when it has expired).
_CLAIM_LUA = (
    """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[4])
local out = {#due / 2}
local want = tonumber(ARGV[3])
for i = 1, #due, 2 do
  if (#out - 1) / 3 >= want then break end
  local id = due[i]
  if redis.call('SET', '"""
    + in_progress_key_prefix
    + """' .. id, '1', 'NX', 'PX', ARGV[2]) then
    out[#out + 1] = id
    out[#out + 1] = due[i + 1]
    out[#out + 1] = redis.call('GET', '"""
    + job_key_prefix
    + """' .. id)
  end
end
return out
"""
)


class SkillJobsWorker(Worker):
    """arq's worker, woken by a pub/sub message the moment work is enqueued instead of
    polling every 0.5 s (the idle poll stays as a safety net for delayed retries)."""

    def __init__(
        self,
        *args: Any,
        idle_poll: float = 0.5,
        wake_channel: str,
        runner: JobRunner | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(*args, poll_delay=idle_poll, **kw)
        self.runner = runner
        self._wake = asyncio.Event()
        self._wake_channel = wake_channel
        self._last_read = 0
        self._claim_script: Any = None
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
            payload = await self.pool.get(job_key_prefix + job_id)
        if not payload:
            log.warning("arq job %s: record expired or missing, dropped", job_id)
            self.jobs_failed += 1
            await self._cleanup.submit((job_id, True))
            return
        try:
            name, args, kwargs, _, _ = deserialize_job_raw(
                payload, deserializer=self.job_deserializer
            )
            function = self.functions[name]
        except (SerializationError, KeyError) as exc:
            log.error("arq job %s: unusable (%s: %s), dropped", job_id, type(exc).__name__, exc)
            self.jobs_failed += 1
            await self._cleanup.submit((job_id, True))
            return
        ctx = {**self.ctx, "job_id": job_id, "job_try": 1, "score": score}
        try:
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
        # Not waited for: the in-progress key keeps the entry from running twice meanwhile,
        # and close() flushes what is left.
        self._cleanup.push((job_id, True))

    async def _cleanup_many(self, items: list[tuple[str, bool]]) -> list[None]:
        done = [job_id for job_id, finished in items if finished]
        keys = [in_progress_key_prefix + job_id for job_id, _ in items]
        for job_id in done:
            keys += [job_key_prefix + job_id, retry_key_prefix + job_id]
        async with self.pool.pipeline(transaction=True) as tr:
            tr.delete(*keys)
            if done:
                tr.zrem(self.queue_name, *done)
                tr.zrem(abort_jobs_ss, *done)
            await tr.execute()
        return [None] * len(items)

    def wake(self) -> None:
        self._wake.set()

    def _release_sem_dec_counter_on_complete(self) -> None:
        super()._release_sem_dec_counter_on_complete()
        if self._last_read:
            self._wake.set()  # a slot freed while work may be waiting

    async def _poll_iteration(self) -> None:
        """Find and claim due jobs in one Redis round trip (arq reads the queue, then runs a
        WATCH/MULTI transaction per job), start them, and tidy finished tasks."""
        free = self.max_jobs - self.job_counter
        if self.allow_pick_jobs and free > 0:
            if self._claim_script is None:
                self._claim_script = self.pool.register_script(_CLAIM_LUA)
            claimed = await self._claim_script(
                keys=[self.queue_name],
                args=[
                    timestamp_ms(),
                    int(self.in_progress_timeout_s * 1000),
                    free,
                    # entries running here are still in the queue: read past them
                    self.queue_read_limit + self.job_counter,
                ],
            )
            self._last_read = int(claimed[0])
            for i in range(1, len(claimed), 3):
                raw = claimed[i]
                job_id = raw.decode() if isinstance(raw, bytes) else str(raw)
                score, payload = int(float(claimed[i + 1])), claimed[i + 2] or None
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
                if self.burst:
                    if 0 <= self.max_burst_jobs <= self._jobs_started():
                        await asyncio.gather(*self.tasks.values())
                        if self.runner is not None:
                            await self.runner.wait_finishing()
                        return
                    if await self.pool.zcard(self.queue_name) == 0:
                        await asyncio.gather(*self.tasks.values())
                        if self.runner is not None:
                            await self.runner.wait_finishing()
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
        left is cancelled (and handed back to the queue by the job function)."""
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
        self._cancel_all()
        await asyncio.gather(*self.tasks.values(), *self._finishing(), return_exceptions=True)
        await self._cleanup.flush()
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


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _run_job(ctx: dict[str, Any], job_id: str, enqueue_token: int) -> str:
    runner: JobRunner = ctx["runner"]
    return await runner.run(job_id, int(enqueue_token))


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
                    data = msg["data"]
                    runner.cancel_local(data.decode() if isinstance(data, bytes) else str(data))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("cancel listener: %s", exc)
            await asyncio.sleep(1.0)


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
        from jobs.executor import Executor

        executor = Executor(
            settings=services.settings,
            registry=services.registry,
            sessionmaker=services.sessionmaker,
            box=services.box,
            http=services.http,
        )
    settings = services.settings
    wid = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    runner = JobRunner(
        services, executor, wid, max_finishing=2 * (max_jobs or services.settings.worker_max_jobs)
    )
    background: list[asyncio.Task[Any]] = []

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
        background.append(asyncio.create_task(_listen_cancels(runner)))
        if scheduler:
            with contextlib.suppress(ImportError):
                from chains.scheduler import Scheduler

                stop = asyncio.Event()
                ctx["scheduler_stop"] = stop
                background.append(asyncio.create_task(Scheduler(services).run_forever(stop)))
        log.info(
            "worker %s started: queue %s, max_jobs %s",
            wid,
            settings.queue_name,
            max_jobs or settings.worker_max_jobs,
        )

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        if "scheduler_stop" in ctx:
            ctx["scheduler_stop"].set()
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
    functions = [func(_run_job, name=FN_RUN_JOB, max_tries=1_000_000, timeout=timeout)]
    with contextlib.suppress(ImportError):
        from chains.runner import chain_job

        functions.append(func(chain_job, name=FN_RUN_CHAIN, max_tries=1_000_000, timeout=timeout))

    assert services.redis is not None
    return SkillJobsWorker(
        functions,
        redis_pool=services.redis,
        queue_name=settings.queue_name,
        wake_channel=settings.key(WAKE_CHANNEL),
        runner=runner,
        burst=burst,
        max_jobs=max_jobs or settings.worker_max_jobs,
        keep_result=0,
        handle_signals=handle_signals,
        job_completion_wait=int(settings.worker_grace_sec),
        on_startup=on_startup,
        on_shutdown=on_shutdown,
        ctx={},
        log_results=False,
    )


__all__ = ["JobRunner", "SkillJobsWorker", "build_worker", "retry_db"]
