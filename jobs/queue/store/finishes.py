"""Finishes: the fenced final record of an attempt (batched), a requeue of a running
attempt, what its run printed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    bindparam,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from jobs import storable
from jobs.db import Sessions, engine_of, is_sqlite, raw_fetch
from jobs.models import (
    FAILED,
    Job,
    JobAttempt,
)
from jobs.queue.store import sqlite
from jobs.queue.store.claims import back_to_queue
from jobs.queue.store.tables import (
    MS_SQL,
    NULL_SQL,
    RUNNING_SQL,
    attempt_table,
    job_table,
    pg_engine,
    to_json,
)


def _finish_stmt(*, with_fetches: bool) -> Any:
    values: dict[str, Any] = {
        "status": bindparam("status"),
        "result": bindparam("result", type_=Job.result.type),
        "error": bindparam("error"),
        "error_type": bindparam("error_type"),
        "finished_at": bindparam("now"),
        "duration_ms": (bindparam("now") - job_table.c.started_at) * MS_SQL,
        "lease_owner": NULL_SQL,
        "lease_expires_at": NULL_SQL,
        "updated_at": bindparam("now"),
    }
    if with_fetches:
        values["fetches"] = bindparam("fetches", type_=Job.fetches.type)
    return (
        update(job_table)
        .where(
            job_table.c.id == bindparam("jid"),
            job_table.c.lease_token == bindparam("tok"),
            job_table.c.status == RUNNING_SQL,
        )
        .values(**values)
    )


# Two separate statements, not one derived from the other: ``.values()`` on a copy would
# share (and extend) the original's SET list.
_FINISH = _finish_stmt(with_fetches=False)
_FINISH_WITH_FETCHES = _finish_stmt(with_fetches=True)
CLOSE_ATTEMPT = (
    update(attempt_table)
    .where(
        attempt_table.c.job_id == bindparam("jid"),
        attempt_table.c.lease_token == bindparam("tok"),
        attempt_table.c.finished_at.is_(None),
    )
    .values(
        finished_at=bindparam("now"),
        outcome=bindparam("outcome"),
        error=bindparam("aerror"),
        error_type=bindparam("error_type"),
        duration_ms=(bindparam("now") - attempt_table.c.started_at) * MS_SQL,
    )
)


# The batched finish on PostgreSQL: one statement, as the claim (``claims._PG_CLAIM``).


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
    pg = pg_engine(sm)
    if pg is not None:
        records = await raw_fetch(
            pg,
            _PG_FINISH,
            [o.job_id for o in outcomes],
            [o.token for o in outcomes],
            [o.status for o in outcomes],
            [to_json(o.result) for o in outcomes],
            [o.error for o in outcomes],
            [o.error_type for o in outcomes],
            [to_json(o.fetches) for o in outcomes],
            [o.attempt_outcome or o.status for o in outcomes],
            [_attempt_error(o) for o in outcomes],
            now,
        )
        done = {(r["id"], r["tok"]) for r in records}
        return [(o.job_id, o.token) in done for o in outcomes]
    engine = engine_of(sm)
    if is_sqlite(engine):
        pairs = [(o, _attempt_error(o)) for o in outcomes]
        done = await sqlite.finish_many(engine, pairs, now)
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
            await conn.execute(CLOSE_ATTEMPT, {**job_params, **attempt})
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
        new_token = await back_to_queue(s, job_id, token, now, queued_at=now + delay)
        if new_token is None:
            return None
        await close_attempt(s, job_id, token, attempt_outcome, reason, error_type, now)
        await s.commit()
        return new_token


async def close_attempt(
    s: AsyncSession,
    job_id: str,
    token: int,
    outcome: str,
    error: str | None,
    error_type: str | None,
    now: float,
) -> None:
    await s.execute(
        CLOSE_ATTEMPT,
        {
            "jid": job_id,
            "tok": token,
            "now": now,
            "outcome": outcome,
            "aerror": storable.text(error, cap=2000),
            "error_type": error_type,
        },
    )


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
