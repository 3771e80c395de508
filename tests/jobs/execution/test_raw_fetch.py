"""raw_fetch, the PostgreSQL hot paths' one statement: the connections it keeps between
statements, and what it never keeps (interrupted ones), on a real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from jobs import db
from jobs.db import autocommit, create_engine, raw_fetch


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg", "postgresql")


async def _backends(url: str) -> set[int]:
    conn = await asyncpg.connect(_plain(url))
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return {r["pid"] for r in rows}
    finally:
        await conn.close()


async def _gone(url: str, pid: int, limit: float = 15.0) -> bool:
    """Whether backend ``pid`` is gone from the server within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while pid in await _backends(url):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _running(url: str, query: str) -> bool:
    """Whether another backend of this database is running ``query`` now."""
    conn = await asyncpg.connect(_plain(url))
    try:
        found = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state = 'active' AND query = $1",
            query,
        )
        return bool(found)
    finally:
        await conn.close()


@pytest.fixture
async def ac(pg_url: str) -> AsyncIterator[AsyncEngine]:
    """raw_fetch's engine: the autocommit view of a fresh engine, disposed afterwards."""
    engine = create_engine(pg_url)
    view = autocommit(engine)
    assert view is not None
    yield view
    await engine.dispose()


async def test_statements_reuse_a_kept_connection_and_dispose_closes_it(pg_url: str) -> None:
    engine = create_engine(pg_url)
    ac = autocommit(engine)
    assert ac is not None
    try:
        pids = {(await raw_fetch(ac, "SELECT pg_backend_pid() AS p"))[0]["p"] for _ in range(20)}
        assert len(pids) == 1  # one connection, kept checked out between the statements
        # what it writes is committed on its own (no transaction left open): seen elsewhere
        await raw_fetch(ac, "CREATE TABLE IF NOT EXISTS raw_fetch_t (x int)")
        await raw_fetch(ac, "INSERT INTO raw_fetch_t VALUES (7)")
        other = await asyncpg.connect(_plain(pg_url))
        try:
            assert await other.fetchval("SELECT x FROM raw_fetch_t") == 7
            await other.execute("DROP TABLE raw_fetch_t")
        finally:
            await other.close()
        # many at once: at most a few are kept afterwards, the rest go back to the pool
        await asyncio.gather(*(raw_fetch(ac, "SELECT pg_sleep(0.05)") for _ in range(8)))
        assert 1 <= len(db._held[id(engine.sync_engine.pool)]) <= db._HELD_MAX
        pid = next(iter(pids))
        assert pid in await _backends(pg_url)
    finally:
        await engine.dispose()
    assert await _gone(pg_url, pid)  # the server notices the close a moment later
    assert id(engine.sync_engine.pool) not in db._held


async def test_a_refused_statement_keeps_the_connection_an_interrupted_one_does_not(
    ac: AsyncEngine, pg_url: str
) -> None:
    (first,) = await raw_fetch(ac, "SELECT pg_backend_pid() AS p")
    with pytest.raises(asyncpg.DivisionByZeroError):
        await raw_fetch(ac, "SELECT 1 / 0")
    (again,) = await raw_fetch(ac, "SELECT pg_backend_pid() AS p")
    assert again["p"] == first["p"]  # refused by the server: the connection was fine

    slow = asyncio.create_task(raw_fetch(ac, "SELECT pg_sleep(30)"))
    deadline = time.monotonic() + 15  # interrupted once it runs on the server
    while not await _running(pg_url, "SELECT pg_sleep(30)") and not slow.done():
        assert time.monotonic() < deadline, "the statement never started"
        await asyncio.sleep(0.05)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    # the interrupted connection is not handed to the next statement, which answers (not
    # after the ~30 s of the interrupted sleep)
    async with asyncio.timeout(15):
        (after,) = await raw_fetch(ac, "SELECT pg_backend_pid() AS p, 1 AS one")
    assert after["one"] == 1 and after["p"] != first["p"]


async def test_a_killed_connection_is_reported_and_not_kept(ac: AsyncEngine, pg_url: str) -> None:
    (first,) = await raw_fetch(ac, "SELECT pg_backend_pid() AS p")
    admin = await asyncpg.connect(_plain(pg_url))
    try:
        await admin.fetch("SELECT pg_terminate_backend($1)", first["p"])
    finally:
        await admin.close()
    assert await _gone(pg_url, first["p"])  # (the backend exits a moment after the signal)
    with pytest.raises(OperationalError) as caught:
        await raw_fetch(ac, "SELECT 1")
    assert caught.value.connection_invalidated
    # the retry every caller makes gets a live connection
    rows = await db.once_more_if_disconnected(raw_fetch, ac, "SELECT pg_backend_pid() AS p")
    assert rows[0]["p"] != first["p"]


async def test_the_claims_unflushed_commit_stays_its_own(ac: AsyncEngine, pg_url: str) -> None:
    """The claim commits without waiting for its WAL flush; the statements after it on the
    same connection (a finish, a receipt) still wait for theirs."""
    from jobs.queue.store import claims

    (before,) = await raw_fetch(ac, "SELECT pg_backend_pid() AS p")
    claimed = await raw_fetch(ac, claims._PG_CLAIM, ["no-such-job"], [0], "w", 0.0, 0.0)
    assert claimed == []
    (after,) = await raw_fetch(
        ac, "SELECT pg_backend_pid() AS p, current_setting('synchronous_commit') AS s"
    )
    assert after["p"] == before["p"] and after["s"] == "on"
