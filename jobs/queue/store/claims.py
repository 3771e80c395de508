"""Claims: a worker takes the lease of a queued job (``jobs.queue.lease``), or gives back
a claim whose skill never started; the fence asked of the database; the attempt's phase."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    bindparam,
    case,
    delete,
    func,
    insert,
    literal_column,
)
from sqlalchemy.ext.asyncio import AsyncSession

from jobs.db import Sessions, engine_of, is_sqlite, raw_fetch, rowcount
from jobs.models import (
    QUEUED,
    Job,
    JobAttempt,
    JobRow,
)
from jobs.queue.lease import write_fenced
from jobs.queue.store import sqlite
from jobs.queue.store.tables import (
    LEASES,
    QUEUED_SQL,
    RUNNING_SQL,
    RowView,
    arq_id,
    attempt_table,
    job_table,
    pg_engine,
)


@dataclass
class Claim:
    """A job claimed by this worker: ``token`` fences every write of this attempt.
    ``job`` is the claimed row (read-only attribute access, like a ``Job``)."""

    job: JobRow
    token: int
    attempt: int


_CLAIM = LEASES.claim(
    job_table.c.id == bindparam("jid"),
    job_table.c.status == QUEUED_SQL,
    job_table.c.lease_token == bindparam("tok"),
    owner=bindparam("owner"),
    expires=bindparam("expires"),
    attempts=job_table.c.attempts + literal_column("1"),
    started_at=func.coalesce(job_table.c.started_at, bindparam("now")),
    updated_at=bindparam("now"),
).returning(*job_table.c)
_NEW_ATTEMPT = insert(attempt_table).values(
    job_id=bindparam("jid"),
    number=bindparam("number"),
    worker_id=bindparam("owner"),
    lease_token=bindparam("new_tok"),
    started_at=bindparam("now"),
    outcome=RUNNING_SQL,
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
    pg = pg_engine(sm)
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
        found = await sqlite.claim_many(engine, wanted, common)
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
        new_token = await back_to_queue(
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


async def back_to_queue(
    s: AsyncSession, job_id: str, token: int, now: float, **values: object
) -> int | None:
    """The running job leased with ``token`` queued again under the next token (rolled back
    and None when ``token`` no longer holds its lease); ``values`` are set with it."""
    new_token = token + 1
    release = LEASES.release(
        job_id,
        token,
        status=QUEUED,
        lease_token=new_token,
        arq_job_id=arq_id(job_id, new_token),
        updated_at=now,
        **values,
    )
    return new_token if await write_fenced(s, release) else None


async def holds_lease(sm: Sessions, job_id: str, token: int) -> bool:
    """The fence, asked of the database: does the attempt holding ``token`` still own the job?"""
    return await LEASES.holds(sm, job_id, token)


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
        res = await s.execute(LEASES.fenced(job_id, token).values(phase=phase))
        return bool(rowcount(res))
