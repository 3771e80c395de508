"""The job store's one-call SQLite batches (jobs.queue.store.sqlite, jobs.db.sqlite_write):
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

from jobs.db import _writer_of, create_engine, sqlite_write
from jobs.models import ChatSession, Job, JobAttempt, new_id
from jobs.queue import store
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.store import sqlite as store_sqlite

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
async def test_big_batches_claim_and_record_each_job_once(services) -> None:
    """A claim of more pairs than one statement takes (old tokens and repeats among them)
    claims each current pair once, with one attempt each; a record of many outcomes keeps
    the fetches of those that bring none, replaces those of the others, records an
    outcome given twice once (as the first) and writes nothing for a stale attempt."""
    sm = services.sessionmaker
    jobs = [_new_job(fetches=[{"url": "https://example.org/kept"}]) for _ in range(450)]
    await store.record_jobs(sm, [(j, SESSION if i == 0 else None) for i, j in enumerate(jobs)])
    wanted = [(j["id"], 0) for j in jobs] + [(jobs[0]["id"], 0), (jobs[1]["id"], 5)]
    claims = await store.claim_many(sm, wanted, "w1", 30)
    assert [c is not None for c in claims] == [True] * 450 + [False, False]
    assert {c.job.id for c in claims if c} == {j["id"] for j in jobs}
    assert all(c.token == 1 and c.attempt == 1 and c.job.status == "running" for c in claims if c)
    new_fetches = [{"url": "https://example.org/new"}]
    outcomes = [
        store.Outcome(
            j["id"],
            1,
            "succeeded",
            {"ok": True, "n": i},
            None,
            None,
            fetches=new_fetches if i % 2 else None,
        )
        for i, j in enumerate(jobs[:300])
    ]
    outcomes.append(store.Outcome(jobs[0]["id"], 1, "failed", None, "twice", "error"))
    outcomes.append(store.Outcome(jobs[300]["id"], 4, "failed", None, "stale", "error"))
    done = await store.finish_many(sm, outcomes)
    assert done == [True] * 301 + [False]  # (the pair given twice is recorded)
    async with sm() as s:
        rows = {r.id: r for r in (await s.scalars(select(Job))).all()}
        attempts = (await s.scalars(select(JobAttempt))).all()
    assert len(attempts) == 450
    closed = {a.job_id: a.outcome for a in attempts if a.finished_at is not None}
    assert closed == {j["id"]: "succeeded" for j in jobs[:300]}
    for i, j in enumerate(jobs[:300]):
        row = rows[j["id"]]
        assert row.status == "succeeded" and row.result == {"ok": True, "n": i}
        assert row.fetches == (new_fetches if i % 2 else j["fetches"])
        assert row.lease_owner is None and row.finished_at is not None
    assert rows[jobs[300]["id"]].status == "running" and rows[jobs[300]["id"]].error is None


@pytest.mark.slow
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


@pytest.mark.slow
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


async def test_keys_are_claimed_with_their_jobs(services) -> None:
    """An idempotency key is inserted in the transaction of its job: a job whose key exists
    is not recorded (its id comes back), a duplicate key within one batch records one job,
    and a refused batch leaves no key behind."""
    from jobs.models import DispatchKey

    sm, now = services.sessionmaker, time.time()
    a, b, c = _new_job(), _new_job(), _new_job()
    taken = await store.record_jobs(
        sm,
        [(a, SESSION), (b, None), (c, None)],
        {a["id"]: ("k-a", "h", now), b["id"]: ("k-a", "h", now)},
    )
    assert taken == {b["id"]}
    async with sm() as s:
        assert (await s.get(DispatchKey, "k-a")).job_id == a["id"]  # type: ignore[union-attr]
        assert await s.get(Job, a["id"]) is not None and await s.get(Job, c["id"]) is not None
        assert await s.get(Job, b["id"]) is None
    again = _new_job()
    assert await store.record_jobs(sm, [(again, None)], {again["id"]: ("k-a", "h", now)}) == {
        again["id"]
    }
    fresh = _new_job()
    with pytest.raises(IntegrityError):
        await store.record_jobs(
            sm, [(fresh, None), (dict(a), None)], {fresh["id"]: ("k-fresh", "h", now)}
        )
    async with sm() as s:
        assert await s.get(DispatchKey, "k-fresh") is None
        assert await s.get(Job, fresh["id"]) is None


@pytest.mark.slow
async def test_sqlite_dispatches_take_the_one_call_form(services, monkeypatch) -> None:
    """On SQLite the dispatcher's rows and sessions take the one-call form (a new column in
    the dispatcher's row must be added to the store's list, or every batch is slower)."""
    if services.engine.dialect.name != "sqlite":
        pytest.skip("SQLite only")
    calls: list[int] = []
    real = store_sqlite.record_jobs

    async def counting(engine, columns, rows, sessions, keys=None, **kw):  # type: ignore[no-untyped-def]
        calls.append(len(rows))
        return await real(engine, columns, rows, sessions, keys, **kw)

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


def test_writers_of_two_processes_take_turns(sqlite_url: str) -> None:
    """A writer kept out of the lock notes itself beside the database; a writer of another
    process about to take the lock lets it go first (for at most ``TURN_YIELD_S``); a note
    whose writer has stopped renewing it is ignored, and a served writer clears its own."""
    import struct
    import subprocess
    import sys

    import jobs.db

    path = sqlite_url.split(":///", 1)[1]
    waiter = subprocess.Popen(  # another process's writer, kept out and renewing its note
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom jobs.db import _Turns\nt = _Turns(sys.argv[1])\n"
            "print('noted', flush=True)\n"
            "while True:\n"
            "    t.waiting(); time.sleep(0.001)\n",
            path,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "noted"
        mine = jobs.db._Turns(path)
        deadline = time.monotonic() + 10
        while not mine._other_waits():
            assert time.monotonic() < deadline, "the other process's note was never seen"
            time.sleep(0.001)
        t0 = time.monotonic()
        mine.give_way()
        assert time.monotonic() - t0 >= jobs.db.TURN_YIELD_S  # it went first, up to the cap
    finally:
        waiter.kill()
        waiter.wait(10)
    deadline = time.monotonic() + 10
    while mine._other_waits():  # its writer is gone: the note goes stale
        assert time.monotonic() < deadline, "a stale note is still taken as a waiter"
        time.sleep(0.005)
    mine.waiting()
    mine.served()
    with open(f"{path}-turns", "rb") as f:
        assert struct.unpack("<qd", f.read(16)) == (0, 0.0)
    mine.close()


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


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sqlite-writer"]


async def test_sqlite_writes_that_wait_together_commit_together(sqlite_url: str) -> None:
    """Calls that queue while the writer waits for the lock go in one transaction; one that
    raises is rolled back alone (its caller gets its error) and the others are run again
    without it, then committed once."""
    path = sqlite_url.split(":///", 1)[1]
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    engine = create_engine(sqlite_url)
    statements: list[str] = []
    try:

        def blocker(db: sqlite3.Connection) -> None:
            db.set_trace_callback(statements.append)  # the writer's own connection

        def insert(name: str) -> Any:
            def fn(db: sqlite3.Connection) -> str:
                db.execute(SESSION_ROW, (name,))
                if name == "bad":
                    raise ValueError("refused")
                return name

            return fn

        first = asyncio.create_task(sqlite_write(engine, blocker))
        await asyncio.sleep(0)  # (handed to the writer)
        writer = _writer_of(engine)
        assert writer is not None
        deadline = time.monotonic() + 10  # its thread takes it (late on a loaded host)...
        while not writer._calls.empty():
            assert time.monotonic() < deadline, "the writer never took the first call"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # ...and now waits for the lock with the blocker alone
        calls = [asyncio.create_task(sqlite_write(engine, insert(n))) for n in ("a", "bad", "c")]
        await asyncio.sleep(0.1)
        other.execute("ROLLBACK")
        await first
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert results[0] == "a" and results[2] == "c"
        assert isinstance(results[1], ValueError)

        def names(db: sqlite3.Connection) -> list[str]:
            db.set_trace_callback(None)
            rows = db.execute("SELECT session_id FROM chat_sessions ORDER BY session_id")
            return [r[0] for r in rows]

        assert await sqlite_write(engine, names) == ["a", "c"]
        # the blocker's transaction, then a, bad (rolled back), then a and c committed once
        assert statements.count("COMMIT") == 2 and statements.count("ROLLBACK") == 1
    finally:
        other.close()
        await engine.dispose()


async def test_a_cancelled_caller_does_not_stop_its_write_or_the_writer(sqlite_url: str) -> None:
    """A caller cancelled while its call waits still has it written (as a statement sent
    would be), and the writer goes on serving the next calls."""
    path = sqlite_url.split(":///", 1)[1]
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    engine = create_engine(sqlite_url)
    try:

        def insert(db: sqlite3.Connection) -> None:
            db.execute(SESSION_ROW, ("kept",))

        task = asyncio.create_task(sqlite_write(engine, insert))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        other.execute("ROLLBACK")

        def count(db: sqlite3.Connection) -> int:
            return int(db.execute("SELECT count(*) FROM chat_sessions").fetchone()[0])

        assert await sqlite_write(engine, count) == 1
    finally:
        other.close()
        await engine.dispose()


async def test_disposing_the_engine_stops_its_writer(sqlite_url: str) -> None:
    """The writer's thread ends (its connection closed) when its engine is disposed; the
    engine used again gets a new one."""
    before = set(_writer_threads())
    engine = create_engine(sqlite_url)

    def one(db: sqlite3.Connection) -> int:
        return int(db.execute("SELECT 1").fetchone()[0])

    assert await sqlite_write(engine, one) == 1
    (mine,) = set(_writer_threads()) - before
    await engine.dispose()
    await asyncio.to_thread(mine.join, 10)
    assert not mine.is_alive()
    assert await sqlite_write(engine, one) == 1
    await engine.dispose()
