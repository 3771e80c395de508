"""One worker process's jobs, from claim to record: the job function's body.

A claim fences every later write (``jobs.queue.store``); the skill runs through the shared
executor; a transient failure is re-queued under the retry policy and the breaker; a
finished skill goes on to the finishing stage (post-processing, delivery, the fenced
record) beside the worker's slots. Heartbeats renew the leases of everything held here,
and the reconciler re-enqueues what Redis lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from arq.connections import ArqRedis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from jobs import phases, sendscope, telemetry, texts
from jobs.batching import Batcher
from jobs.constants import FN_RUN_JOB, MAX_RUNS, PRIORITY_INTERACTIVE
from jobs.context import job_workspace
from jobs.db import DB_UNAVAILABLE, db_unavailable
from jobs.envelope import offload
from jobs.execution import subproc
from jobs.execution.inprocess import RUN_TASKS, SKILL_ENDED
from jobs.finishing import Finished, Finisher, Notices
from jobs.models import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, TIMED_OUT, JobRow
from jobs.queue import broker, incidents, limits, lost, prefetch, store
from jobs.queue.stall import StallWatch
from jobs.runscope import RunScope, begin_run
from jobs.services import Services

if TYPE_CHECKING:
    from jobs.execution.executor import Executor

log = logging.getLogger("skilljobs.worker")


class ResultNotStored(RuntimeError):
    """The skill's result could not be made storable (offload to a file failed)."""


T = TypeVar("T")

DB_ERRORS = DB_UNAVAILABLE


class WorkerContext(TypedDict, total=False):
    """What arq hands our job functions: the worker's wiring (set at start-up) and the
    entry being run."""

    services: Services
    executor: Executor
    worker_id: str
    runner: JobRunner
    redis: ArqRedis
    job_id: str
    job_try: int
    score: int
    priority: int


def is_fault(exc: BaseException) -> bool:
    """A fault of what the job runs on (the database or Redis away, a connection lost or
    timed out), not of the job: a finishing stage waits it out and never records it as the
    job's failure (the database is the record; what Redis held is rebuilt from it)."""
    if db_unavailable(exc):
        return True
    return isinstance(
        exc, RedisConnectionError | RedisTimeoutError | ConnectionError | TimeoutError
    )


class FinishAbandoned(Exception):
    """The finishing stage stopped waiting out a fault: this attempt lost its job's lease
    (another worker has taken the job over and finishes it)."""


