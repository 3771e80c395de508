"""What one worker process holds of its jobs, shared by the job function, the finishing
stage and the background loops (``jobs.queue.runner``, ``finish``, ``heartbeat``,
``reconcile``): the leases held, the running tasks, the batches, the live events."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from jobs.batching import Batcher
from jobs.constants import FN_RUN_JOB
from jobs.db import DB_UNAVAILABLE, db_unavailable
from jobs.finishing import Finisher, Notices
from jobs.models import JobRow
from jobs.queue import broker, limits, lost, prefetch, store
from jobs.queue.stall import StallWatch
from jobs.runscope import RunScope
from jobs.services import Services

if TYPE_CHECKING:
    from jobs.execution.executor import Executor

log = logging.getLogger("skilljobs.worker")

T = TypeVar("T")

DB_ERRORS = DB_UNAVAILABLE


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


class RunnerState:
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

    @property
    def certain_for(self) -> float:
        """How long after a renewal our lease is certainly ours: until it expires, or
        until peers may presume us dead, whichever comes first."""
        return min(self.svc.settings.worker_lease_sec, self.missing_after)

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

    def tell_lost(self, job_ids: list[str]) -> None:
        """Tell the origins of jobs just failed as lost, beside the loops (a slow channel
        must not delay the next take-over)."""
        for job_id in job_ids:
            task = asyncio.create_task(lost.tell(self.svc, job_id, self.finisher))
            self.telling.add(task)
            task.add_done_callback(self.telling.discard)


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
