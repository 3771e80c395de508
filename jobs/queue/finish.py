"""The finishing stage of a job whose skill has finished: post-processing, delivery and
the fenced record, beside the worker's slots; faults of the database or Redis are waited
out, never recorded as the job's failure."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from jobs import texts
from jobs.context import job_workspace
from jobs.db import db_unavailable
from jobs.envelope import offload
from jobs.finishing import Finished
from jobs.models import FAILED, QUEUED, SUCCEEDED, TIMED_OUT, AttemptOutcome, JobRow
from jobs.queue import incidents, store
from jobs.queue.heartbeat import LeaseKeeper
from jobs.queue.runstate import retry_db

if TYPE_CHECKING:
    from jobs.execution.executor import Outcome

log = logging.getLogger("skilljobs.worker")

T = TypeVar("T")


class ResultNotStored(RuntimeError):
    """The skill's result could not be made storable (offload to a file failed)."""


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


class FinishingStage(LeaseKeeper):
    """Post-processes, delivers and records the jobs whose skill has finished."""

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

    async def _finish(self, job: JobRow, token: int, outcome: Outcome) -> str:
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
            attempt_outcome=AttemptOutcome.REQUEUED,
            patience=10.0,
        )
        if new is not None:
            with contextlib.suppress(Exception):
                await self._enqueue(job.id, new, job=job)
                self.event(job.id, QUEUED, job.skill)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
