"""Database engine and sessions: SQLAlchemy 2 async on PostgreSQL (asyncpg) or SQLite (aiosqlite)."""

from __future__ import annotations

import sqlite3
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

# A factory of sessions on our database; store-style functions take one.
Sessions = async_sessionmaker[AsyncSession]
# "Does this attempt still hold its lease?": checked before every write that must be fenced.
Fence = Callable[[], Awaitable[bool]]


class HasSessions(Protocol):
    sessionmaker: Sessions


def sessions_of(target: HasSessions | Sessions) -> Sessions:
    """A ``Services`` (anything with a ``sessionmaker``) or a bare sessionmaker → the
    sessionmaker."""
    return target if isinstance(target, async_sessionmaker) else target.sessionmaker


# "The database went away": what a caller waits out and retries, never reports as a bug.
DB_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionError,
    TimeoutError,
    OperationalError,
    InterfaceError,
)

T = TypeVar("T")


def behind_pgbouncer(url: str) -> bool:
    """Does ``url`` go through PgBouncer: ``?pgbouncer=true`` (what
    ``SKILLJOBS_DATABASE_PGBOUNCER`` adds), or PgBouncer's usual port 6432."""
    parsed = make_url(url)
    flag = str(parsed.query.get("pgbouncer", "")).lower()
    if flag:
        return flag in {"1", "true", "yes", "on"}
    return parsed.get_backend_name() == "postgresql" and parsed.port == 6432


# How long a SQLite statement waits for the write lock before "database is locked".
BUSY_TIMEOUT_MS = 30_000
# The pauses of :func:`sqlite_write` between tries for the write lock: first, longest (s).
LOCK_PAUSE_S = (0.0005, 0.002)

# Pools of engines whose connections go through PgBouncer in transaction mode.
_PGBOUNCER: weakref.WeakSet[Any] = weakref.WeakSet()


