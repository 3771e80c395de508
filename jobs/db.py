"""Database engine and sessions: SQLAlchemy 2 async on PostgreSQL (asyncpg) or SQLite (aiosqlite)."""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import queue
import sqlite3
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from sqlalchemy import Insert, event
from sqlalchemy.engine import URL, CursorResult, Engine, Result, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.pool import ConnectionPoolEntry, Pool, PoolProxiedConnection

# A factory of sessions on our database; store-style functions take one.
Sessions = async_sessionmaker[AsyncSession]
# "Does this attempt still hold its lease?": checked before every write that must be fenced.
Fence = Callable[[], Awaitable[bool]]


def rowcount(result: Result[Any]) -> int:
    """The rows an UPDATE, INSERT or DELETE touched. ``AsyncSession.execute`` is typed as
    returning a ``Result``; a DML statement's is the ``CursorResult`` that counts them."""
    return cast(CursorResult[Any], result).rowcount


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

# Server states that mean "the database is away", not "this statement is wrong": connection
# exceptions (08…), shutting down or starting up (57P01–57P03), too many connections.
_AWAY_STATES = ("08", "57P01", "57P02", "57P03", "53300")


def db_unavailable(exc: BaseException) -> bool:
    """Is ``exc`` the database being unreachable (wait and retry) rather than a bug or a
    refused value (report)? asyncpg's "the database system is starting up" arrives as a
    plain ``DBAPIError``, told apart by its SQLSTATE."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    # the driver's own error may arrive unwrapped (a batch hands it on as it came) or as the
    # cause of another (raise … from): its SQLSTATE is looked for along the causes
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, DB_UNAVAILABLE):
            return True
        if isinstance(cur, DBAPIError):
            if cur.connection_invalidated:
                return True
            state = getattr(cur.orig, "sqlstate", None) or ""
        else:
            state = getattr(cur, "sqlstate", None) or ""
        if isinstance(state, str) and state.startswith(_AWAY_STATES):
            return True
        cur = cur.__cause__
    return False


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
# How long a writer that has just committed lets another process's waiting writer go first
# (at most, s), and how old a waiter's note may be before it is taken as gone (s).
TURN_YIELD_S = 0.005
TURN_STALE_S = 0.02

# Every SQLite connection's settings. WAL lets readers read while a writer writes
# (synchronous=NORMAL: no fsync per commit, only at checkpoints); per connection a 16 MiB
# page cache (default 2 MiB), temporary b-trees in memory, and reads through a 256 MiB
# memory map instead of read() calls. Pooled connections also wait out another writer
# (busy_timeout), so contention is waiting instead of "database is locked".
_SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
    "PRAGMA cache_size=-16384",
    "PRAGMA temp_store=MEMORY",
    "PRAGMA mmap_size=268435456",
)

# Pools of engines whose connections go through PgBouncer in transaction mode.
_PGBOUNCER: weakref.WeakSet[Pool] = weakref.WeakSet()


def create_engine(url: str, *, echo: bool = False) -> AsyncEngine:
    """An async engine with the settings each backend needs for concurrent workers."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, echo=echo, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
            cur = dbapi_conn.cursor()
            for pragma in _SQLITE_PRAGMAS:
                cur.execute(pragma)
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.close()

        return engine
    if behind_pgbouncer(url):
        return _pgbouncer_engine(parsed.difference_update_query(["pgbouncer"]), echo)
    # No pre-ping (a round trip per checkout): a connection broken by a server restart
    # fails once, SQLAlchemy then invalidates the pool, and callers retry (jobs.queue.worker).
    engine = create_async_engine(
        url, echo=echo, pool_size=10, max_overflow=20, pool_recycle=int(_HELD_SEC)
    )
    _track_held(engine)
    return engine


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
    _track_held(engine)
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


# asyncpg's errors, by what they mean for the connection: (lost — server restart, network,
# shutdown —, refused by the server — the connection is fine).
def _driver_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    try:
        import asyncpg
    except ImportError:  # pragma: no cover - SQLite-only installs
        return (OSError, TimeoutError), ()
    lost = (
        OSError,
        TimeoutError,
        asyncpg.InterfaceError,
        asyncpg.PostgresConnectionError,
        asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, cannot connect now
        # a connection the server dropped in the middle of a statement can be left mid-state
        # ("cannot switch to state …; another operation is in progress"): it is lost too
        asyncpg.InternalClientError,
    )
    return lost, (asyncpg.PostgresError,)


_ERRORS: tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]] | None = None


