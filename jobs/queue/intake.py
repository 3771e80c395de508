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
When the enqueue fails, every job of that batch is removed again (never run: a refusal is
not a failure) and its caller gets :class:`Unqueued`.

The configurations baked into jobs are cached with the configuration generation they were
read at (a trigger moves it on at every change of ``skill_configs``), so a dispatch reads
none of its own; the batch records its jobs only if that generation is still the current
one (checked in the batch's own statement), else nothing is written and its callers get
:class:`StaleConfig` and build their jobs again from a fresh read — a cached configuration
is never recorded after it changed. An idempotency key is claimed in the same statement
(:class:`KeyTaken` when it exists already).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.batching import Batcher
from jobs.catalog.configs import ConfigChanged, ConfigStore
from jobs.constants import FN_RUN_JOB
from jobs.db import DB_UNAVAILABLE, is_sqlite, once_more_if_disconnected
from jobs.models import SCHEDULED
from jobs.queue import broker, store
from jobs.services import Services

log = logging.getLogger("skilljobs.dispatch")

MAX_BATCH = 256
CACHED_CONFIGS = 4096  # (role, skill) pairs kept; the cache starts over past that


class StaleConfig(Exception):
    """Not recorded: the configurations changed since the job's were read. Build it again."""


class Unqueued(Exception):
    """The job was recorded but the queue refused it: it was removed again, never run."""

    def __init__(self, job_id: str, cause: BaseException) -> None:
        super().__init__(f"enqueue of job {job_id} failed: {cause}")
        self.job_id = job_id
        self.cause = cause


class KeyTaken(Exception):
    """The job's idempotency key already names a job: nothing was recorded for this one."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"the idempotency key of job {job_id} is already taken")
        self.job_id = job_id


@dataclass
class NewJob:
    """One background dispatch: the row to insert (``values`` as ``store.record_job``
    takes it), its origin chat session, its live event, its lane metadata, and the
    idempotency key claimed with it (recorded in the same transaction)."""

    values: dict[str, Any]
    session: dict[str, Any] | None
    event: tuple[str, str] | None
    meta: dict[str, Any] | None
    key: store.DispatchKeyRow | None = None
    #: the configuration generation its context was built from (None: no configuration)
    generation: int | None = None

    @property
    def job_id(self) -> str:
        return str(self.values["id"])


class Intake:
    """The batched write path of one process's background dispatches (one per Services)."""

    def __init__(self, services: Services) -> None:
        self._services = weakref.ref(services)
        # SQLite has one writer: a second batch in flight waits for the write lock while
        # the first one is enqueued (its Redis round trip), never writes beside it.
        # PostgreSQL: a few batches in flight, so a dispatch seldom waits for a whole
        # round trip before its own batch starts.
        sqlite = is_sqlite(services.engine)
        concurrency = 2 if sqlite else 4
        self.batcher: Batcher[NewJob, BaseException | None] = Batcher(
            self._flush, max_batch=MAX_BATCH, concurrency=concurrency, name="dispatch-intake"
        )

        # The configuration read each background dispatch bakes into its job's context,
        # for the pairs not cached at the current generation.
        self.configs: Batcher[tuple[str, str], tuple[int, dict[str, Any]]] = Batcher(
            self._read_configs,
            max_batch=MAX_BATCH,
            concurrency=2 if sqlite else 4,
            name="dispatch-configs",
        )
        self.generation = -1  # the configuration generation the cache holds values of
        self._cached: dict[tuple[str, str], dict[str, Any]] = {}

    async def configs_for(self, role_id: str, skill: str) -> tuple[dict[str, Any], int]:
        """The configuration of ``skill`` for ``role_id`` (secrets decrypted, to be sealed
        by the caller; not to be changed) and the generation it is of."""
        found = self._cached.get((role_id, skill))
        if found is not None:
            return found, self.generation
        generation, values = await self.configs.submit((role_id, skill))
        return values, generation

    def note_generation(self, generation: int, *, current: bool = False) -> None:
        """The configurations are at ``generation`` (``current``: as a write just found,
        so even an older number is taken — a restored database): forget what was cached
        at another one. Reads may finish out of order, so a read only moves it forward."""
        if generation > self.generation or (current and generation != self.generation):
            self._cached.clear()
            self.generation = generation

    async def _read_configs(
        self, wanted: list[tuple[str, str]]
    ) -> list[tuple[int, dict[str, Any]]]:

        svc = self.services
        generation, found = await ConfigStore(svc.sessionmaker, svc.box).snapshot(wanted)
        self.note_generation(generation)
        if generation == self.generation:  # not overtaken by a later read meanwhile
            if len(self._cached) + len(wanted) > CACHED_CONFIGS:
                self._cached.clear()
            self._cached.update(zip(wanted, found, strict=True))
        return [(generation, values) for values in found]

    @property
    def services(self) -> Services:
        svc = self._services()
        if svc is None:  # pragma: no cover - the intake lives as long as its Services
            raise RuntimeError("the services of this intake are closed")
        return svc

    async def submit(self, job: NewJob) -> None:
        """Record and enqueue ``job``; returns once both are done. Raises the database's
        error when it could not be recorded (nothing was), :class:`KeyTaken` when its
        idempotency key already names a job (nothing was recorded), :class:`Unqueued` when
        it was recorded but could not be enqueued (it is removed again)."""
        outcome = await self.batcher.submit(job)
        if outcome is not None:
            raise outcome

    async def _flush(self, jobs: list[NewJob]) -> list[BaseException | None]:
        outcomes = await self._record(jobs)
        # a job scheduled for later is recorded only: the promoter enqueues it when it is due
        recorded = [
            j
            for j, o in zip(jobs, outcomes, strict=True)
            if o is None and j.values.get("status") != SCHEDULED
        ]
        if not recorded:
            return outcomes
        unqueued = await self._enqueue(recorded)
        if unqueued is not None:
            failed = {j.job_id: Unqueued(j.job_id, unqueued) for j in recorded}
            outcomes = [failed.get(j.job_id, o) for j, o in zip(jobs, outcomes, strict=True)]
        return outcomes

    async def _record(self, jobs: list[NewJob]) -> list[BaseException | None]:
        # One generation per statement: the newest one of the batch. A job built from an
        # older one is stale already (the cache moved on when the newer one was read).
        newest = max((j.generation for j in jobs if j.generation is not None), default=None)
        outcomes: list[BaseException | None] = [
            StaleConfig() if j.generation is not None and j.generation != newest else None
            for j in jobs
        ]
        todo = [j for j, o in zip(jobs, outcomes, strict=True) if o is None]
        if todo:
            found = dict(
                zip((j.job_id for j in todo), await self._write(todo, newest), strict=True)
            )
            outcomes = [
                found[j.job_id] if o is None else o for j, o in zip(jobs, outcomes, strict=True)
            ]
        return outcomes

    async def _write(
        self, jobs: list[NewJob], generation: int | None
    ) -> list[BaseException | None]:
        sm = self.services.sessionmaker
        try:
            taken = await once_more_if_disconnected(
                store.record_jobs,
                sm,
                [(j.values, j.session) for j in jobs],
                _keys(jobs),
                generation=generation,
            )
            return [KeyTaken(j.job_id) if j.job_id in taken else None for j in jobs]
        except ConfigChanged as exc:  # nothing was written
            self.note_generation(exc.generation, current=True)
            return [StaleConfig() for _ in jobs]
        except DB_UNAVAILABLE:
            raise  # the database is away: every caller gets the error, nothing was written
        except Exception as exc:
            if len(jobs) == 1:
                return [exc]
            log.warning("dispatch batch of %d refused (%s): recording one by one", len(jobs), exc)
        out: list[BaseException | None] = []
        for j in jobs:
            try:  # alone, in its own transaction: its session row only with its job row
                taken = await store.record_jobs(
                    sm, [(j.values, j.session)], _keys([j]), generation=j.generation
                )
                out.append(KeyTaken(j.job_id) if taken else None)
            except ConfigChanged as exc:
                self.note_generation(exc.generation, current=True)
                out.append(StaleConfig())
            except Exception as exc:
                out.append(exc)
        return out

    async def _enqueue(self, jobs: list[NewJob]) -> BaseException | None:
        """Enqueue the recorded ``jobs`` in one round trip; on failure remove them again
        (an entry that did reach Redis then finds no job to claim) and return the error."""
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
            async with svc.sessionmaker() as s:
                await store.drop_unqueued(s, [j.job_id for j in jobs])
            return exc


def _keys(jobs: list[NewJob]) -> dict[str, store.DispatchKeyRow]:
    return {j.job_id: j.key for j in jobs if j.key is not None}


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


def _forget(key: int) -> Callable[[weakref.ref[Services]], None]:
    def drop(_ref: weakref.ref[Services]) -> None:
        _intakes.pop(key, None)

    return drop


async def prefetch_configs(
    services: Services, role_id: str, skill: str
) -> tuple[dict[str, Any], int]:
    """``ConfigStore.prefetch`` and its generation: cached, or read together with the
    concurrent dispatches' (one statement per batch)."""
    return await intake_of(services).configs_for(role_id, skill)


async def submit(services: Services, job: NewJob) -> None:
    """:meth:`Intake.submit` on the intake of ``services``."""
    await intake_of(services).submit(job)
