"""The job store's hot batches on SQLite (the embedded default): claim, finish, new jobs.

Each batch is one write transaction run in one call to the connection's thread
(:func:`jobs.db.sqlite_write`) of the portable forms' conditions, fencing and values
(:mod:`jobs.queue.store`), a few statements per batch rather than one per job, executed on
the ``sqlite3`` connection without an event-loop hand-off per statement, so the write lock
is held for the statements only (rows read back become Python values after it). Values
pass through the column types' own bind and result processors, so what is stored and
what is read back is what SQLAlchemy would store and return.
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

#: the claim of many (id, enqueue token) pairs in one statement, each found by its id (the
#: conditions and values of ``store.claims._CLAIM``: the new token is the asked one plus one)
CLAIM_PAIRS = """UPDATE jobs SET status = 'running', lease_token = jobs.lease_token + 1,
  lease_owner = ?, lease_expires_at = ?, attempts = jobs.attempts + 1,
  started_at = COALESCE(jobs.started_at, ?), updated_at = ?
FROM (SELECT column1 AS jid, column2 AS tok FROM (VALUES {pairs})) AS wanted
WHERE jobs.id = wanted.jid AND jobs.lease_token = wanted.tok AND jobs.status = 'queued'
RETURNING *"""
CLAIM_CHUNK = 400  # pairs per claim statement (2 bound values each; SQLite allows 32,766)

NEW_ATTEMPTS = """INSERT INTO job_attempts
  (job_id, number, worker_id, lease_token, started_at, outcome)
VALUES (?, ?, ?, ?, ?, 'running')"""

#: the record of many outcomes in one statement, each found by its id, fenced by its lease
#: (the conditions and values of ``store.finish_many``); ``keep``: the fetches stay as they are
FINISH_ROWS = """UPDATE jobs SET status = o.status, result = o.result, error = o.error,
  error_type = o.error_type, fetches = CASE WHEN o.keep THEN jobs.fetches ELSE o.fetches END,
  finished_at = ?, duration_ms = (? - jobs.started_at) * 1000.0, lease_owner = NULL,
  lease_expires_at = NULL, updated_at = ?
FROM (SELECT column1 AS jid, column2 AS tok, column3 AS status, column4 AS result,
  column5 AS error, column6 AS error_type, column7 AS keep, column8 AS fetches
  FROM (VALUES {rows})) AS o
WHERE jobs.id = o.jid AND jobs.lease_token = o.tok AND jobs.status = 'running'
RETURNING jobs.id, jobs.lease_token"""
FINISH_CHUNK = 200  # outcomes per statement (8 bound values each)

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

    def value(self, column: str, value: object) -> object:
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
    the column types read them), by pair. One transaction of two statements per chunk of
    pairs (the claim of all of them, then their attempts); the rows are read into Python
    values after the write lock is given back."""
    types = types_of(engine)
    pairs = list(dict.fromkeys(wanted))  # a pair asked twice is claimed once

    def run(db: sqlite3.Connection) -> tuple[list[str], list[tuple[Any, ...]]]:
        names: list[str] = []
        got: list[tuple[Any, ...]] = []
        for at in range(0, len(pairs), CLAIM_CHUNK):
            chunk = pairs[at : at + CLAIM_CHUNK]
            cur = db.execute(
                CLAIM_PAIRS.format(pairs=", ".join("(?, ?)" for _ in chunk)),
                (
                    common["owner"],
                    common["expires"],
                    common["now"],
                    common["now"],
                    *(v for pair in chunk for v in pair),
                ),
            )
            rows = cur.fetchall()
            if not rows:
                continue
            names = names or [d[0] for d in cur.description]
            at_id, at_tok, at_n = (names.index(c) for c in ("id", "lease_token", "attempts"))
            db.executemany(
                NEW_ATTEMPTS,
                [(r[at_id], r[at_n], common["owner"], r[at_tok], common["now"]) for r in rows],
            )
            got.extend(rows)
        return names, got

    names, got = await sqlite_write(engine, run)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for values in got:
        row = types.row(names, values)
        out[(row["id"], row["lease_token"] - 1)] = row
    return out


async def finish_many(
    engine: AsyncEngine, outcomes: Sequence[tuple[Any, str | None]], now: float
) -> set[tuple[str, int]]:
    """Record each ``(store.Outcome, attempt error)`` (already storable) whose attempt
    still holds its lease, and close that attempt; the ``(job id, token)`` pairs
    recorded. One transaction."""
    types = types_of(engine)
    # an outcome given twice is recorded once, as the first (the second would find it done)
    firsts: dict[tuple[str, int], dict[str, Any]] = {}
    for o, aerror in outcomes:
        firsts.setdefault(
            (o.job_id, o.token),
            {
                "jid": o.job_id,
                "tok": o.token,
                "status": o.status,
                "result": types.value("result", o.result),
                "error": o.error,
                "error_type": o.error_type,
                "keep": o.fetches is None,  # no fetches given: those recorded stay
                "fetches": None if o.fetches is None else types.value("fetches", o.fetches),
                "now": now,
                "outcome": o.attempt_outcome or o.status,
                "aerror": aerror,
            },
        )
    order = ("jid", "tok", "status", "result", "error", "error_type", "keep", "fetches")
    rows = [tuple(p[k] for k in order) for p in firsts.values()]

    def run(db: sqlite3.Connection) -> set[tuple[str, int]]:
        done: set[tuple[str, int]] = set()
        for at in range(0, len(rows), FINISH_CHUNK):
            chunk = rows[at : at + FINISH_CHUNK]
            values = ", ".join("(?, ?, ?, ?, ?, ?, ?, ?)" for _ in chunk)
            got = db.execute(
                FINISH_ROWS.format(rows=values),
                (now, now, now, *(v for row in chunk for v in row)),
            ).fetchall()  # (an attempt that lost its lease is not among them: nothing written)
            done.update((jid, tok) for jid, tok in got)
        db.executemany(CLOSE_ATTEMPT, [p for pair, p in firsts.items() if pair in done])
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