# raw_fetch keeps a few connections of each pool checked out between its statements: a
# checkout and check-in through SQLAlchemy cost more CPU (~110 µs) than a short statement
# on asyncpg itself (~60 µs), on every claim, finish and receipt batch. Per pool, at most
# _HELD_MAX idle ones (the most statements of the hot paths in flight at once), each kept
# at most _HELD_SEC (the pool's recycle age); a connection that fails or is interrupted is
# never kept, and the engine's dispose closes those kept (``_track_held``).
_HELD_MAX = 4
_HELD_SEC = 1800.0
_held: dict[
    int, list[tuple[PoolProxiedConnection, float]]
] = {}  # id(pool) -> [(checked-out fairy, since)]
_held_pid = os.getpid()


def _track_held(engine: AsyncEngine) -> None:
    """Close the connections raw_fetch keeps of ``engine``'s pool when it is disposed."""
    state = {"pool": engine.sync_engine.pool}

    @event.listens_for(engine.sync_engine, "engine_disposed")
    def _disposed(eng: Engine) -> None:
        _drop_held(state["pool"])
        state["pool"] = eng.pool


def _drop_held(pool: Pool) -> None:
    for fairy, _since in _held.pop(id(pool), []):
        with contextlib.suppress(Exception):
            fairy.invalidate()


async def _checkout(engine: AsyncEngine) -> PoolProxiedConnection:
    global _held_pid
    if _held_pid != os.getpid():  # a forked child: the parent's sockets are not ours
        _held.clear()
        _held_pid = os.getpid()
    pool = engine.sync_engine.pool
    free = _held.get(id(pool))
    now = time.monotonic()
    while free:
        fairy, since = free.pop()
        if now - since < _HELD_SEC and fairy.is_valid:
            return fairy
        with contextlib.suppress(Exception):
            fairy.invalidate()
    return await engine.raw_connection()


def _checkin(engine: AsyncEngine, fairy: PoolProxiedConnection) -> None:
    pool = engine.sync_engine.pool
    free = _held.setdefault(id(pool), [])
    if len(free) < _HELD_MAX and fairy.is_valid:
        free.append((fairy, time.monotonic()))
    else:
        fairy.close()  # back to the pool (no transaction is open: nothing to roll back)


async def raw_fetch(engine: AsyncEngine, sql: str, *args: Any) -> list[Any]:
    """Run one statement straight on a pooled asyncpg connection (PostgreSQL hot paths).

    For statements that carry a whole batch, SQLAlchemy's per-row result processing costs
    more than the database does. Outside a transaction the statement commits on its own
    (behind PgBouncer it is wrapped in one, so it keeps one server connection). asyncpg
    prepares and caches the statement per connection. A lost connection is invalidated,
    with every connection of its pool opened before it (the server restarted: they are
    dead too), and reported as SQLAlchemy's ``OperationalError``, like every other
    database outage (callers retry those). JSON/JSONB columns come back decoded (the
    dialect registers the codecs).
    """
    global _ERRORS
    lost, refused = _ERRORS or (_ERRORS := _driver_errors())
    fairy = await _checkout(engine)
    driver: Any = fairy.driver_connection
    try:
        if engine.sync_engine.pool in _PGBOUNCER:  # one transaction: one server connection
            async with driver.transaction():
                rows: list[Any] = await driver.fetch(sql, *args)
        else:
            rows = await driver.fetch(sql, *args)
    except lost as exc:
        pool = engine.sync_engine.pool
        _drop_held(pool)
        cause = exc if isinstance(exc, Exception) else None
        try:  # this connection and every older one of the pool (as SQLAlchemy's own)
            pool._invalidate(fairy, cause)
        except Exception:
            with contextlib.suppress(Exception):
                fairy.invalidate(cause)
        raise OperationalError(
            sql, args, exc, hide_parameters=True, connection_invalidated=True
        ) from exc
    except refused:
        _checkin(engine, fairy)  # the server refused the statement: the connection is fine
        raise
    except BaseException:
        # interrupted mid-statement (cancelled): its state is unknown, never reused
        with contextlib.suppress(Exception):
            fairy.invalidate()
        raise
    _checkin(engine, fairy)
    return rows


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
    """Run ``fn`` on the SQLite database of ``engine`` as (part of) one write transaction,
    by this process's one writer of that file (SQLite hot paths).

    Through SQLAlchemy each statement is several hand-offs between the event loop and the
    aiosqlite thread (cursor, execute, fetch, close), plus a pool checkout and a rollback
    on return, and the write lock is held across all of them while the other process of
    ``skilljobs up`` waits for it. Here ``fn`` runs on the writer's own ``sqlite3``
    connection, in its thread, between ``BEGIN IMMEDIATE`` (the write lock taken first, so
    the transaction can never fail to upgrade a read; see :func:`_lock` for the wait) and
    ``COMMIT``, and returns once committed. Calls that arrive while the writer is busy go
    in its next transaction together (group commit: one lock, one commit, one wake-up of
    the event loop for them all), so writers of one process never wait for each other's
    lock. An exception from ``fn`` rolls back its own writes only: the others of its
    transaction are run again without it, so ``fn`` must depend on nothing but the
    database (it may run more than once, and is kept only once). Errors of ``sqlite3``
    come back as SQLAlchemy's (``OperationalError`` for a locked or unavailable database).
    """
    writer = _writer_of(engine)
    try:
        if writer is None:  # an in-memory database: only the pool's connections see it
            return await _pooled_write(engine, fn)
        result: T = await writer.submit(fn)
        return result
    except sqlite3.Error as exc:
        raise DBAPIError.instance(
            "sqlite_write", None, exc, sqlite3.Error, hide_parameters=True
        ) from exc


