"""The job store: the database is the record, Redis only the transport.

Every state change of a job goes through here. Writes made on behalf of a running attempt
are *fenced* by ``lease_token``: the token is bumped each time the job is (re)queued or
claimed, so an attempt whose lease was taken away (worker killed, paused, partitioned) can
never record a result, start a delivery or requeue the job.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    bindparam,
    case,
    delete,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobs import jsontext, storable
from jobs.catalog.configs import ConfigChanged
from jobs.constants import MAX_RUNS
from jobs.db import Sessions, autocommit, engine_of, is_sqlite, raw_fetch, rowcount
from jobs.models import (
    CANCELLED,
    FAILED,
    FINAL_STATUSES,
    QUEUED,
    RUNNING,
    SCHEDULED,
    SUCCEEDED,
    TIMED_OUT,
    ChatSession,
    DispatchKey,
    Job,
    JobAttempt,
    JobRow,
    Worker,
    config_generation,
)
from jobs.queue import incidents, store_sqlite

# An idempotency key a new job's dispatch claims with it: (key, request hash, created_at).
DispatchKeyRow = tuple[str, str, float]


def arq_id(job_id: str, token: int) -> str:
    """The arq job id of one enqueue of a job: never reused, so arq's "id already exists"
    refusal and a stale entry in ``arq:abort`` can never hit a later attempt."""
    return f"{job_id}:{token}"


@dataclass
class Claim:
    """A job claimed by this worker: ``token`` fences every write of this attempt.
    ``job`` is the claimed row (read-only attribute access, like a ``Job``)."""

    job: JobRow
    token: int
    attempt: int


# The hot path (claim → finish) runs on plain connections with statements built once:
# building ORM statements and sessions per job costs more CPU than the queries themselves.
_jobs: Any = Job.__table__
_attempts: Any = JobAttempt.__table__

# Constants are rendered into the SQL (no anonymous parameters), which keeps these
# statements valid inside the PostgreSQL CTE forms below.
_RUNNING: Any = literal_column(f"'{RUNNING}'")
_QUEUED: Any = literal_column(f"'{QUEUED}'")
_NULL: Any = literal_column("NULL")
_MS: Any = literal_column("1000.0")

_CLAIM = (
    update(_jobs)
    .where(
        _jobs.c.id == bindparam("jid"),
        _jobs.c.status == _QUEUED,
        _jobs.c.lease_token == bindparam("tok"),
    )
    .values(
        status=_RUNNING,
        lease_token=bindparam("new_tok"),
        lease_owner=bindparam("owner"),
        lease_expires_at=bindparam("expires"),
        attempts=_jobs.c.attempts + literal_column("1"),
        started_at=func.coalesce(_jobs.c.started_at, bindparam("now")),
        updated_at=bindparam("now"),
    )
    .returning(*_jobs.c)
)
_NEW_ATTEMPT = insert(_attempts).values(
    job_id=bindparam("jid"),
    number=bindparam("number"),
    worker_id=bindparam("owner"),
    lease_token=bindparam("new_tok"),
    started_at=bindparam("now"),
    outcome=_RUNNING,
)


def _finish_stmt(*, with_fetches: bool) -> Any:
    values: dict[str, Any] = {
        "status": bindparam("status"),
        "result": bindparam("result", type_=Job.result.type),
        "error": bindparam("error"),
        "error_type": bindparam("error_type"),
        "finished_at": bindparam("now"),
        "duration_ms": (bindparam("now") - _jobs.c.started_at) * _MS,
        "lease_owner": _NULL,
        "lease_expires_at": _NULL,
        "updated_at": bindparam("now"),
    }
    if with_fetches:
        values["fetches"] = bindparam("fetches", type_=Job.fetches.type)
    return (
        update(_jobs)
        .where(
            _jobs.c.id == bindparam("jid"),
            _jobs.c.lease_token == bindparam("tok"),
            _jobs.c.status == _RUNNING,
        )
        .values(**values)
    )


# Two separate statements, not one derived from the other: ``.values()`` on a copy would
# share (and extend) the original's SET list.
_FINISH = _finish_stmt(with_fetches=False)
_FINISH_WITH_FETCHES = _finish_stmt(with_fetches=True)
_CLOSE_ATTEMPT = (
    update(_attempts)
    .where(
        _attempts.c.job_id == bindparam("jid"),
        _attempts.c.lease_token == bindparam("tok"),
        _attempts.c.finished_at.is_(None),
    )
    .values(
        finished_at=bindparam("now"),
        outcome=bindparam("outcome"),
        error=bindparam("aerror"),
        error_type=bindparam("error_type"),
        duration_ms=(bindparam("now") - _attempts.c.started_at) * _MS,
    )
)


# On PostgreSQL, claim and finish are each ONE autocommitted statement (data-modifying
# CTEs) for a whole batch of jobs: one round trip instead of BEGIN, two statements per job
# and COMMIT. The batch arrives as parallel arrays (``unnest``), so the statement text is
# the same for any batch size and is prepared once per connection; it runs on the asyncpg
# driver directly (``db.raw_fetch``): per-row result processing would cost more than the
# database does.
# ``(status = …) IS TRUE`` keeps the planner on primary-key lookups: with a plain
# ``status = 'queued'`` it may read every queued job through the status index (stale
# statistics say there are few) and hash them, a cost that grows with the queue.
# The claim commits without waiting for its WAL flush (``synchronous_commit`` off for its
# own transaction only; the next commit that waits — the finish, a receipt — flushes it
# too, and PostgreSQL's WAL writer within 3 × wal_writer_delay). The flush is most of the
# statement's time on the start path of every job. A claim lost to a database crash in that
# window is safe: the job is queued again under its old token, so the attempt's fenced
# writes are refused and the reconciler runs it again — as for a worker that died.
_PG_CLAIM = """
WITH req AS (
  SELECT * FROM unnest($1::text[], $2::int[]) AS r(jid, tok)
  WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL
), j AS (
  UPDATE jobs SET status = 'running', lease_token = req.tok + 1, lease_owner = $3::text,
    lease_expires_at = $4::float8, attempts = jobs.attempts + 1,
    started_at = COALESCE(jobs.started_at, $5::float8), updated_at = $5::float8
  FROM req
  WHERE jobs.id = req.jid AND (jobs.status = 'queued') IS TRUE AND jobs.lease_token = req.tok
  RETURNING jobs.*
), a AS (
  INSERT INTO job_attempts (job_id, number, worker_id, lease_token, started_at, outcome)
  SELECT id, attempts, $3::text, lease_token, $5::float8, 'running' FROM j
  RETURNING id
)
SELECT * FROM j"""

_PG_FINISH = """
WITH req AS (
  SELECT * FROM unnest(
    $1::text[], $2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
    $8::text[], $9::text[]
  ) AS r(jid, tok, status, result, error, error_type, fetches, outcome, aerror)
), f AS (
  UPDATE jobs SET status = req.status, result = CAST(req.result AS JSONB),
    error = req.error, error_type = req.error_type,
    fetches = CASE WHEN req.fetches IS NULL THEN jobs.fetches
                   ELSE CAST(req.fetches AS JSONB) END,
    finished_at = $10::float8, duration_ms = ($10::float8 - jobs.started_at) * 1000.0,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = $10::float8
  FROM req
  WHERE jobs.id = req.jid AND jobs.lease_token = req.tok AND (jobs.status = 'running') IS TRUE
  RETURNING jobs.id, req.tok, req.outcome, req.aerror, req.error_type
), c AS (
  UPDATE job_attempts SET finished_at = $10::float8, outcome = f.outcome, error = f.aerror,
    error_type = f.error_type,
    duration_ms = ($10::float8 - job_attempts.started_at) * 1000.0
  FROM f
  WHERE job_attempts.job_id = f.id AND job_attempts.lease_token = f.tok
    AND job_attempts.finished_at IS NULL
  RETURNING job_attempts.id
)
SELECT id, tok FROM f"""


class RowView:
    """Attribute access to a driver record, like a SQLAlchemy row (``row.skill``): its
    columns copied into the instance once (a claimed job's are read some fifty times on
    its way, each a plain attribute, not a ``__getattr__`` call)."""

    def __init__(self, record: Any) -> None:
        self.__dict__.update(record.items())


def _json(value: Any) -> str | None:
    return None if value is None else jsontext.dumps(value)


def _pg(sm: Sessions) -> AsyncEngine | None:
    """An autocommit view of the engine when it is PostgreSQL (same connection pool)."""
    return autocommit(engine_of(sm))


async def claim(
    sm: Sessions, job_id: str, enqueue_token: int, worker_id: str, lease_sec: float
) -> Claim | None:
    """Take the lease of a queued job enqueued with ``enqueue_token``.

    Returns None when the job is gone, cancelled, already claimed or superseded by a later
    enqueue (an old arq entry re-run by arq after its in-progress key expired).
    """
    (found,) = await claim_many(sm, [(job_id, enqueue_token)], worker_id, lease_sec)
    return found


async def claim_many(
    sm: Sessions, wanted: list[tuple[str, int]], worker_id: str, lease_sec: float
) -> list[Claim | None]:
    """:func:`claim` for several ``(job id, enqueue token)`` pairs in one transaction;
    per pair, in order, its claim or None."""
    if not wanted:
        return []
    now = time.time()
    common = {"owner": worker_id, "expires": now + lease_sec, "now": now}
    rows: dict[tuple[str, int], Any] = {}
    pg = _pg(sm)
    if pg is not None:
        records = await raw_fetch(
            pg,
            _PG_CLAIM,
            [j for j, _ in wanted],
            [t for _, t in wanted],
            worker_id,
            common["expires"],
            now,
        )
        for rec in records:
            rows[(rec["id"], rec["lease_token"] - 1)] = RowView(rec)
    elif is_sqlite(engine := engine_of(sm)):
        found = await store_sqlite.claim_many(engine, wanted, common)
        rows = {key: RowView(row) for key, row in found.items()}
    else:
        async with engine.begin() as conn:
            for job_id, tok in wanted:
                params = {**common, "jid": job_id, "tok": tok, "new_tok": tok + 1}
                got = (await conn.execute(_CLAIM, params)).first()
                if got is not None:
                    await conn.execute(_NEW_ATTEMPT, {**params, "number": got.attempts})
                    rows[(job_id, tok)] = got
    out: list[Claim | None] = []
    for key in wanted:
        row = rows.pop(key, None)  # pop: a pair asked twice is claimed once
        out.append(None if row is None else Claim(job=row, token=key[1] + 1, attempt=row.attempts))
    return out


async def unclaim(sm: Sessions, job_id: str, token: int) -> int | None:
    """Give back a claim whose skill never started (a job a worker claimed ahead of its
    free slots, then did not start: stopping, kept waiting too long, paused past its
    heartbeat). The job is queued again as if never claimed: its attempt withdrawn (not a
    run, so not counted toward the cap), its first start cleared, its place in the queue
    kept (``queued_at``). Returns the new enqueue token, or None when the claim no longer
    holds the lease."""
    async with sm() as s:
        new_token = await _back_to_queue(
            s,
            job_id,
            token,
            time.time(),
            attempts=Job.attempts - 1,
            started_at=case((Job.attempts <= 1, None), else_=Job.started_at),
        )
        if new_token is None:
            return None
        await s.execute(
            delete(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.lease_token == token)
        )
        await s.commit()
        return new_token


async def _back_to_queue(
    s: AsyncSession, job_id: str, token: int, now: float, **values: Any
) -> int | None:
    """The running job leased with ``token`` queued again under the next token (rolled back
    and None when ``token`` no longer holds its lease); ``values`` are set with it."""
    new_token = token + 1
    res = await s.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_token == token, Job.status == RUNNING)
        .values(
            status=QUEUED,
            lease_token=new_token,
            lease_owner=None,
            lease_expires_at=None,
            arq_job_id=arq_id(job_id, new_token),
            updated_at=now,
            **values,
        )
    )
    if rowcount(res) != 1:
        await s.rollback()
        return None
    return new_token


async def holds_lease(sm: Sessions, job_id: str, token: int) -> bool:
    """The fence, asked of the database: does the attempt holding ``token`` still own the job?"""
    async with sm() as s:
        found = await s.scalar(
            select(Job.id).where(Job.id == job_id, Job.lease_token == token, Job.status == RUNNING)
        )
        return found is not None


async def set_phase(
    sm: Sessions, job_id: str, token: int, name: str | None, detail: str = ""
) -> bool:
    """What the running attempt holding ``token`` is doing before the skill itself runs
    (``preparing environment``), or None when that is over. Fenced like every attempt write;
    the token is kept with it, so a phase left by a dead attempt is never shown for the next."""
    phase = (
        None
        if name is None
        else {"name": name, "detail": detail, "token": token, "since": time.time()}
    )
    async with sm() as s, s.begin():
        res = await s.execute(
            update(Job)
            .where(Job.id == job_id, Job.lease_token == token, Job.status == RUNNING)
            .values(phase=phase)
        )
        return bool(rowcount(res))


@dataclass
class Outcome:
    """The final record of one attempt, for :func:`finish_many`."""

    job_id: str
    token: int
    status: str
    result: dict[str, Any] | None
    error: str | None
    error_type: str | None
    attempt_outcome: str | None = None
    attempt_error: str | None = None
    fetches: list[Any] | None = None


async def finish(
    sm: Sessions,
    job_id: str,
    token: int,
    *,
    status: str,
    result: dict[str, Any] | None,
    error: str | None,
    error_type: str | None,
    attempt_outcome: str | None = None,
    attempt_error: str | None = None,
    fetches: list[Any] | None = None,
) -> bool:
    """Record the final outcome of the attempt holding ``token``. False = lease lost."""
    (ok,) = await finish_many(
        sm,
        [
            Outcome(
                job_id,
                token,
                status,
                result,
                error,
                error_type,
                attempt_outcome,
                attempt_error,
                fetches,
            )
        ],
    )
    return ok


async def finish_many(sm: Sessions, outcomes: list[Outcome]) -> list[bool]:
    """:func:`finish` for several attempts in one transaction; per outcome, in order,
    whether it was recorded (False = that attempt no longer holds the lease)."""
    if not outcomes:
        return []
    outcomes = [_storable(o) for o in outcomes]
    now = time.time()
    done: set[tuple[str, int]] = set()
    pg = _pg(sm)
    if pg is not None:
        records = await raw_fetch(
            pg,
            _PG_FINISH,
            [o.job_id for o in outcomes],
            [o.token for o in outcomes],
            [o.status for o in outcomes],
            [_json(o.result) for o in outcomes],
            [o.error for o in outcomes],
            [o.error_type for o in outcomes],
            [_json(o.fetches) for o in outcomes],
            [o.attempt_outcome or o.status for o in outcomes],
            [_attempt_error(o) for o in outcomes],
            now,
        )
        done = {(r["id"], r["tok"]) for r in records}
        return [(o.job_id, o.token) in done for o in outcomes]
    engine = engine_of(sm)
    if is_sqlite(engine):
        pairs = [(o, _attempt_error(o)) for o in outcomes]
        done = await store_sqlite.finish_many(engine, pairs, now)
        return [(o.job_id, o.token) in done for o in outcomes]
    async with engine.begin() as conn:
        for o in outcomes:
            job_params = {
                "jid": o.job_id,
                "tok": o.token,
                "status": o.status,
                "result": o.result,
                "error": o.error,
                "error_type": o.error_type,
                "fetches": o.fetches,
                "now": now,
            }
            stmt = _FINISH if o.fetches is None else _FINISH_WITH_FETCHES
            if (await conn.execute(stmt, job_params)).rowcount != 1:
                continue  # this attempt lost its lease: nothing was written for it
            attempt = {"outcome": o.attempt_outcome or o.status, "aerror": _attempt_error(o)}
            await conn.execute(_CLOSE_ATTEMPT, {**job_params, **attempt})
            done.add((o.job_id, o.token))
    return [(o.job_id, o.token) in done for o in outcomes]


def _storable(o: Outcome) -> Outcome:
    """The outcome with every value fit for its column (``jobs.storable``)."""
    return Outcome(
        o.job_id,
        o.token,
        o.status,
        storable.result(o.result),
        storable.text(o.error),
        o.error_type,
        o.attempt_outcome,
        storable.text(o.attempt_error),
        None if o.fetches is None else storable.json_value(o.fetches),
    )


def _attempt_error(o: Outcome) -> str | None:
    err = o.attempt_error or o.error
    return err[:2000] if err else None


async def requeue(
    sm: Sessions,
    job_id: str,
    token: int,
    *,
    reason: str,
    error_type: str | None = None,
    attempt_outcome: str = FAILED,
    delay: float = 0.0,
) -> int | None:
    """Put a running attempt's job back in the queue (transient failure, worker shutdown).

    Returns the new enqueue token, or None when the attempt no longer holds the lease.
    """
    now = time.time()
    async with sm() as s:
        new_token = await _back_to_queue(s, job_id, token, now, queued_at=now + delay)
        if new_token is None:
            return None
        await _close_attempt(s, job_id, token, attempt_outcome, reason, error_type, now)
        await s.commit()
        return new_token


async def _close_attempt(
    s: AsyncSession,
    job_id: str,
    token: int,
    outcome: str,
    error: str | None,
    error_type: str | None,
    now: float,
) -> None:
    await s.execute(
        _CLOSE_ATTEMPT,
        {
            "jid": job_id,
            "tok": token,
            "now": now,
            "outcome": outcome,
            "aerror": storable.text(error, cap=2000),
            "error_type": error_type,
        },
    )


@dataclass(frozen=True, slots=True)
class Renewal:
    """What a lease renewal found: the leases ``still`` held (renewed), those with a cancel
    requested, and those ``busy`` (locked by another transaction — this worker's own
    finish, usually — so neither renewed nor lost: asked again at the next heartbeat)."""

    still: set[str]
    cancel: set[str]
    busy: set[str]


async def renew_leases(
    sm: Sessions, worker_id: str, held: dict[str, int], lease_sec: float
) -> Renewal:
    """Extend the leases this worker holds.

    Rows another transaction has locked are skipped (``SKIP LOCKED``), not waited for: a
    batched finish locks the rows of its jobs in its own order, and a renewal waiting for
    one of them while holding another would deadlock with it."""
    if not held:
        return Renewal(set(), set(), set())
    now = time.time()
    ids = sorted(held)
    mine = (
        select(Job.id)
        .where(Job.id.in_(ids), Job.lease_owner == worker_id, Job.status == RUNNING)
        .order_by(Job.id)
        .with_for_update(skip_locked=True)
    )
    async with sm() as s:
        res = await s.execute(
            update(Job)
            .where(Job.id.in_(mine.scalar_subquery()))
            .values(lease_expires_at=now + lease_sec)
            .returning(Job.id, Job.lease_token, Job.cancel_requested)
            .execution_options(synchronize_session=False)
        )
        rows = res.all()
        await s.commit()
        missing = [i for i in ids if i not in {r[0] for r in rows}]
        busy: set[str] = set()
        if missing:  # locked (still ours as last committed) or really gone
            found = await s.execute(
                select(Job.id, Job.lease_token, Job.lease_owner, Job.status).where(
                    Job.id.in_(missing)
                )
            )
            busy = {
                i
                for i, tok, owner, status in found.all()
                if owner == worker_id and status == RUNNING and held.get(i) == tok
            }
            await s.commit()
    still = {r[0] for r in rows if held.get(r[0]) == r[1]}
    cancel = {r[0] for r in rows if r[2] and r[0] in still}
    return Renewal(still, cancel, busy)


LOST_CAP_REASON = "lost {n} times (the worker running it died or stalled each time)"


async def expire_leases(
    sm: Sessions,
    *,
    limit: int = 500,
    owners: set[str] | None = None,
    before: float | None = None,
    why: str = "stopped heartbeating (lease expired)",
    failed: list[str] | None = None,
) -> list[tuple[str, int]]:
    """Requeue running jobs whose lease ran out (their worker died). Returns (id, token).

    ``owners``/``before``: only the leases of those workers last renewed long enough ago
    that ``lease_expires_at < before`` (a peer found the worker's heartbeat missing). Each
    attempt taken away ends ``lost`` and counts toward the run cap: a job that has had its
    ``MAX_RUNS`` runs is failed instead of run again (its id appended to ``failed``, for
    the caller to tell its origin: ``jobs.queue.lost``).
    """
    now = time.time()
    out: list[tuple[str, int]] = []
    query = select(Job.id, Job.lease_token, Job.lease_owner, Job.attempts, Job.skill).where(
        Job.status == RUNNING, Job.lease_expires_at < (now if before is None else before)
    )
    if owners is not None:
        if not owners:
            return []
        query = query.where(Job.lease_owner.in_(sorted(owners)))
    async with sm() as s:
        rows = (await s.execute(query.limit(limit))).all()
    for job_id, token, owner, attempts, skill in rows:
        reason = f"worker {owner} {why}"
        if attempts >= MAX_RUNS:
            error = await fail_lost(sm, job_id, token, reason)
            if error is not None:  # a failure like any other: counted in its incident
                await incidents.note_failure(sm, job_id, skill, "lost", error)
                if failed is not None:
                    failed.append(job_id)
            continue
        new = await requeue(
            sm, job_id, token, reason=reason, error_type="transient", attempt_outcome="lost"
        )
        if new is not None:
            out.append((job_id, new))
    return out


async def fail_lost(sm: Sessions, job_id: str, token: int, reason: str) -> str | None:
    """End a job whose last allowed run was lost: ``failed``, never run again. The error
    recorded, or None when the attempt no longer held the lease."""
    now = time.time()
    async with sm() as s:
        lost = await s.scalar(
            select(func.count())
            .select_from(JobAttempt)
            .where(JobAttempt.job_id == job_id, JobAttempt.outcome == "lost")
        )
        n = int(lost or 0) + 1
        error = (
            LOST_CAP_REASON.format(n=n)
            if n >= MAX_RUNS
            else (
                f"{MAX_RUNS} runs used, the last one lost (the worker running it died or stalled)"
            )
        )
        res = await s.execute(
            update(Job)
            .where(Job.id == job_id, Job.lease_token == token, Job.status == RUNNING)
            .values(
                status=FAILED,
                error=error,
                error_type="lost",
                lease_token=token + 1,
                lease_owner=None,
                lease_expires_at=None,
                finished_at=now,
                duration_ms=(now - Job.started_at) * 1000.0,
                updated_at=now,
            )
        )
        if rowcount(res) != 1:
            await s.rollback()
            return None
        await _close_attempt(s, job_id, token, "lost", reason, "lost", now)
        await s.commit()
        return error


async def stale_owners(sm: Sessions, before: float, *, exclude: str) -> list[str]:
    """Workers other than ``exclude`` holding a running job whose lease expires before
    ``before`` (renewed longer ago than a live worker would let it be)."""
    async with sm() as s:
        rows = await s.scalars(
            select(Job.lease_owner)
            .where(
                Job.status == RUNNING,
                Job.lease_expires_at < before,
                Job.lease_owner.is_not(None),
                Job.lease_owner != exclude,
            )
            .distinct()
        )
        return sorted(o for o in rows if o)


async def live_peers(sm: Sessions, *, exclude: str, since: float) -> list[str]:
    """Workers other than ``exclude`` that have not stopped and wrote their row after
    ``since`` (the ones whose death a peer must notice)."""
    async with sm() as s:
        rows = await s.scalars(
            select(Worker.id).where(
                Worker.stopped_at.is_(None), Worker.last_heartbeat > since, Worker.id != exclude
            )
        )
        return sorted(rows)


async def promote_due(sm: Sessions, now: float, *, limit: int = 500) -> list[Job]:
    """Move the ``scheduled`` jobs whose ``run_at`` has come to ``queued`` (oldest time
    first) and return them, to be enqueued. The status is checked by the UPDATE itself, so
    of several workers promoting at once each job is moved by one; a job moved but not
    enqueued (the worker died in between, Redis away) is re-enqueued by the reconciler like
    any queued job whose entry is missing."""
    due = (
        select(Job.id)
        .where(Job.status == SCHEDULED, Job.run_at <= now)
        .order_by(Job.run_at)
        .limit(limit)
    )
    async with sm() as s:
        if not is_sqlite(engine_of(sm)):
            due = due.with_for_update(skip_locked=True)
        res = await s.execute(
            update(Job)
            .where(Job.id.in_(due.scalar_subquery()), Job.status == SCHEDULED)
            .values(status=QUEUED, queued_at=now, updated_at=now)
            .returning(Job)
            .execution_options(synchronize_session=False)
        )
        jobs = list(res.scalars())
        await s.commit()
    return jobs


async def next_run_at(sm: Sessions) -> float | None:
    """The earliest ``run_at`` of the jobs still scheduled (None: none)."""
    async with sm() as s:
        found = await s.scalar(select(func.min(Job.run_at)).where(Job.status == SCHEDULED))
    return None if found is None else float(found)


async def stale_queued(
    sm: Sessions, older_than: float, *, limit: int = 1000
) -> list[tuple[str, int, str | None]]:
    """Queued jobs whose enqueue is older than ``older_than`` seconds (id, token, arq id)."""
    cutoff = time.time() - older_than
    async with sm() as s:
        rows = (
            await s.execute(
                select(Job.id, Job.lease_token, Job.arq_job_id)
                .where(Job.status == QUEUED, Job.queued_at < cutoff)
                .order_by(Job.queued_at)
                .limit(limit)
            )
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


async def bump_queued(sm: Sessions, job_id: str, token: int) -> int | None:
    """Give a queued job a fresh enqueue token (before re-enqueueing it)."""
    new_token = token + 1
    now = time.time()
    async with sm() as s:
        res = await s.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == QUEUED, Job.lease_token == token)
            .values(
                lease_token=new_token,
                arq_job_id=arq_id(job_id, new_token),
                queued_at=now,
                updated_at=now,
            )
        )
        await s.commit()
        return new_token if rowcount(res) == 1 else None


async def recent_failures(
    sm: Sessions, skill: str, role_id: str, window_sec: float = 1800.0
) -> int:
    """How many of the last 2 finished runs of ``skill`` for ``role_id`` in the window failed
    (the circuit breaker of SPEC §7)."""
    since = time.time() - window_sec
    async with sm() as s:
        rows = (
            await s.execute(
                select(JobAttempt.outcome)
                .join(Job, Job.id == JobAttempt.job_id)
                .where(
                    Job.skill == skill,
                    Job.role_id == role_id,
                    JobAttempt.finished_at.is_not(None),
                    JobAttempt.finished_at >= since,
                    JobAttempt.outcome.not_in(("lost", "requeued", CANCELLED)),
                )
                .order_by(JobAttempt.finished_at.desc())
                .limit(2)
            )
        ).all()
    return sum(1 for (o,) in rows if o != SUCCEEDED)


async def get_job(sm: Sessions, job_id: str) -> Job | None:
    async with sm() as s:
        return await s.get(Job, job_id)


# --- operator actions -------------------------------------------------------------------


async def cancel_queued(sm: Sessions, job_id: str) -> Job | None:
    """Cancel a job that has not started (queued, or scheduled for later). Returns it, or
    None if it is neither."""
    now = time.time()
    async with sm() as s:
        res = await s.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.in_((QUEUED, SCHEDULED)))
            .values(
                status=CANCELLED,
                cancel_requested=True,
                finished_at=now,
                lease_token=Job.lease_token + 1,
                error="cancelled before it started",
                updated_at=now,
            )
            .returning(Job)
        )
        job = res.scalar_one_or_none()
        await s.commit()
        return job


async def request_cancel(sm: Sessions, job_id: str) -> Job | None:
    """Flag a running job for cancellation (its worker stops it). None if not running."""
    async with sm() as s:
        res = await s.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == RUNNING)
            .values(cancel_requested=True, updated_at=time.time())
            .returning(Job)
        )
        job = res.scalar_one_or_none()
        await s.commit()
        return job


async def reopen(sm: Sessions, job_id: str) -> tuple[Job, int] | None:
    """Manual retry: a finished job goes back to the queue as a new attempt."""
    now = time.time()
    async with sm() as s:
        job = await s.get(Job, job_id)
        if job is None or job.status not in FINAL_STATUSES:
            return None
        new_token = job.lease_token + 1
        res = await s.execute(
            update(Job)
            .where(
                Job.id == job_id,
                Job.lease_token == job.lease_token,
                Job.status.in_(tuple(FINAL_STATUSES)),
            )
            .values(
                status=QUEUED,
                lease_token=new_token,
                cancel_requested=False,
                arq_job_id=arq_id(job_id, new_token),
                queued_at=now,
                finished_at=None,
                error=None,
                error_type=None,
                updated_at=now,
            )
            .returning(Job)
        )
        job = res.scalar_one_or_none()
        await s.commit()
        return (job, new_token) if job is not None else None


async def failed_job_ids(sm: Sessions, skill: str, limit: int = 10_000) -> list[str]:
    async with sm() as s:
        rows = await s.scalars(
            select(Job.id)
            .where(Job.skill == skill, Job.status.in_((FAILED, TIMED_OUT)))
            .order_by(Job.created_at)
            .limit(limit)
        )
        return list(rows)


# --- workers ----------------------------------------------------------------------------


async def delete_finished(sm: Sessions, job_id: str) -> tuple[str, str] | None:
    """Delete a finished job (its attempts, artifacts and deliveries go with it): its
    ``(skill, status)``, or None when there is no such job or it has not finished."""
    async with sm() as s:
        row = (
            await s.execute(
                delete(Job)
                .where(Job.id == job_id, Job.status.in_(FINAL_STATUSES))
                .returning(Job.skill, Job.status)
            )
        ).first()
        await s.commit()
    return None if row is None else (str(row[0]), str(row[1]))


async def worker_heartbeat(
    sm: Sessions,
    worker_id: str,
    host: str,
    pid: int,
    running: list[str],
    *,
    stopped: bool = False,
    stalls: tuple[int, float] | None = None,
) -> None:
    """The worker's row: its heartbeat, what it runs, and (``stalls``) the stall
    detector's count and longest block in seconds."""
    now = time.time()
    async with sm() as s:
        w = await s.get(Worker, worker_id)
        if w is None:
            w = Worker(
                id=worker_id,
                host=host,
                pid=pid,
                started_at=now,
                last_heartbeat=now,
                running=running,
            )
            s.add(w)
        else:
            w.last_heartbeat = now
            w.running = running
            if stopped:
                w.stopped_at = now
        if stalls is not None:
            w.stalls, w.longest_stall_s = stalls
        await s.commit()


async def ensure_session(
    conn: Any, session_id: str, *, role_id: str, org_id: str, channel: str, external_id: str
) -> None:
    """Record the chat session a job came from (web delivery goes back to it). Safe under
    concurrent dispatches for the same new session: an existing row is left as it is.
    ``conn`` is an ``AsyncConnection`` or an ``AsyncSession``."""
    now = time.time()
    values = {
        "session_id": session_id,
        "role_id": role_id,
        "org_id": org_id,
        "channel": channel,
        "external_id": external_id,
        "created_at": now,
        "updated_at": now,
    }
    dialect = conn.dialect if hasattr(conn, "dialect") else conn.get_bind().dialect
    if dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt: Any = pg_insert(ChatSession).values(**values).on_conflict_do_nothing()
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(ChatSession).values(**values).on_conflict_do_nothing()
    await conn.execute(stmt)


async def record_job(sm: Sessions, values: dict[str, Any], session: dict[str, Any] | None) -> None:
    """Write a new job row (and its origin chat session) — one round trip on PostgreSQL."""
    values = _storable_job(values)
    pg = _pg(sm)
    if pg is not None:
        async with pg.connect() as conn:
            if session is not None:
                await ensure_session(conn, **session)
            await conn.execute(insert(_jobs), values)
        return
    async with engine_of(sm).begin() as conn:
        if session is not None:
            await ensure_session(conn, **session)
        await conn.execute(insert(_jobs), values)


async def record_jobs(
    sm: Sessions,
    jobs: Sequence[tuple[dict[str, Any], dict[str, Any] | None]],
    keys: Mapping[str, DispatchKeyRow] | None = None,
    *,
    generation: int | None = None,
) -> set[str]:
    """:func:`record_job` for a batch of ``(values, origin session)``: one transaction
    with one statement for the sessions and one for the job rows — all recorded or none.

    ``generation``: the configuration generation the jobs' contexts were built from;
    nothing is written unless it is still the current one (checked in the same statement
    or transaction), :class:`jobs.catalog.configs.ConfigChanged` naming the current one
    otherwise.

    ``keys`` maps a job id to the idempotency key its dispatch claims: the key rows are
    inserted in the same transaction (``ON CONFLICT DO NOTHING``), and a job whose key
    already exists is not recorded. Returns the ids of those jobs (their dispatch finds
    out what the key stands for, :func:`jobs.queue.idempotency.claim`). Key and job are
    committed together, so a key never names a job that was not recorded."""
    if not jobs:
        return set()
    keys = keys or {}
    rows = [_storable_job(values) for values, _ in jobs]
    sessions = {s["session_id"]: s for _, s in jobs if s is not None}
    pg = _pg(sm)
    if pg is not None and all(r.keys() == _NEW_JOB_KEYS for r in rows):
        import asyncpg

        try:
            args = _new_job_arrays(rows, list(sessions.values()))
            if generation is not None:
                return await _record_at_generation(pg, args, keys, generation)
            if not keys:
                await raw_fetch(pg, _PG_NEW_JOBS, *args)
                return set()
            args += [list(col) for col in zip(*((jid, *k) for jid, k in keys.items()), strict=True)]
            recorded = {r[0] for r in await raw_fetch(pg, _PG_NEW_KEYED_JOBS, *args)}
            return set(keys) - recorded
        except asyncpg.PostgresError:
            pass  # refused, nothing written: the portable form below raises SQLAlchemy's error
    engine = engine_of(sm)
    if (
        is_sqlite(engine)
        and all(r.keys() == _NEW_JOB_KEYS for r in rows)
        and all(s.keys() == _SESSION_KEYS for s in sessions.values())
    ):
        now = time.time()
        new_sessions = [{**s, "created_at": now, "updated_at": now} for s in sessions.values()]
        return await store_sqlite.record_jobs(
            engine, _NEW_JOB_NAMES, rows, new_sessions, keys, generation=generation
        )
    async with engine.begin() as conn:
        if generation is not None:
            # FOR SHARE: no change of the configurations commits before these jobs do
            current = await conn.scalar(
                select(_generation.c.generation)
                .where(_generation.c.id == 1)
                .with_for_update(read=True)
            )
            if current is None:
                raise RuntimeError(NO_GENERATION)
            if current != generation:
                raise ConfigChanged(int(current))
        if sessions:
            now = time.time()
            await conn.execute(
                _session_insert(conn.dialect.name),
                [{**s, "created_at": now, "updated_at": now} for s in sessions.values()],
            )
        taken: set[str] = set()
        for jid, (key, digest, created_at) in keys.items():
            res = await conn.execute(
                _key_insert(conn.dialect.name).values(
                    key=key, job_id=jid, request_hash=digest, created_at=created_at
                )
            )
            if not res.rowcount:
                taken.add(jid)
        rows = [r for r in rows if r["id"] not in taken]
        if rows:
            await conn.execute(insert(_jobs), rows)
        return taken


async def _record_at_generation(
    pg: AsyncEngine, args: list[Any], keys: Mapping[str, DispatchKeyRow], generation: int
) -> set[str]:
    """``_PG_NEW_JOBS_AT_GENERATION`` with the job and session arrays ``args``."""
    keyed = [(jid, *k) for jid, k in keys.items()]
    args = [*args, *([k[i] for k in keyed] for i in range(4)), generation]
    (got,) = await raw_fetch(pg, _PG_NEW_JOBS_AT_GENERATION, *args)
    if got["generation"] is None:
        raise RuntimeError(NO_GENERATION)
    if got["generation"] != generation:
        raise ConfigChanged(int(got["generation"]))
    return set(keys) - set(got["ids"])


# The new-job batch on PostgreSQL: one statement (so one transaction, one round trip, one
# prepared statement whatever the batch size) carrying the rows as arrays; the sessions are
# inserted by a CTE of the same statement. Used when a row has exactly these columns (what
# the dispatcher writes); anything else takes the portable form.
_NEW_JOB_COLUMNS = (
    ("id", "text"),
    ("skill", "text"),
    ("status", "text"),
    ("attempts", "int"),
    ("input", "jsonb"),
    ("context", "jsonb"),
    ("fetches", "jsonb"),
    ("channel", "text"),
    ("session_id", "text"),
    ("external_id", "text"),
    ("actor_key", "text"),
    ("role_id", "text"),
    ("org_id", "text"),
    ("priority", "int"),
    ("wall_sec", "float8"),
    ("lease_token", "int"),
    ("cancel_requested", "bool"),
    ("arq_job_id", "text"),
    ("created_at", "float8"),
    ("queued_at", "float8"),
    ("updated_at", "float8"),
    ("traceparent", "text"),
    ("run_at", "float8"),
)
_NEW_JOB_KEYS = frozenset(name for name, _ in _NEW_JOB_COLUMNS)
_SESSION_COLUMNS = ("session_id", "role_id", "org_id", "channel", "external_id")
_SESSION_KEYS = frozenset(_SESSION_COLUMNS)
_NEW_JOB_NAMES = tuple(name for name, _ in _NEW_JOB_COLUMNS)
_NJ = len(_NEW_JOB_COLUMNS)
_PG_NEW_JOBS = (
    "WITH s AS (INSERT INTO chat_sessions ("
    + ", ".join(_SESSION_COLUMNS)
    + ", created_at, updated_at) SELECT *, $"
    + str(_NJ + 1)
    + "::float8, $"
    + str(_NJ + 1)
    + "::float8 FROM unnest("
    + ", ".join(f"${_NJ + 2 + i}::text[]" for i in range(len(_SESSION_COLUMNS)))
    + ") ON CONFLICT DO NOTHING) INSERT INTO jobs ("
    + ", ".join(name for name, _ in _NEW_JOB_COLUMNS)
    + ") SELECT "
    + ", ".join(f"{name}::jsonb" if kind == "jsonb" else name for name, kind in _NEW_JOB_COLUMNS)
    + " FROM unnest("
    + ", ".join(
        f"${i + 1}::{'text' if kind == 'jsonb' else kind}[]"
        for i, (_, kind) in enumerate(_NEW_JOB_COLUMNS)
    )
    + ") AS t("
    + ", ".join(name for name, _ in _NEW_JOB_COLUMNS)
    + ")"
)
# The same with idempotency keys: a CTE claims the keys (key, job id, request hash, time:
# four more arrays), and only the jobs whose key it inserted (or that have none) are
# recorded; the ids recorded come back.
_NK = _NJ + 2 + len(_SESSION_COLUMNS)
_PG_NEW_KEYED_JOBS = (
    "WITH k AS (INSERT INTO dispatch_keys (job_id, key, request_hash, created_at) "
    f"SELECT * FROM unnest(${_NK}::text[], ${_NK + 1}::text[], ${_NK + 2}::text[], "
    f"${_NK + 3}::float8[]) ON CONFLICT DO NOTHING RETURNING job_id), "
    + _PG_NEW_JOBS.removeprefix("WITH ")
    + f" WHERE NOT (t.id = ANY(${_NK}::text[])) OR t.id IN (SELECT job_id FROM k) RETURNING id"
)


# Either form, recorded only while the configuration generation is still the one the jobs'
# contexts were built from (one more parameter; the key arrays empty when there are no
# keys): nothing is written otherwise. The current generation and the ids recorded come
# back.
_NG = _NK + 4
_SESSIONS_THEN_JOBS = ") ON CONFLICT DO NOTHING) INSERT INTO jobs ("
assert _PG_NEW_JOBS.count(_SESSIONS_THEN_JOBS) == 1
_PG_NEW_JOBS_AT_GENERATION = (
    f"WITH ok AS (SELECT generation, generation = ${_NG}::bigint AS v FROM config_generation "
    "WHERE id = 1), "
    "k AS (INSERT INTO dispatch_keys (job_id, key, request_hash, created_at) "
    f"SELECT * FROM unnest(${_NK}::text[], ${_NK + 1}::text[], ${_NK + 2}::text[], "
    f"${_NK + 3}::float8[]) WHERE (SELECT v FROM ok) ON CONFLICT DO NOTHING RETURNING job_id), "
    + _PG_NEW_JOBS.removeprefix("WITH ").replace(
        _SESSIONS_THEN_JOBS,
        ") WHERE (SELECT v FROM ok) ON CONFLICT DO NOTHING), j AS (INSERT INTO jobs (",
    )
    + f" WHERE (SELECT v FROM ok) AND (NOT (t.id = ANY(${_NK}::text[])) "
    "OR t.id IN (SELECT job_id FROM k)) RETURNING id) "
    "SELECT (SELECT generation FROM ok) AS generation, ARRAY(SELECT id FROM j) AS ids"
)
_generation: Any = config_generation
NO_GENERATION = "config_generation has no row: run `skilljobs db upgrade`"


def _new_job_arrays(rows: list[dict[str, Any]], sessions: list[dict[str, Any]]) -> list[Any]:
    """The parameters of ``_PG_NEW_JOBS``: one array per job column, the time, one array
    per session column."""
    args: list[Any] = [
        [_json(r[name]) for r in rows] if kind == "jsonb" else [r[name] for r in rows]
        for name, kind in _NEW_JOB_COLUMNS
    ]
    args.append(time.time())
    args += [[str(s[name]) for s in sessions] for name in _SESSION_COLUMNS]
    return args


def _key_insert(dialect: str) -> Any:
    """INSERT of an idempotency key that does nothing when the key exists (0 rows)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(DispatchKey).on_conflict_do_nothing()
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(DispatchKey).on_conflict_do_nothing()


def _session_insert(dialect: str) -> Any:
    """INSERT of chat sessions that leaves existing rows as they are (as ensure_session)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(ChatSession).on_conflict_do_nothing()
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(ChatSession).on_conflict_do_nothing()


def _storable_job(values: dict[str, Any]) -> dict[str, Any]:
    """A new job's input and context fit for storage; what changed is noted in the stored
    context (``storage_note``), not in the input the skill's schema was checked against."""
    out = dict(values)
    notes = storable.Notes()
    for key in ("input", "context"):
        if out.get(key) is not None:
            out[key] = storable.json_value(out[key], notes)
    if notes and isinstance(out.get("context"), dict):
        out["context"] = {**out["context"], "storage_note": "input: " + notes.text()}
    if isinstance(out.get("error"), str):
        out["error"] = storable.text(out["error"])
    return out


async def drop_unqueued(s: AsyncSession, job_ids: list[str]) -> int:
    """Jobs recorded at dispatch that could not be enqueued: removed, never run. The caller
    was refused (503) and retries; a refusal is not a failure, so nothing of it stays in the
    record (no ``failed`` job, no idempotency key naming it). A job some worker claimed
    meanwhile (an entry that did reach Redis) is no longer ``queued`` and stays."""
    if not job_ids:
        return 0
    gone = (
        await s.scalars(
            delete(Job)
            .where(Job.id.in_(job_ids), (Job.status == QUEUED).is_(True))
            .returning(Job.id)
        )
    ).all()
    if gone:
        await s.execute(delete(DispatchKey).where(DispatchKey.job_id.in_(list(gone))))
    await s.commit()
    return len(gone)


OUTPUT_TAIL_CHARS = 8192  # characters of each stream an attempt keeps


def output_tail(text: str, cap: int = OUTPUT_TAIL_CHARS) -> str | None:
    """The last ``cap`` characters of what a run printed (None when it printed nothing)."""
    if not text or not text.strip():
        return None
    if len(text) > cap:
        text = f"[… {len(text) - cap:,} characters cut]\n" + text[-cap:]
    return storable.text(text)


async def record_output(sm: Sessions, job_id: str, token: int, stdout: str, stderr: str) -> None:
    """The tails of what the attempt holding ``token`` printed, on its attempt row (already
    scrubbed of the job's secret values by the executor). Nothing is written for a run that
    printed nothing, so a quiet skill costs no statement."""
    out, err = output_tail(stdout), output_tail(stderr)
    if out is None and err is None:
        return
    async with sm() as s:
        await s.execute(
            update(JobAttempt)
            .where(JobAttempt.job_id == job_id, JobAttempt.lease_token == token)
            .values(stdout_tail=out, stderr_tail=err)
        )
        await s.commit()
