"""One worker process's jobs, from claim to record: the job function's body.

A claim fences every later write (``jobs.queue.store``); the skill runs through the shared
executor; a transient failure is re-queued under the retry policy and the breaker; a
finished skill goes on to the finishing stage (post-processing, delivery, the fenced
record) beside the worker's slots. Heartbeats renew the leases of everything held here,
and the reconciler re-enqueues what Redis lost.

:class:`JobRunner` is the job function; its bases are the finishing stage
(``jobs.queue.finish``), the leases held (``jobs.queue.heartbeat``), the reconciler
(``jobs.queue.reconcile``) and the state they share (``jobs.queue.runstate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, TypedDict

from arq.connections import ArqRedis

from jobs import phases, sendscope, telemetry
from jobs.constants import MAX_RUNS, PRIORITY_INTERACTIVE
from jobs.db import db_unavailable
from jobs.execution import subproc
from jobs.execution.inprocess import RUN_TASKS, SKILL_ENDED
from jobs.models import CANCELLED, FAILED, QUEUED, RUNNING, JobRow
from jobs.queue import prefetch, store
from jobs.queue.finish import INTERNAL_NOTICE, FinishingStage
from jobs.queue.reconcile import Reconciler
from jobs.queue.runstate import DB_ERRORS, retry_db
from jobs.runscope import begin_run
from jobs.services import Services

if TYPE_CHECKING:
    from jobs.execution.executor import Executor

log = logging.getLogger("skilljobs.worker")


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


class JobRunner(FinishingStage, Reconciler):
    """A worker process's jobs: the job function's body, and (from its bases) the
    finishing stage, the leases held and the reconciler."""

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

    def _phase_reporter(self, job: JobRow, token: int) -> phases.Reporter:
        """Records what the run does before its skill runs, on the row (fenced) and live."""

        async def report(name: str | None, detail: str) -> None:
            await store.set_phase(self.svc.sessionmaker, job.id, token, name, detail)
            self.event(job.id, RUNNING, job.skill)

        return report


__all__ = [
    "DB_ERRORS",
    "INTERNAL_NOTICE",
    "MAX_RUNS",
    "JobRunner",
    "WorkerContext",
    "db_unavailable",
    "retry_db",
]
