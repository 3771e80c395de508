"""Group commit of background dispatches: many concurrent receipts, one write per batch.

Under a chat platform's peak the front door gets many background dispatches at once. Done
one by one, each is a database transaction and a Redis round trip, and on SQLite each
transaction queues for the one write lock the worker also needs. The intake of a process
coalesces the dispatches that arrive while its previous batch is being written
(:class:`jobs.batching.Batcher`): one transaction records the whole batch
(:func:`jobs.queue.store.record_jobs`), then one Redis round trip enqueues it
(:func:`jobs.queue.broker.enqueue_many`). An idle system pays no added latency.

The receipt rule is unchanged (SPEC §4): a caller's :func:`submit` returns only after its
job is committed *and* enqueued. When the batch transaction fails, each job of the batch is
written again on its own, so a job the database refuses fails only its own caller, and a
caller whose job could not be recorded gets the database's error with nothing recorded.
When the enqueue fails, every job of that batch is closed as failed (never run) and its
caller gets :class:`Unqueued`.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

from jobs.batching import Batcher
from jobs.constants import FN_RUN_JOB
from jobs.db import DB_UNAVAILABLE, is_sqlite, once_more_if_disconnected
from jobs.queue import broker, store
from jobs.services import Services

log = logging.getLogger("skilljobs.dispatch")

MAX_BATCH = 256


class Unqueued(Exception):
    """The job was recorded but the queue refused it: it was closed as failed, never run."""

    def __init__(self, job_id: str, cause: BaseException) -> None:
        super().__init__(f"enqueue of job {job_id} failed: {cause}")
        self.job_id = job_id
        self.cause = cause


@dataclass
class NewJob:
    """One background dispatch: the row to insert (``values`` as ``store.record_job``
    takes it), its origin chat session, its live event and its lane metadata."""

    values: dict[str, Any]
    session: dict[str, Any] | None
    event: tuple[str, str] | None
    meta: dict[str, Any] | None

    @property
    def job_id(self) -> str:
        return str(self.values["id"])


class Intake:
    """The batched write path of one process's background dispatches (one per Services)."""

    def __init__(self, services: Services) -> None:
        self._services = weakref.ref(services)
        # SQLite has one writer: a second batch in flight would only wait for the lock.
        # PostgreSQL: a few batches in flight, so a dispatch seldom waits for a whole
        # round trip before its own batch starts.
        sqlite = is_sqlite(services.engine)
        concurrency = 1 if sqlite else 4
        self.batcher: Batcher[NewJob, BaseException | None] = Batcher(
            self._flush, max_batch=MAX_BATCH, concurrency=concurrency, name="dispatch-intake"
        )

        # The configuration read each background dispatch bakes into its job's context.
        self.configs: Batcher[tuple[str, str], dict[str, Any]] = Batcher(
            self._read_configs,
            max_batch=MAX_BATCH,
            concurrency=2 if sqlite else 4,
            name="dispatch-configs",
        )

    async def _read_configs(self, wanted: list[tuple[str, str]]) -> list[dict[str, Any]]:
        from jobs.catalog.configs import ConfigStore

        svc = self.services
        return await ConfigStore(svc.sessionmaker, svc.box).get_many(wanted)

    @property
    def services(self) -> Services:
        svc = self._services()
        if svc is None:  # pragma: no cover - the intake lives as long as its Services
            raise RuntimeError("the services of this intake are closed")
        return svc

    async def submit(self, job: NewJob) -> None:
        """Record and enqueue ``job``; returns once both are done. Raises the database's
        error when it could not be recorded (nothing was), :class:`Unqueued` when it was
        recorded but could not be enqueued (it is closed as failed)."""
        outcome = await self.batcher.submit(job)
        if outcome is not None:
            raise outcome

    async def _flush(self, jobs: list[NewJob]) -> list[BaseException | None]:
        outcomes = await self._record(jobs)
        recorded = [j for j, o in zip(jobs, outcomes, strict=True) if o is None]
        if not recorded:
            return outcomes
        unqueued = await self._enqueue(recorded)
        if unqueued is not None:
            failed = {j.job_id: Unqueued(j.job_id, unqueued) for j in recorded}
            outcomes = [failed.get(j.job_id, o) for j, o in zip(jobs, outcomes, strict=True)]
        return outcomes

    async def _record(self, jobs: list[NewJob]) -> list[BaseException | None]:
        sm = self.services.sessionmaker
        try:
            await once_more_if_disconnected(
                store.record_jobs, sm, [(j.values, j.session) for j in jobs]
            )
            return [None] * len(jobs)
        except DB_UNAVAILABLE:
            raise  # the database is away: every caller gets the error, nothing was written
        except Exception as exc:
            if len(jobs) == 1:
                return [exc]
            log.warning("dispatch batch of %d refused (%s): recording one by one", len(jobs), exc)
        out: list[BaseException | None] = []
        for j in jobs:
            try:  # alone, in its own transaction: its session row only with its job row
                await store.record_jobs(sm, [(j.values, j.session)])
                out.append(None)
            except Exception as exc:
                out.append(exc)
        return out

    async def _enqueue(self, jobs: list[NewJob]) -> BaseException | None:
        """Enqueue the recorded ``jobs`` in one round trip; on failure close them all as
        failed (an entry that did reach Redis is then refused by the claim: its lease
        token moved on) and return the error."""
        svc = self.services
        try:
            await broker.enqueue_many(
                svc,
                [(store.arq_id(j.job_id, 0), FN_RUN_JOB, (j.job_id, 0)) for j in jobs],
                metas=[j.meta for j in jobs],
                events=[j.event for j in jobs],
            )
            return None
        except Exception as exc:
            log.warning("enqueue of %d dispatched jobs failed: %s", len(jobs), exc)
            reason = f"queue unavailable: {exc}"
            async with svc.sessionmaker() as s:
                for j in jobs:
                    await store.mark_failed_unqueued(s, j.job_id, reason)
            return exc


# One intake per Services object (Services is not hashable: keyed by identity, checked).
_intakes: dict[int, tuple[weakref.ref[Services], Intake]] = {}


def intake_of(services: Services) -> Intake:
    """The intake of ``services`` (built on first use, shared by every dispatcher)."""
    found = _intakes.get(id(services))
    if found is not None and found[0]() is services:
        return found[1]
    intake = Intake(services)
    _intakes[id(services)] = (weakref.ref(services, _forget(id(services))), intake)
    return intake


def _forget(key: int) -> Any:
    def drop(_ref: Any) -> None:
        _intakes.pop(key, None)

    return drop


async def prefetch_configs(services: Services, role_id: str, skill: str) -> dict[str, Any]:
    """``ConfigStore.prefetch``, read together with the concurrent dispatches' (one
    statement per batch)."""
    return await intake_of(services).configs.submit((role_id, skill))


async def submit(services: Services, job: NewJob) -> None:
    """:meth:`Intake.submit` on the intake of ``services``."""
    await intake_of(services).submit(job)