async def _pooled_write(engine: AsyncEngine, fn: Callable[[sqlite3.Connection], T]) -> T:
    """:func:`sqlite_write` on a pooled connection, in one call to its aiosqlite thread."""

    def run(db: sqlite3.Connection) -> T:
        db.execute("PRAGMA busy_timeout=0")
        try:
            _lock(db)
        finally:
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
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
        # aiosqlite's own queue of calls for its thread: one hand-off for the whole batch.
        result: T = await driver._execute(run, driver._conn)
        return result


class _Turns:
    """Turn-taking between the processes that write one SQLite file (the web app and the
    worker of ``skilljobs up``): SQLite's write lock goes to whoever asks first after a
    commit, so a process that commits and starts its next transaction at once can keep a
    waiting one out for several of its transactions. A writer kept out notes itself (its
    pid and the time, in a 16-byte file mapped by every writer beside the database); a
    writer about to take the lock lets a noted one of another process go first, for at
    most ``TURN_YIELD_S``. A note is only a hint: the lock itself is SQLite's, a torn or
    stale note (its writer gone, older than ``TURN_STALE_S``) is ignored."""

    def __init__(self, path: str) -> None:
        self.pid = os.getpid()
        fd = os.open(f"{path}-turns", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(fd).st_size < 16:
                os.ftruncate(fd, 16)
            self._map = mmap.mmap(fd, 16)
        finally:
            os.close(fd)

    def _other_waits(self) -> bool:
        pid, since = struct.unpack_from("<qd", self._map)
        return pid not in (0, self.pid) and 0 <= time.monotonic() - since < TURN_STALE_S

    def give_way(self) -> None:
        """Before taking the lock: let another process's waiting writer go first."""
        end = time.monotonic() + TURN_YIELD_S
        while self._other_waits() and time.monotonic() < end:
            time.sleep(0.0002)

    def waiting(self) -> None:
        struct.pack_into("<qd", self._map, 0, self.pid, time.monotonic())

    def served(self) -> None:
        if struct.unpack_from("<q", self._map)[0] == self.pid:
            struct.pack_into("<qd", self._map, 0, 0, 0.0)

    def close(self) -> None:
        self._map.close()


def _lock(db: sqlite3.Connection, turns: _Turns | None = None) -> None:
    """``BEGIN IMMEDIATE`` on ``db`` (whose busy timeout is 0), trying again every 0.5-2 ms
    while another connection writes, for up to ``BUSY_TIMEOUT_MS``. SQLite's own busy
    handler backs off to 100 ms between tries, so a waiter can find the lock taken again by
    the other process at each try and wait far longer than the transactions it waits for
    (the tail of the dispatch receipts); ``turns`` (this process's writer) also lets a
    waiting writer of another process in first, and is noted as waiting while kept out."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = LOCK_PAUSE_S[0]
    if turns is not None:
        turns.give_way()
    while True:
        try:
            db.execute("BEGIN IMMEDIATE")
            if turns is not None:
                turns.served()
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
        if turns is not None:
            turns.waiting()
        time.sleep(pause)
        pause = min(pause * 2, LOCK_PAUSE_S[1])


# a call handed to a writer: its future and the function to run on the connection
_Call = tuple[asyncio.Future[Any], Callable[[sqlite3.Connection], Any]]


class _Writer:
    """The one writer of a SQLite file in this process: a thread with its own connection
    that runs the calls handed to it, those waiting together in one transaction."""

    #: calls in one transaction at most (the write lock is held for all of them)
    MAX_GROUP = 64

    def __init__(self, path: str) -> None:
        self.path = path
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._turns: _Turns | None = None  # made with the connection
        self._thread = threading.Thread(target=self._serve, name="sqlite-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._calls.put((fut, fn))
        return fut

    def close(self) -> None:
        """Stop after the calls handed over so far (they are still run)."""
        self._calls.put(None)

    def _serve(self) -> None:
        db: sqlite3.Connection | None = None
        try:
            while (first := self._calls.get()) is not None:
                group, stop = [first], False
                while len(group) < self.MAX_GROUP:
                    try:
                        nxt = self._calls.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                        break
                    group.append(nxt)
                try:
                    db = db or self._open()
                except Exception as exc:  # the file cannot be opened now: tell each caller
                    _settle([(fut, False, exc) for fut, _ in group])
                else:
                    _settle(_transactions(db, group, self._turns))
                if stop:
                    break
        finally:
            if db is not None:
                db.close()
            if self._turns is not None:
                self._turns.close()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
        for pragma in _SQLITE_PRAGMAS:
            db.execute(pragma)
        db.execute("PRAGMA busy_timeout=0")  # _lock waits for the write lock itself
        if self._turns is None:
            with contextlib.suppress(OSError, ValueError):  # (without it: no turn-taking)
                self._turns = _Turns(self.path)
        return db


def _transactions(
    db: sqlite3.Connection, group: list[_Call], turns: _Turns | None = None
) -> list[tuple[Any, bool, Any]]:
    """Run the calls of ``group`` in one transaction; a call that raises is rolled back
    with it and the transaction is run again without that call. Each call's ``(future,
    ok, result or exception)``."""
    out: list[tuple[Any, bool, Any]] = []
    todo = list(group)
    while todo:
        try:
            _lock(db, turns)
        except Exception as exc:  # nothing was written: every caller gets the error
            return [*out, *((fut, False, exc) for fut, _ in todo)]
        results: list[Any] = []
        failed: int | None = None
        error: BaseException | None = None
        for i, (_, fn) in enumerate(todo):
            try:
                results.append(fn(db))
            except BaseException as exc:  # handed to its caller, like a statement's error
                failed, error = i, exc
                break
        if failed is not None:
            if db.in_transaction:
                db.execute("ROLLBACK")
            out.append((todo[failed][0], False, error))
            del todo[failed]
            continue
        try:
            db.execute("COMMIT")
        except Exception as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            return [*out, *((fut, False, exc) for fut, _ in todo)]
        return [*out, *((fut, True, r) for (fut, _), r in zip(todo, results, strict=True))]
    return out


def _settle(outcomes: list[tuple[Any, bool, Any]]) -> None:
    """Hand each outcome to its future, one wake-up per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, bool, Any]]] = {}
    for item in outcomes:
        by_loop.setdefault(item[0].get_loop(), []).append(item)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, items)
        except RuntimeError:  # that loop is closed: nobody waits for these any more
            pass


