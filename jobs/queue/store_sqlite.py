"""The job store's hot batches on SQLite (the embedded default): claim, finish, new jobs.

Each batch is one write transaction run in one call to the connection's thread
(:func:`jobs.db.sqlite_write`): the statements are the same as the portable forms in
:mod:`jobs.queue.store` (same conditions, same fencing, same values), executed on the
``sqlite3`` connection without an event-loop hand-off per statement, so the write lock
is held for the statements only. Values pass through the column types' own bind and
result processors, so what is stored and what is read back is what SQLAlchemy would
store and return.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine

from jobs.catalog.configs import ConfigChanged
from jobs.db import sqlite_write
from jobs.models import ChatSession, Job

_jobs: Any = Job.__table__

CLAIM = """UPDATE jobs SET status = 'running', lease_token = :new_tok, lease_owner = :owner,
  lease_expires_at = :expires, attempts = attempts + 1,
  started_at = COALESCE(started_at, :now), updated_at = :now
WHERE id = :jid AND status = 'queued' AND lease_token = :tok
RETURNING *"""

NEW_ATTEMPT = """INSERT INTO job_attempts
  (job_id, number, worker_id, lease_token, started_at, outcome)
VALUES (:jid, :number, :owner, :new_tok, :now, 'running')"""

_FINISH = """UPDATE jobs SET status = :status, result = :result, error = :error,
  error_type = :error_type,{fetches} finished_at = :now,
  duration_ms = (:now - started_at) * 1000.0, lease_owner = NULL, lease_expires_at = NULL,
  updated_at = :now
WHERE id = :jid AND lease_token = :tok AND status = 'running'"""
FINISH = _FINISH.format(fetches="")
FINISH_WITH_FETCHES = _FINISH.format(fetches=" fetches = :fetches,")

CLOSE_ATTEMPT = """UPDATE job_attempts SET finished_at = :now, outcome = :outcome,
  error = :aerror, error_type = :error_type, duration_ms = (:now - started_at) * 1000.0
WHERE job_id = :jid AND lease_token = :tok AND finished_at IS NULL"""

SESSION_COLUMNS = tuple(c.name for c in ChatSession.__table__.c)
NEW_SESSIONS = (
    f"INSERT INTO chat_sessions ({', '.join(SESSION_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in SESSION_COLUMNS)}) ON CONFLICT DO NOTHING"
)
GENERATION = "SELECT generation FROM config_generation WHERE id = 1"
NEW_KEY = """INSERT INTO dispatch_keys (key, job_id, request_hash, created_at)
VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"""


class _Types:
    """The bind and result processors of the jobs table's columns for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self.result: dict[str, Any] = {}
        self.bind: dict[str, Any] = {}
        for c in _jobs.c:
            impl = c.type.dialect_impl(dialect)
            if (proc := impl.result_processor(dialect, None)) is not None:
                self.result[c.name] = proc
            if (proc := impl.bind_processor(dialect)) is not None:
                self.bind[c.name] = proc

    def row(self, names: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
        procs = self.result
        return {n: (procs[n](v) if n in procs else v) for n, v in zip(names, values, strict=True)}

    def value(self, column: str, value: Any) -> Any:
        proc = self.bind.get(column)
        return value if proc is None else proc(value)


_types: dict[int, _Types] = {}


def types_of(engine: AsyncEngine) -> _Types:
    dialect = engine.dialect
    found = _types.get(id(dialect))
    if found is None:
        found = _types[id(dialect)] = _Types(dialect)
    return found


async def claim_many(
    engine: AsyncEngine, wanted: list[tuple[str, int]], common: dict[str, Any]
) -> dict[tuple[str, int], dict[str, Any]]:
    """Claim each ``(job id, enqueue token)`` and open its attempt: the claimed rows (as
    the column types read them), by pair. One transaction."""
    types = types_of(engine)

    def run(db: sqlite3.Connection) -> dict[tuple[str, int], dict[str, Any]]:
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        for job_id, tok in wanted:
            params = {**common, "jid": job_id, "tok": tok, "new_tok": tok + 1}
            cur = db.execute(CLAIM, params)
            got = cur.fetchone()
            if got is None:
                continue
            row = types.row([d[0] for d in cur.description], got)
            db.execute(NEW_ATTEMPT, {**params, "number": row["attempts"]})
            rows[(job_id, tok)] = row
        return rows

    return await sqlite_write(engine, run)


async def finish_many(
    engine: AsyncEngine, outcomes: Sequence[tuple[Any, str | None]], now: float
) -> set[tuple[str, int]]:
    """Record each ``(store.Outcome, attempt error)`` (already storable) whose attempt
    still holds its lease, and close that attempt; the ``(job id, token)`` pairs
    recorded. One transaction."""
    types = types_of(engine)
    batch = []
    for o, aerror in outcomes:
        params = {
            "jid": o.job_id,
            "tok": o.token,
            "status": o.status,
            "result": types.value("result", o.result),
            "error": o.error,
            "error_type": o.error_type,
            "now": now,
            "outcome": o.attempt_outcome or o.status,
            "aerror": aerror,
        }
        if o.fetches is not None:
            params["fetches"] = types.value("fetches", o.fetches)
        batch.append(params)

    def run(db: sqlite3.Connection) -> set[tuple[str, int]]:
        done: set[tuple[str, int]] = set()
        for params in batch:
            stmt = FINISH if "fetches" not in params else FINISH_WITH_FETCHES
            if db.execute(stmt, params).rowcount != 1:
                continue  # this attempt lost its lease: nothing was written for it
            db.execute(CLOSE_ATTEMPT, params)
            done.add((params["jid"], params["tok"]))
        return done

    return await sqlite_write(engine, run)


async def record_jobs(
    engine: AsyncEngine,
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    sessions: Sequence[dict[str, Any]],
    keys: Mapping[str, tuple[str, str, float]] | None = None,
    *,
    generation: int | None = None,
) -> set[str]:
    """Insert the new job ``rows`` (each with exactly ``columns``) and their origin chat
    ``sessions`` (complete rows; existing ones left as they are). One transaction.

    ``keys``: job id → (idempotency key, request hash, created_at) claimed with the job; a
    job whose key already exists is not inserted. Returns the ids of those jobs.
    ``generation``: nothing is written unless the configuration generation is still this
    one (read under the write lock); ``ConfigChanged`` otherwise."""
    types = types_of(engine)
    insert_jobs = (
        f"INSERT INTO jobs ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
    )
    job_values = [(r["id"], tuple(types.value(c, r[c]) for c in columns)) for r in rows]
    session_values = [tuple(s[c] for c in SESSION_COLUMNS) for s in sessions]
    key_values = [(k, jid, digest, at) for jid, (k, digest, at) in (keys or {}).items()]

    def run(db: sqlite3.Connection) -> set[str]:
        if generation is not None:
            current = int(db.execute(GENERATION).fetchone()[0])
            if current != generation:
                raise ConfigChanged(current)
        if session_values:
            db.executemany(NEW_SESSIONS, session_values)
        taken = {v[1] for v in key_values if db.execute(NEW_KEY, v).rowcount == 0}
        db.executemany(insert_jobs, [v for jid, v in job_values if jid not in taken])
        return taken

    return await sqlite_write(engine, run)