def create_engine(url: str, *, echo: bool = False) -> AsyncEngine:
    """An async engine with the settings each backend needs for concurrent workers."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, echo=echo, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            # WAL lets the web app read while a worker writes; busy_timeout turns
            # writer contention into waiting instead of "database is locked".
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            # Per connection: a 16 MiB page cache (default 2 MiB), temporary b-trees in
            # memory, and reads through a 256 MiB memory map instead of read() calls.
            cur.execute("PRAGMA cache_size=-16384")
            cur.execute("PRAGMA temp_store=MEMORY")
            cur.execute("PRAGMA mmap_size=268435456")
            cur.close()

        return engine
    if behind_pgbouncer(url):
        return _pgbouncer_engine(parsed.difference_update_query(["pgbouncer"]), echo)
    # No pre-ping (a round trip per checkout): a connection broken by a server restart
    # fails once, SQLAlchemy then invalidates the pool, and callers retry (jobs.queue.worker).
    return create_async_engine(url, echo=echo, pool_size=10, max_overflow=20, pool_recycle=1800)


def _pgbouncer_engine(url: URL, echo: bool) -> AsyncEngine:
    """PgBouncer in transaction mode hands each transaction to any server connection: no
    statement may outlive its transaction. So no statement caches, uniquely named
    prepared statements, every statement inside a transaction (no autocommit view)."""
    engine = create_async_engine(
        url,
        echo=echo,
        pool_size=10,
        max_overflow=20,
        pool_recycle=1800,
        connect_args={
            "statement_cache_size": 0,
            "prepared_statement_cache_size": 0,
            "prepared_statement_name_func": lambda: f"__sj_{uuid.uuid4().hex}__",
        },
    )
    _PGBOUNCER.add(engine.sync_engine.pool)
    return engine


_autocommit: dict[int, AsyncEngine] = {}


def autocommit(engine: AsyncEngine) -> AsyncEngine | None:
    """On PostgreSQL, a view of ``engine`` (same pool) whose connections autocommit: a
    single statement is one round trip (no BEGIN/COMMIT). None on other backends."""
    if engine.dialect.name != "postgresql" or engine.sync_engine.pool in _PGBOUNCER:
        return None
    ac = _autocommit.get(id(engine))
    if ac is None or ac.sync_engine.pool is not engine.sync_engine.pool:
        ac = _autocommit[id(engine)] = engine.execution_options(isolation_level="AUTOCOMMIT")
    return ac


# asyncpg errors that mean "this connection is gone" (server restart, network, shutdown)
def _lost_errors() -> tuple[type[BaseException], ...]:
    try:
        import asyncpg
    except ImportError:  # pragma: no cover - SQLite-only installs
        return (OSError, TimeoutError)
    return (
        OSError,
        TimeoutError,
        asyncpg.InterfaceError,
        asyncpg.PostgresConnectionError,
        asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, cannot connect now
    )


_LOST: tuple[type[BaseException], ...] | None = None


async def raw_fetch(engine: AsyncEngine, sql: str, *args: Any) -> list[Any]:
    """Run one statement straight on the pooled asyncpg connection (PostgreSQL hot paths).

    For statements that carry a whole batch, SQLAlchemy's per-row result processing costs
    more than the database does. ``engine`` should be the :func:`autocommit` view: the
    statement commits on its own. asyncpg prepares and caches the statement per
    connection. A lost connection is invalidated and reported as SQLAlchemy's
    ``OperationalError``, like every other database outage (callers retry those).
    JSON/JSONB columns come back decoded (the dialect registers the codecs).
    """
    global _LOST
    lost = _LOST or (_LOST := _lost_errors())
    async with engine.connect() as conn:
        fairy = await conn.get_raw_connection()
        driver: Any = fairy.driver_connection
        try:
            if engine.sync_engine.pool in _PGBOUNCER:  # one transaction: one server connection
                async with driver.transaction():
                    rows: list[Any] = await driver.fetch(sql, *args)
            else:
                rows = await driver.fetch(sql, *args)
            return rows
        except lost as exc:
            await conn.invalidate(exc if isinstance(exc, Exception) else None)
            raise OperationalError(
                sql, args, exc, hide_parameters=True, connection_invalidated=True
            ) from exc


async def once_more_if_disconnected(fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any) -> T:
    """Run ``fn``; if it failed because its pooled connection was dead (PostgreSQL restarted
    since it was opened), run it once more on a fresh one.

    There is no pre-ping (a round trip on every checkout): the first statement after a
    restart finds the dead connection, SQLAlchemy invalidates the pool, and this one retry
    keeps that from reaching a caller. Only for idempotent calls, or writes that fail
    before reaching the server (a dead socket is found on send).
    """
    try:
        return await fn(*args, **kw)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        return await fn(*args, **kw)


async def sqlite_write(engine: AsyncEngine, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` on a pooled SQLite connection as one write transaction, in one call to
    the connection's thread (SQLite hot paths).

    Through SQLAlchemy each statement is several hand-offs between the event loop and the
    aiosqlite thread (cursor, execute, fetch, close), and the write lock is held across
    all of them, while the other process of ``skilljobs up`` waits for it. Here ``fn`` runs
    on the ``sqlite3`` connection itself, between ``BEGIN IMMEDIATE`` (the write lock is
    taken first, so the transaction can never fail to upgrade a read; see
    :func:`_begin_immediate` for the wait) and ``COMMIT``; an exception rolls it back. Errors of ``sqlite3`` come
    back as SQLAlchemy's (``OperationalError`` for a locked or unavailable database).
    """

    def run(db: sqlite3.Connection) -> T:
        _begin_immediate(db)
        try:
            out = fn(db)
        except BaseException:
            db.rollback()
            raise
        db.commit()
        return out

    async with engine.connect() as conn:
        fairy = await conn.get_raw_connection()
        driver: Any = fairy.driver_connection  # aiosqlite.Connection
        try:
            # aiosqlite's own queue of calls for its thread: one hand-off for the whole batch.
            result: T = await driver._execute(run, driver._conn)
            return result
        except sqlite3.Error as exc:
            raise DBAPIError.instance(
                "sqlite_write", None, exc, sqlite3.Error, hide_parameters=True
            ) from exc


def _begin_immediate(db: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE``, trying again every 0.5-2 ms while another connection writes, for
    up to ``BUSY_TIMEOUT_MS``. SQLite's own busy handler backs off to 100 ms between tries,
    so a waiter can find the lock taken again by the other process at each try and wait far
    longer than the transactions it waits for last (the tail of the dispatch receipts)."""
    db.execute("PRAGMA busy_timeout=0")
    try:
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        pause = LOCK_PAUSE_S[0]
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, LOCK_PAUSE_S[1])
    finally:
        db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")


def engine_of(sm: async_sessionmaker[AsyncSession]) -> AsyncEngine:
    return sm.kw["bind"]  # type: ignore[no-any-return]


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def insert_new(sm: async_sessionmaker[AsyncSession], model: Any) -> Any:
    """``INSERT … ON CONFLICT DO NOTHING`` on ``model`` in the dialect of ``sm``'s engine:
    a row that already exists is left alone and counted as 0 rows, without an error."""
    if is_sqlite(engine_of(sm)):
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(model).on_conflict_do_nothing()
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    return pg_insert(model).on_conflict_do_nothing()


class LazySession:
    """An ``AsyncSession`` look-alike that opens a real session only when first used.

    Skills get it as ``ctx["db"]``; most never touch the database, so opening a
    connection for each run would be waste.
    """

    def __init__(self, factory: async_sessionmaker[AsyncSession]) -> None:
        self._factory = factory
        self._session: AsyncSession | None = None

    @property
    def opened(self) -> bool:
        return self._session is not None

    def _get(self) -> AsyncSession:
        if self._session is None:
            self._session = self._factory()
        return self._session

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._get(), name)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