#: the reason the person is told when the run or its finishing stage failed (English form)
INTERNAL_NOTICE = texts.text("internal_reason")


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
        except Exception as exc:
            if not db_unavailable(exc) or time.monotonic() > deadline:
                raise
            log.warning(
                "%s: database unavailable (%s), retrying in %.1fs",
                what,
                exc.__class__.__name__,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


class JobRunner:
    """Per-process state shared by the job functions and the background loops."""

    def __init__(
        self,
        services: Services,
        executor: Executor,
        worker_id: str,
        *,
        finisher: Finisher,
        notices: Notices,
        max_finishing: int = 200,
        linger: float = 0.01,
    ) -> None:
        self.svc = services
        self.executor = executor
        self.worker_id = worker_id
        #: post-processes, delivers and records a finished job (``delivery.pipeline``)
        self.finisher = finisher
        #: the "still working" and "cancelled" notices (``delivery.notices``)
        self.notices = notices
        self.held: dict[str, int] = {}  # job id → lease token
        self.inner: dict[str, asyncio.Task[Any]] = {}  # job id → running executor task
        # job id → the in-process skill tasks of its run (jobs.execution.inprocess.RUN_TASKS)
        self.skill_tasks: dict[str, set[asyncio.Task[Any]]] = {}
        self.cancel_asked: set[str] = set()
        self.lost: set[str] = set()
        self.scopes: dict[str, RunScope | None] = {}  # job id → its run's workspace snapshot
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
        # finishing steps tried again because a fault stopped them (/metrics)
        self.finish_retries = 0
        # Jobs whose skill was stopped because this process was paused long enough for a
        # peer to presume it dead (see :meth:`resumed`); handed back, never recorded.
        self.suspect: set[str] = set()
        self.last_beat = time.time()  # the last heartbeat key written
        # What the workers page shows of this process (in its heartbeat key).
        self.started_at = time.time()
        self.concurrency = 0  # skills run at once (set by build_worker)
        self.processed = 0  # jobs this process recorded finished
        self.failed = 0  # of those, failed or timed out
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
        #: the event-loop stall detector, when the worker runs one (its counts are
        #: published with the heartbeat)
        self.stall: StallWatch | None = None
        #: telling the origins of jobs failed as lost (``jobs.queue.lost``)
        self.telling: set[asyncio.Task[None]] = set()
        #: arq ids the reconciler found started in Redis and still queued in the database:
        #: re-enqueued only when the next pass finds them so again
        self._started_unclaimed: set[str] = set()
        #: frees the limit slots of an arq entry once its job has left ``running`` (set by
        #: the worker when SKILLJOBS_LIMITS is configured)
        self.slots: Batcher[str, None] | None = None
        #: the worker's slots, which jobs claimed ahead wait for (``jobs.queue.prefetch``;
        #: None: every claimed job starts at once)
        self.gate: prefetch.StartGate | None = None
        #: peers whose heartbeat keys :meth:`peer_just_gone` looks at (from the workers
        #: table, read at most once a second), and since when each one's key is gone
        self._peers: list[str] = []
        self._peers_read = 0.0
        self._gone_since: dict[str, float] = {}

    # --- the job function ----------------------------------------------------------------

    async def run(
        self, job_id: str, enqueue_token: int, priority: int = PRIORITY_INTERACTIVE
    ) -> str:
        asked_at = time.time()
        claim = await retry_db("claim", self._claim, job_id, enqueue_token)
        if claim is None:
            return "superseded"  # cancelled, re-enqueued or already running elsewhere
        job, token = claim.job, claim.token
        self.held[job_id] = token
        self.lease_until[job_id] = asked_at + self.certain_for
        handed_off = False
        gate, entered = self.gate, False

        def free_slot() -> None:
            """The slot goes to the next job once: when the skill body ends (an in-process
            skill, ``SKILL_ENDED``), else when this job leaves the slot below."""
            nonlocal entered
            if entered:
                entered = False
                assert gate is not None
                gate.leave()

        try:
            if gate is not None:  # claimed ahead of a free slot: wait for one
                refused = await self._start_turn(gate, job, token, priority)
                if refused is not None:
                    return refused
                entered = True
                SKILL_ENDED.set(free_slot)  # (this job's own task: a context of its own)
            telemetry.queue_wait(job, claim.attempt)
            try:
                running = self._run_claimed(job, token, claim.attempt)
                done = await telemetry.job_span(
                    "skilljobs.run", running, job, attempt=claim.attempt
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never only logged: the job would be lost, re-run
                log.exception("job %s: running it failed", job_id)
                await asyncio.shield(self._fail_internal(job, token, "run", exc))
                return FAILED
            if isinstance(done, str):
                return done
            # The skill has finished: its post-processing and delivery go on in the
            # finishing stage, and this slot takes the next job.
            try:
                await self._finish_gate().acquire()
            except asyncio.CancelledError:  # stopping while the finishing stage is full
                await asyncio.shield(
                    self._hand_back(job, token, "worker stopped before it finished")
                )
                raise
            finish = telemetry.job_span("skilljobs.finish", self._finish(job, token, done), job)
            task = asyncio.create_task(finish)
            self.finishing.add(task)
            task.add_done_callback(self._finished)
            if self.slots is not None:
                aid = store.arq_id(job_id, enqueue_token)
                task.add_done_callback(lambda _t: self.release_slots(aid))
            handed_off = True
            return "finishing"
        finally:
            free_slot()
            if not handed_off:
                self._release(job_id)

    async def _claim(self, job_id: str, enqueue_token: int) -> store.Claim | None:
        """The batched claim; stopping while it is in flight gives back what it took (a
        claim already sent is written, and nobody would run the job)."""
        fut = self.claims.push((job_id, enqueue_token))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not fut.cancelled():
                with contextlib.suppress(Exception):
                    got = await asyncio.shield(fut)
                    if got is not None:
                        await asyncio.shield(self._unclaim(got.job, got.token))
            raise

    async def _start_turn(
        self, gate: prefetch.StartGate, job: JobRow, token: int, priority: int
    ) -> str | None:
        """Wait for a slot of the worker; None once it is this job's, else the job is
        settled here without its skill starting (cancelled, lost, or given back to the
        queue unstarted) and this says how."""
        try:
            why = await gate.enter(job.id, priority)
        except asyncio.CancelledError:  # stopping: back to the queue, never started
            await asyncio.shield(self._unclaim(job, token))
            raise
        if why == prefetch.START:
            margin = self.certain_for / 3
            if job.id in self.lost:
                why = prefetch.LOST
            elif job.id in self.suspect:
                why = prefetch.SUSPECT
            elif time.time() >= self.lease_until.get(job.id, 0.0) - margin and not (
                await retry_db("lease", store.holds_lease, self.svc.sessionmaker, job.id, token)
            ):
                why = prefetch.LOST  # renewals failed while it waited, and the lease is gone
            elif job.id in self.cancel_asked:
                why = prefetch.CANCEL
            if why == prefetch.START:
                return None
            gate.leave(ran=False)
        if why == prefetch.LOST:
            log.warning("job %s: lease lost before it started, not run here", job.id)
            return "lost"
        if why == prefetch.CANCEL:
            await asyncio.shield(
                self._record(job, token, CANCELLED, None, "cancelled by an operator", None)
            )
            await asyncio.shield(self._cancel_notice(job))
            return CANCELLED
        await asyncio.shield(self._unclaim(job, token))
        return "lost" if why == prefetch.SUSPECT else "handed back"

    async def _unclaim(self, job: JobRow, token: int) -> None:
        """Give a claimed job whose skill never started back to the queue (fenced), where it
        was: any worker may take it."""
        new = await retry_db(
            "unclaim", store.unclaim, self.svc.sessionmaker, job.id, token, patience=10.0
        )
        if new is not None:
            with contextlib.suppress(Exception):
                behind = float(getattr(job, "queued_at", None) or time.time()) - time.time()
                await self._enqueue(job.id, new, defer=min(0.0, behind), job=job)

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
        self.skill_tasks.pop(job_id, None)
        self.cancel_asked.discard(job_id)
        self.lost.discard(job_id)
        self.suspect.discard(job_id)
        scope = self.scopes.pop(job_id, None)
        if scope is not None:
            scope.close()

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

    async def _run_claimed(self, job: JobRow, token: int, attempt: int) -> Any:
        """Run the skill; a str when the job is settled here (cancelled, lost, re-queued),
        else the skill's outcome for the finishing stage."""
        svc = self.svc
        job_id = job.id
        input_data = svc.box.unseal(job.input or {})
        ctx = svc.box.unseal(job.context or {})
        self.scopes[job_id] = begin_run(svc.settings, job, ctx)
        subproc.RUN_OWNER.set(job_id)  # its processes are killed at once if the lease is lost
        working = self.notices.working(svc, job, self._fence(job, token))
        ctx["progress"] = working.progress  # the skill may say it is busy (told once)
        try:
            return await self._run_skill(job, token, attempt, input_data, ctx)
        finally:
            await working.close()

    async def _run_skill(
        self,
        job: JobRow,
        token: int,
        attempt: int,
        input_data: dict[str, Any],
        ctx: dict[str, Any],
    ) -> Any:
        svc = self.svc
        job_id = job.id
        # skill-initiated sends of this run are ledgered under the job (jobs.sendscope)
        run = self.executor.execute(job.skill, input_data, ctx)
        skill_tasks: set[asyncio.Task[Any]] = set()
        RUN_TASKS.set(skill_tasks)  # (this job's own task: a context of its own)
        self.skill_tasks[job_id] = skill_tasks
        run = phases.reporting(self._phase_reporter(job, token), run)  # preparing environment
        owner = f"{self.worker_id}#{token}"
        # (a task, not started eagerly like the skill's own: a run that ends in its first
        # step would then take its whole job in one turn of the loop, and a claimed batch
        # of them runs back to back while their database round trips wait: -4 % no-op drain)
        task = asyncio.create_task(sendscope.run_in(job_id, owner, run, svc.outbox))
        self.inner[job_id] = task
        # Published while the skill starts, not before: the event is for people watching.
        self.event(job_id, RUNNING, job.skill)
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
            if job_id in self.suspect:
                # Fenced: a no-op when a peer has taken the job over meanwhile.
                await asyncio.shield(
                    self._hand_back(job, token, "worker paused past its heartbeat, handed back")
                )
                return "lost"
            await asyncio.shield(
                self._record(job, token, CANCELLED, None, "cancelled by an operator", None)
            )
            await asyncio.shield(self._cancel_notice(job))
            return CANCELLED

        # what the run printed, kept on its attempt (no statement when it printed nothing)
        await retry_db(
            "output",
            store.record_output,
            svc.sessionmaker,
            job_id,
            token,
            outcome.stdout,
            outcome.stderr,
        )
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
                    await self._enqueue(job_id, new, defer=delay, job=job)
                    self.event(job_id, QUEUED, job.skill)
                    return "retrying"
                return "lost"

        return outcome

    async def _finish(self, job: JobRow, token: int, outcome: Any) -> str:
        """The finishing stage of one job: post-processing, delivery, the fenced record.

        No path of it only logs: whatever it raises ends the job ``failed`` (``internal``),
        naming the stage and the exception, and the person is told in one short line.
        """
        job_id = job.id
        status = outcome.status if outcome.status in (SUCCEEDED, FAILED, TIMED_OUT) else FAILED
        result = outcome.result
        stage = "post-processing"
        try:
            await self._linger()
            # The database away (restarting, out of connections) is waited out: every step
            # is idempotent (the ledger sends nothing twice). Anything else it raises ends
            # the job failed/internal below, the skill's own result kept in the record:
            # recorded as done without its delivery, the result would be lost to its reader.
            post = await self._through_faults(
                job,
                "post-processing",
                self._postprocess,
                job,
                token,
                result,
                normalized=outcome.status == SUCCEEDED,
            )
            result = post.result
            stage = "record"
            fetches = post.fetches
            await self._record(
                job, token, status, result, outcome.error, outcome.error_type, fetches
            )
            return status
        except asyncio.CancelledError:
            # Worker shutdown (grace period over) mid-delivery: hand the job back; the
            # delivery ledger keeps the next attempt from sending anything twice.
            await asyncio.shield(self._hand_back(job, token, "worker stopped before it finished"))
            raise
        except FinishAbandoned:
            log.warning("job %s: lease lost while its finish waited out a fault", job_id)
            return "lost"
        except Exception as exc:
            log.exception("job %s: finishing stage (%s) failed", job_id, stage)
            kept = result if stage == "post-processing" else None
            await asyncio.shield(self._fail_internal(job, token, stage, exc, kept=kept))
            return FAILED
        finally:
            self._release(job_id)

    async def _through_faults(
        self, job: JobRow, what: str, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any
    ) -> T:
        """Run a step of the finishing stage, again and again while a fault (``is_fault``)
        stops it: after the skill ran, a fault may delay its finish, never fail it. Every
        step is idempotent (the ledger sends nothing twice). Gives up only when this attempt
        no longer holds the job (:class:`FinishAbandoned`): the worker that took it over
        finishes it; if this worker dies meanwhile, its job is taken over like any other."""
        delay = 0.2
        cap = max(0.5, float(self.svc.settings.finish_retry_max_sec))
        while True:
            try:
                return await fn(*args, **kw)
            except Exception as exc:
                if not is_fault(exc):
                    raise
                if job.id in self.lost or not await self._still_held(job):
                    raise FinishAbandoned(job.id) from exc
                self.finish_retries += 1
                log.warning(
                    "job %s: %s delayed by a fault (%s: %s), trying again in %.1fs",
                    job.id,
                    what,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, cap)

    async def _still_held(self, job: JobRow) -> bool:
        """Does this attempt still hold ``job``'s lease? While the database is away too, it is
        taken to (nobody can take a job over without the database)."""
        token = self.held.get(job.id)
        if token is None:
            return False
        try:
            return await store.holds_lease(self.svc.sessionmaker, job.id, token)
        except Exception as exc:
            if db_unavailable(exc):
                return True
            raise

    async def _fail_internal(
        self,
        job: JobRow,
        token: int,
        stage: str,
        exc: BaseException,
        *,
        kept: dict[str, Any] | None = None,
    ) -> None:
        """End a job whose run or finishing stage raised: ``failed``/``internal``, the person told
        through the normal failure delivery, the record retried while the database is
        away (never abandoned). ``kept``: the skill's result, recorded as ``skill_result``
        (post-processing failed after the skill had answered)."""
        where = "while running it" if stage == "run" else f"in the finishing stage ({stage})"
        error = f"internal error {where}: {type(exc).__name__}: {exc}"
        if job.id not in self.lost:
            lang = texts.language_of(self.svc.settings, self.svc.box.unseal(job.context or {}))
            notice = {
                "ok": False,
                "error": error,
                "user_message": texts.text("internal_reason", lang),
                "error_type": "internal",
            }
            try:
                await self._postprocess(job, token, notice)
            except Exception as dexc:  # the record below still tells the operator
                log.warning("job %s: failure notice not delivered: %r", job.id, dexc)
        record: dict[str, Any] = {"ok": False, "error": error}
        if kept is not None:
            record["skill_result"] = kept
        outcome = store.Outcome(job.id, token, FAILED, record, error, "internal")
        try:
            ok = await retry_db(
                "finish (internal)",
                store.finish_many,
                self.svc.sessionmaker,
                [outcome],
                patience=float("inf"),
            )
        except Exception:
            log.exception("job %s: the failure could not be recorded either", job.id)
            return
        if ok and ok[0]:
            self.event(job.id, FAILED, job.skill)
            await incidents.note_failure(
                self.svc.sessionmaker, job.id, job.skill, "internal", error
            )

    async def _cancel_notice(self, job: JobRow) -> None:
        """Tell the person the job was cancelled (once, through the ledger; off-able)."""
        await self.notices.cancelled(self.svc, job)

    async def _postprocess(
        self, job: JobRow, token: int, result: dict[str, Any], *, normalized: bool = False
    ) -> Finished:
        scope = self.scopes.get(job.id)
        return await self.finisher(
            self.svc, job, result, fence=self._fence(job, token), scope=scope, normalized=normalized
        )

    def _fence(self, job: JobRow, token: int) -> Callable[[], Awaitable[bool]]:
        """Whether this attempt still holds the job's lease (checked before each send)."""
        margin = self.certain_for / 3  # room for clock skew between hosts

        async def fence() -> bool:
            # Nobody can take a lease before it expires or before our heartbeat has been
            # missing for 3 intervals, so while both are comfortably ahead the answer is
            # known without asking the database.
            if job.id in self.lost:
                return False
            if time.time() < self.lease_until.get(job.id, 0.0) - margin:
                return True
            return await store.holds_lease(self.svc.sessionmaker, job.id, token)

        return fence

    async def _record(
        self,
        job: JobRow,
        token: int,
        status: str,
        result: dict[str, Any] | None,
        error: str | None,
        error_type: str | None,
        fetches: list[Any] | None = None,
    ) -> None:
        stored = self._for_storage(job, result)
        outcome = store.Outcome(job.id, token, status, stored, error, error_type, fetches=fetches)
        try:
            ok = await retry_db("finish", self.outcomes.submit, outcome, patience=float("inf"))
        except Exception as exc:
            if db_unavailable(exc):
                raise
            # The batch failed for a reason other than the database being away: perhaps
            # another job's outcome. Alone, this outcome says whether it is the cause.
            log.warning("job %s: batched record failed (%r), recording alone", job.id, exc)
            (ok,) = await retry_db(
                "finish (alone)",
                store.finish_many,
                self.svc.sessionmaker,
                [outcome],
                patience=float("inf"),
            )
        if ok:
            self.event(job.id, status, job.skill)
            self.processed += 1
            if status in (FAILED, TIMED_OUT):
                self.failed += 1
                await incidents.note_failure(
                    self.svc.sessionmaker, job.id, job.skill, error_type or status, error
                )
        else:
            log.warning("job %s: not recorded, this attempt no longer holds the lease", job.id)

    def _for_storage(self, job: JobRow, result: dict[str, Any] | None) -> dict[str, Any] | None:
        if result is None:
            return None

        workspace = job_workspace(self.svc.settings.resolved_workspace_root, job)
        try:
            result = offload(result, workspace, job.skill)
        except Exception as exc:
            # never "succeeded" with a stub in place of the result (C24): the job ends
            # failed with the reason, and the person is told
            raise ResultNotStored(f"the result could not be stored: {exc}") from exc
        # Stored as is: the executor scrubbed the job's secret values from it, and result
        # fields are data, not secrets by name (C12).
        return result

    async def _hand_back(self, job: JobRow, token: int, reason: str) -> None:
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
                await self._enqueue(job.id, new, job=job)
                self.event(job.id, QUEUED, job.skill)

    def _phase_reporter(self, job: JobRow, token: int) -> phases.Reporter:
        """Records what the run does before its skill runs, on the row (fenced) and live."""

        async def report(name: str | None, detail: str) -> None:
            await store.set_phase(self.svc.sessionmaker, job.id, token, name, detail)
            self.event(job.id, RUNNING, job.skill)

        return report

    def event(self, job_id: str, status: str, skill: str) -> None:
        """Tell live dashboards (best effort: the row is the record)."""
        if self.svc.redis is None:
            return
        self.events.push((job_id, status, skill))  # nobody waits for a live event

    async def _publish_events(self, events: list[tuple[str, str, str]]) -> list[None]:
        await broker.publish_events(self.svc, events)
        return [None] * len(events)

    def release_slots(self, arq_id: str) -> None:
        """The job of entry ``arq_id`` has left ``running``: free its limit slots."""
        if self.slots is not None:
            self.slots.push(arq_id)

    async def _enqueue(
        self, job_id: str, token: int, defer: float = 0.0, job: JobRow | None = None
    ) -> None:
        # The lane and limit keys travel with the entry (rebuilt from the row here).
        if job is None:
            job = await store.get_job(self.svc.sessionmaker, job_id)
        await broker.enqueue(
            self.svc,
            FN_RUN_JOB,
            job_id,
            token,
            job_id=store.arq_id(job_id, token),
            defer=defer,
            meta=limits.job_meta(job) if job is not None else None,
        )

    # --- background loops ----------------------------------------------------------------

    def cancel_local(self, job_id: str) -> bool:
        task = self.inner.get(job_id)
        if task is None or task.done():
            if self.gate is not None and self.gate.refuse(job_id, prefetch.CANCEL):
                self.cancel_asked.add(job_id)  # claimed ahead: recorded cancelled, never run
                return True
            return False
        self.cancel_asked.add(job_id)
        task.cancel()
        return True

    @property
    def certain_for(self) -> float:
        """How long after a renewal our lease is certainly ours: until it expires, or
        until peers may presume us dead, whichever comes first."""
        return min(self.svc.settings.worker_lease_sec, self.missing_after)

    def resumed(self) -> None:
        """This process was continued after a stop (SIGCONT). When it was stopped long
        enough for peers to presume it dead, its skills must not go on to complete as if
        nothing happened (a peer may be running them again): they are stopped before they
        take another step, and their jobs handed back (fenced)."""
        gap = time.time() - self.last_beat
        if gap < self.missing_after - 0.5:  # (the key expires 3 intervals + 1 s after its write)
            return
        for job_id in list(self.held):
            if self.gate is not None and self.gate.refuse(job_id, prefetch.SUSPECT):
                self.suspect.add(job_id)  # claimed ahead, not started: given back unstarted
        # Before anything else: a peer may be running these jobs again already.
        subproc.kill_owned(job_id for job_id, task in self.inner.items() if not task.done())
        for job_id, task in list(self.inner.items()):
            if not task.done():
                log.warning(
                    "job %s: this worker was paused %.1fs (peers may have taken over), "
                    "stopping its run",
                    job_id,
                    gap,
                )
                self.suspect.add(job_id)
                task.cancel()
                for inner in self.skill_tasks.get(job_id, ()):
                    inner.cancel()  # now, before their own wake-ups run

    @property
    def missing_after(self) -> float:
        """Seconds without a heartbeat after which a worker is presumed dead: 3 intervals,
        plus a second for scheduling jitter (a worker paused 5 s is not presumed dead)."""
        return 3 * self.svc.settings.worker_heartbeat_sec + 1.0

    def vitals(self) -> dict[str, Any]:
        """Concurrency, counts, memory, start time and version, for the workers page."""
        return {
            "concurrency": self.concurrency,
            "processed": self.processed,
            "failed": self.failed,
            "rss_bytes": rss_bytes(),
            "started_at": self.started_at,
            "version": VERSION,
        }

    async def heartbeat_once(self) -> None:
        s = self.svc.settings
        if self.svc.redis is not None:
            # First and on its own: a database outage must not silence it, or peers
            # would take over the jobs of a worker that is alive.
            try:
                await broker.beat(
                    self.svc,
                    self.worker_id,
                    {
                        "id": self.worker_id,
                        "running": sorted(self.held),
                        "at": time.time(),
                        "stalls": self.stall.stalls if self.stall else 0,
                        "max_lag_s": round(self.stall.max_lag, 3) if self.stall else 0.0,
                        **self.vitals(),
                    },
                    self.missing_after,
                )
                self.last_beat = time.time()
            except Exception as exc:
                log.warning("heartbeat key not written: %s: %s", type(exc).__name__, exc)
        held = dict(self.held)
        asked_at = time.time()
        found = await store.renew_leases(
            self.svc.sessionmaker, self.worker_id, held, s.worker_lease_sec
        )
        still, cancel = found.still, found.cancel
        for job_id in still:
            if job_id in self.lease_until:
                self.lease_until[job_id] = asked_at + self.certain_for
        for job_id in held:
            if job_id in still or job_id in found.busy:
                continue  # (busy: locked by a finish in flight; neither renewed nor lost)
            if job_id in self.held and self.held[job_id] == held[job_id]:
                # Someone else owns it now (we were presumed dead): stop, record nothing.
                self.lost.add(job_id)
                task = self.inner.get(job_id)
                if task and not task.done():
                    subproc.kill_owned([job_id])  # now: the new owner may have started it
                    task.cancel()
                elif self.gate is not None:
                    self.gate.refuse(job_id, prefetch.LOST)  # claimed ahead, not started
        for job_id in cancel:
            self.cancel_local(job_id)
        await store.worker_heartbeat(
            self.svc.sessionmaker,
            self.worker_id,
            socket.gethostname(),
            os.getpid(),
            sorted(self.held),
            stalls=(self.stall.stalls, round(self.stall.max_lag, 3)) if self.stall else None,
        )

    async def take_over_once(self) -> int:
        """Re-run the jobs of peers presumed dead, without waiting for their leases.

        Two signs, both needed: the peer's heartbeat key is gone from Redis *and* its
        leases were last renewed more than :attr:`missing_after` seconds ago. A Redis flush
        (keys gone, leases fresh) or a database outage (renewals late, keys fresh) is never
        taken for a death. The take-over is fenced like a lease expiry.
        """
        svc = self.svc
        s = svc.settings
        before = time.time() + s.worker_lease_sec - self.missing_after
        owners = await store.stale_owners(svc.sessionmaker, before, exclude=self.worker_id)
        if not owners:
            return 0
        dead = {o for o, up in zip(owners, await broker.alive(svc, owners), strict=True) if not up}
        if not dead:
            return 0
        n = 0
        failed: list[str] = []
        for job_id, token in await store.expire_leases(
            svc.sessionmaker, owners=dead, before=before, why="missed 3 heartbeats", failed=failed
        ):
            log.warning("job %s: its worker missed 3 heartbeats, re-run here", job_id)
            await self._enqueue(job_id, token)
            n += 1
        self.tell_lost(failed)
        return n

    async def peer_just_gone(self) -> bool:
        """Has a live peer's heartbeat key gone within the last 2 s? Looked at between the
        take-over passes (once a second: their read of the jobs table costs more than a
        Redis lookup), so that the worker can run them at once — a dead peer's leases go
        stale with its key, and the job of a worker killed with -9 is re-run within a
        quarter of a second of its death being certain (8.5 s after its last beat at the
        default heartbeat), not up to a second later. A key gone for longer is left to the
        regular passes (a Redis flush takes every key while the leases stay fresh: the
        take-over then finds nothing to do)."""
        svc = self.svc
        now = time.monotonic()
        if now - self._peers_read >= 1.0:
            self._peers_read = now
            since = time.time() - svc.settings.worker_lease_sec - self.missing_after
            self._peers = await store.live_peers(
                svc.sessionmaker, exclude=self.worker_id, since=since
            )
        if not self._peers:
            self._gone_since.clear()
            return False
        alive = await broker.alive(svc, self._peers)
        gone = {p for p, up in zip(self._peers, alive, strict=True) if not up}
        self._gone_since = {p: self._gone_since.get(p, now) for p in gone}
        return any(now - t <= 2.0 for t in self._gone_since.values())

    def tell_lost(self, job_ids: list[str]) -> None:
        """Tell the origins of jobs just failed as lost, beside the loops (a slow channel
        must not delay the next take-over)."""
        for job_id in job_ids:
            task = asyncio.create_task(lost.tell(self.svc, job_id, self.finisher))
            self.telling.add(task)
            task.add_done_callback(self.telling.discard)

    async def reconcile_once(self) -> int:
        """Re-enqueue what the database says must run but Redis no longer has.

        * running jobs whose lease expired (their worker died, e.g. ``kill -9``);
        * queued jobs whose arq entry is missing (Redis flushed or restarted without
          persistence) or stuck in-progress on a worker that died before claiming it (seen
          so at two passes in a row: a live worker's claim may be in flight at the first).
        """
        svc = self.svc
        redis = svc.redis
        assert redis is not None
        n = 0
        failed: list[str] = []
        for job_id, token in await store.expire_leases(svc.sessionmaker, failed=failed):
            await self._enqueue(job_id, token)
            n += 1
        self.tell_lost(failed)
        stale = await store.stale_queued(
            svc.sessionmaker, older_than=svc.settings.reconcile_stale_sec
        )
        if not stale:
            return n
        ids = [aid or store.arq_id(job_id, token) for job_id, token, aid in stale]
        states = await broker.entry_states(svc, ids)
        started_before, self._started_unclaimed = self._started_unclaimed, set()
        for (job_id, token, _), aid, (record, started) in zip(stale, ids, states, strict=True):
            if record and not started:
                continue  # waiting its turn in the queue
            if record and aid not in started_before:
                # Started but not claimed yet: a live worker claims within moments of
                # starting an entry (the read above may also predate its claim). Lost only
                # if it is still so at the next pass.
                self._started_unclaimed.add(aid)
                continue
            new = await store.bump_queued(svc.sessionmaker, job_id, token)
            if new is not None:
                log.info("job %s: lost from Redis, re-enqueued", job_id)
                await self._enqueue(job_id, new)
                n += 1
        return n


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("skilljobs")
    except PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        return "unknown"


VERSION = _version()


def rss_bytes() -> int:
    """This process's resident memory now (Linux), else its peak."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


__all__ = ["DB_ERRORS", "MAX_RUNS", "JobRunner", "db_unavailable", "retry_db"]