def _resolve(items: list[tuple[Any, bool, Any]]) -> None:
    for fut, ok, value in items:
        if fut.done():  # the caller was cancelled; the write happened all the same
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


_writers: weakref.WeakKeyDictionary[Engine, _Writer] = weakref.WeakKeyDictionary()


def _writer_of(engine: AsyncEngine) -> _Writer | None:
    """The writer of ``engine``'s SQLite file, started on first use and stopped when the
    engine is disposed (or collected); None for an in-memory database."""
    sync = engine.sync_engine
    found = _writers.get(sync)
    if found is not None:
        return found
    url = sync.url
    path = url.database
    if not path or path == ":memory:" or path.startswith("file:") or url.query.get("uri"):
        return None
    found = _writers[sync] = _Writer(path)
    event.listen(sync, "engine_disposed", lambda _conn: _stop_writer(sync))
    weakref.finalize(sync, found.close)
    return found


def _stop_writer(sync: Engine) -> None:
    writer = _writers.pop(sync, None)
    if writer is not None:
        writer.close()


def engine_of(sm: Sessions) -> AsyncEngine:
    return cast(AsyncEngine, sm.kw["bind"])


def create_sessionmaker(engine: AsyncEngine) -> Sessions:
    return async_sessionmaker(engine, expire_on_commit=False)


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def insert_new(sm: Sessions, model: type[DeclarativeBase]) -> Insert:
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

    def __init__(self, factory: Sessions) -> None:
        self._factory = factory
        self._session: AsyncSession | None = None

    @property
    def opened(self) -> bool:
        return self._session is not None

    def _get(self) -> AsyncSession:
        if self._session is None:
            self._session = self._factory()
        return self._session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
