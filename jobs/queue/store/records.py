"""New jobs: their rows, their origin chat sessions and idempotency keys, written in one
statement (PostgreSQL), one call (SQLite) or one transaction; jobs recorded but never
enqueued are removed."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    delete,
    insert,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from jobs import storable
from jobs.catalog.configs import ConfigChanged
from jobs.db import Sessions, engine_of, is_sqlite, raw_fetch
from jobs.models import (
    QUEUED,
    ChatSession,
    DispatchKey,
    Job,
    config_generation,
)
from jobs.queue.store import sqlite
from jobs.queue.store.tables import job_table, pg_engine, to_json

# An idempotency key a new job's dispatch claims with it: (key, request hash, created_at).


DispatchKeyRow = tuple[str, str, float]


async def ensure_session(
    conn: AsyncConnection | AsyncSession,
    session_id: str,
    *,
    role_id: str,
    org_id: str,
    channel: str,
    external_id: str,
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
    pg = pg_engine(sm)
    if pg is not None:
        async with pg.connect() as conn:
            if session is not None:
                await ensure_session(conn, **session)
            await conn.execute(insert(job_table), values)
        return
    async with engine_of(sm).begin() as conn:
        if session is not None:
            await ensure_session(conn, **session)
        await conn.execute(insert(job_table), values)


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
    pg = pg_engine(sm)
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
        return await sqlite.record_jobs(
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
            await conn.execute(insert(job_table), rows)
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
        [to_json(r[name]) for r in rows] if kind == "jsonb" else [r[name] for r in rows]
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
