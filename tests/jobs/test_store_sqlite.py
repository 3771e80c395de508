"""The job store's one-call SQLite batches (jobs.queue.store_sqlite, jobs.db.sqlite_write):
what they store and read back is what the portable SQLAlchemy forms do, they are fenced
like them, a batch is all or nothing, and a writer of another process makes them wait,
not fail. Fencing and record tests run on both backends."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError, OperationalError

from jobs.db import create_engine, sqlite_write
from jobs.models import ChatSession, Job, JobAttempt, new_id
from jobs.queue import store, store_sqlite
from jobs.queue.dispatcher import Dispatcher

CTX = {"channel": "web", "actor_key": "w-1", "role_id": "r1", "session_id": "s-sqlite"}


def _new_job(**over: Any) -> dict[str, Any]:
    now = time.time()
    values = {
        "id": new_id(),
        "skill": "bg_sleep",
        "status": "queued",
        "attempts": 0,
        "input": {"text": "héllo", "n": 3, "nested": {"a": [1, 2.5, None]}},
        "context": {"channel": "web", "flags": [True, False]},
        "fetches": [],
        "channel": "web",
        "session_id": "s-sqlite",
        "external_id": "orgdeleg:o",
        "actor_key": "w-1",
        "role_id": "r1",
        "org_id": "o1",
        "priority": 3,
        "wall_sec": 60.0,
        "lease_token": 0,
        "cancel_requested": False,
        "arq_job_id": None,
        "created_at": now,
        "queued_at": now,
        "updated_at": now,
        "traceparent": None,
    }
    return {**values, **over}


SESSION_ROW = (
    "INSERT INTO chat_sessions (session_id, role_id, org_id, channel, external_id,"
    " created_at, updated_at) VALUES (?, '', '', 'web', '', 0, 0)"
)
SESSION = {
    "session_id": "s-sqlite",
    "role_id": "r1",
    "org_id": "o1",
    "channel": "web",
    "external_id": "orgdeleg:o",
}


async def test_claimed_row_reads_as_the_orm_reads_it(services) -> None:
    """The claim's row (input, context, flags, times) equals the ORM's read of the job."""
    values = _new_job()
    await store.record_jobs(services.sessionmaker, [(values, SESSION)])
    (claim,) = await store.claim_many(services.sessionmaker, [(values["id"], 0)], "w1", 30)
    assert claim is not None and claim.token == 1 and claim.attempt == 1
    async with services.sessionmaker() as s:
        job = await s.get(Job, values["id"])
        session = await s.get(ChatSession, "s-sqlite")
    assert job is not None and session is not None and session.external_id == "orgdeleg:o"
    for column in Job.__table__.c:
        assert getattr(claim.job, column.name) == getattr(job, column.name), column.name
    assert claim.job.cancel_requested is False
    assert claim.job.input == values["input"] and claim.job.status == "running"


async def test_finish_batch_is_fenced_per_attempt(services) -> None:
    """In one batch, the attempt that holds its lease is recorded and its attempt row closed;
    the one whose token moved on writes nothing."""
    a, b = _new_job(), _new_job()
    await store.record_jobs(services.sessionmaker, [(a, SESSION), (b, None)])
    claims = await store.claim_many(services.sessionmaker, [(a["id"], 0), (b["id"], 0)], "w1", 30)
    assert all(c is not None for c in claims)
    outcomes = [
        store.Outcome(a["id"], 1, "succeeded", {"ok": True, "text": "ü"}, None, None),
        store.Outcome(b["id"], 7, "failed", None, "stale attempt", "error"),
    ]
    assert await store.finish_many(services.sessionmaker, outcomes) == [True, False]
    async with services.sessionmaker() as s:
        ja, jb = await s.get(Job, a["id"]), await s.get(Job, b["id"])
        attempts = {r.job_id: r for r in (await s.scalars(select(JobAttempt))).all()}
    assert ja is not None and ja.status == "succeeded" and ja.result == {"ok": True, "text": "ü"}
    assert ja.lease_owner is None and ja.duration_ms is not None and ja.duration_ms >= 0
    assert attempts[a["id"]].outcome == "succeeded" and attempts[a["id"]].finished_at
    assert jb is not None and jb.status == "running" and jb.error is None
    assert attempts[b["id"]].finished_at is None and attempts[b["id"]].outcome == "running"


async def test_a_superseded_enqueue_claims_nothing(services) -> None:
    """A claim with an old enqueue token (or of a job claimed already) gets None and opens
    no attempt."""
    v = _new_job()
    await store.record_jobs(services.sessionmaker, [(v, None)])
    first = await store.claim_many(services.sessionmaker, [(v["id"], 0), (v["id"], 0)], "w1", 30)
    again = await store.claim_many(services.sessionmaker, [(v["id"], 0)], "w2", 30)
    assert first[0] is not None and first[1] is None and again == [None]
    async with services.sessionmaker() as s:
        rows = (await s.scalars(select(JobAttempt).where(JobAttempt.job_id == v["id"]))).all()
    assert [(r.number, r.worker_id, r.lease_token) for r in rows] == [(1, "w1", 1)]


async def test_a_batch_with_a_refused_row_records_nothing(services) -> None:
    """A duplicate job id refuses the whole batch with SQLAlchemy's IntegrityError (what
    the intake falls back on to record the others one by one); no row of it is kept."""
    dup = _new_job()
    await store.record_jobs(services.sessionmaker, [(dup, None)])
    fresh = _new_job()
    with pytest.raises(IntegrityError):
        await store.record_jobs(services.sessionmaker, [(fresh, None), (dict(dup), None)])
    async with services.sessionmaker() as s:
        assert await s.get(Job, fresh["id"]) is None


async def test_sqlite_dispatches_take_the_one_call_form(services, monkeypatch) -> None:
    """On SQLite the dispatcher's rows and sessions take the one-call form (a new column in
    the dispatcher's row must be added to the store's list, or every batch is slower)."""
    if services.engine.dialect.name != "sqlite":
        pytest.skip("SQLite only")
    calls: list[int] = []
    real = store_sqlite.record_jobs

    async def counting(engine, columns, rows, sessions):  # type: ignore[no-untyped-def]
        calls.append(len(rows))
        await real(engine, columns, rows, sessions)

    monkeypatch.setattr(store_sqlite, "record_jobs", counting)
    results = await asyncio.gather(
        *(Dispatcher(services).dispatch("bg_sleep", {}, CTX, "orgdeleg:o") for _ in range(10))
    )
    assert {r.status_code for r in results} == {202}
    assert sum(calls) == 10
    async with services.sessionmaker() as s:
        row = await s.get(ChatSession, "s-sqlite")
    assert row is not None and row.external_id == "orgdeleg:o" and row.role_id == "r1"


async def test_sqlite_write_rolls_back_on_error(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    try:

        def half(db: sqlite3.Connection) -> None:
            db.execute(SESSION_ROW, ("half",))
            raise ValueError("stop")

        with pytest.raises(ValueError):
            await sqlite_write(engine, half)

        def count(db: sqlite3.Connection) -> int:
            return int(db.execute("SELECT count(*) FROM chat_sessions").fetchone()[0])

        assert await sqlite_write(engine, count) == 0
    finally:
        await engine.dispose()


async def test_sqlite_write_waits_for_another_processs_writer(sqlite_url: str) -> None:
    """A write lock held by another connection (the other process of ``skilljobs up``) is
    waited for, then the batch commits: no "database is locked"."""
    path = sqlite_url.split(":///", 1)[1]
    held, release = threading.Event(), threading.Event()

    def other_writer() -> None:
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        db.execute(SESSION_ROW, ("other",))
        held.set()
        release.wait(10)
        db.execute("COMMIT")
        db.close()

    thread = threading.Thread(target=other_writer)
    thread.start()
    engine = create_engine(sqlite_url)
    try:
        held.wait(10)

        def mine(db: sqlite3.Connection) -> list[str]:
            db.execute(SESSION_ROW, ("mine",))
            rows = db.execute("SELECT session_id FROM chat_sessions ORDER BY session_id")
            return [r[0] for r in rows]

        task = asyncio.create_task(sqlite_write(engine, mine))
        await asyncio.sleep(0.3)
        assert not task.done()  # waiting for the lock, not failed
        release.set()
        assert await task == ["mine", "other"]
    finally:
        release.set()
        thread.join(10)
        await engine.dispose()


async def test_sqlite_write_gives_up_after_the_busy_timeout(sqlite_url: str, monkeypatch) -> None:
    """A lock held past the busy timeout is SQLAlchemy's OperationalError (what callers
    retry as "database unavailable"), and the connection is usable again after."""
    import jobs.db

    monkeypatch.setattr(jobs.db, "BUSY_TIMEOUT_MS", 200)
    path = sqlite_url.split(":///", 1)[1]
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    engine = create_engine(sqlite_url)
    try:

        def mine(db: sqlite3.Connection) -> None:
            db.execute(SESSION_ROW, ("mine",))

        with pytest.raises(OperationalError, match="locked"):
            await sqlite_write(engine, mine)
        other.execute("ROLLBACK")
        await sqlite_write(engine, mine)
    finally:
        other.close()
        await engine.dispose()
