"""Group commit: the Batcher's coalescing and error handling, and the batched claim/finish
statements on SQLite and PostgreSQL (mixed batches: superseded, duplicate, lost leases)."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import select, update

from jobs.batching import Batcher
from jobs.db import engine_of
from jobs.models import Job, JobAttempt
from jobs.queue import store
from jobs.queue.dispatcher import Dispatcher

TG = {"channel": "telegram", "actor_key": "tg-1", "role_id": "r1", "session_id": "s-tg"}


@pytest.mark.slow
async def test_concurrent_submits_share_flushes_and_keep_their_results():
    seen: list[list[int]] = []

    async def flush(items: list[int]) -> list[int]:
        seen.append(items)
        await asyncio.sleep(0.01)  # a round trip: more callers arrive meanwhile
        return [i * 10 for i in items]

    b: Batcher[int, int] = Batcher(flush, max_batch=30)
    results = await asyncio.gather(*(b.submit(i) for i in range(100)))
    assert results == [i * 10 for i in range(100)]
    assert sorted(i for batch in seen for i in batch) == list(range(100))
    assert max(len(batch) for batch in seen) == 30  # capped
    assert len(seen) <= 5 and b.flushes == len(seen) and b.items == 100
    # idle: a lone call is flushed at once, alone
    assert await b.submit(7) == 70 and seen[-1] == [7]


async def test_a_failed_flush_fails_its_batch_only():
    calls = 0

    async def flush(items: list[str]) -> list[str]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        if calls == 1:
            raise ConnectionError("database went away")
        return [s.upper() for s in items]

    b: Batcher[str, str] = Batcher(flush)
    first = asyncio.ensure_future(b.submit("a"))
    await asyncio.sleep(0)  # the first batch is in flight
    later = [asyncio.ensure_future(b.submit(s)) for s in "bc"]
    with pytest.raises(ConnectionError):
        await first
    assert await asyncio.gather(*later) == ["B", "C"]


async def test_a_wrong_result_count_is_an_error_not_a_mismatch():
    async def flush(items: list[int]) -> list[int]:
        return items[:-1]

    b: Batcher[int, int] = Batcher(flush)
    res = await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and "2 items" in str(r) for r in res)


async def test_a_cancelled_waiter_does_not_disturb_the_others():
    gate = asyncio.Event()
    flushed: list[list[int]] = []

    async def flush(items: list[int]) -> list[int]:
        flushed.append(items)
        await gate.wait()
        return items

    b: Batcher[int, int] = Batcher(flush)
    first = asyncio.ensure_future(b.submit(0))
    await asyncio.sleep(0)
    queued = [asyncio.ensure_future(b.submit(i)) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    queued[1].cancel()  # withdrawn before its batch starts: never written
    gate.set()
    assert await first == 0
    assert await queued[0] == 1 and await queued[2] == 3
    assert flushed == [[0], [1, 3]]


async def _queued_jobs(services, n: int) -> list[str]:
    d = Dispatcher(services)
    out = []
    for _ in range(n):
        res = await d.dispatch("bg_sleep", {}, TG)
        assert res.status_code == 202
        out.append(res.body["job_id"])
    return out


@pytest.mark.slow
async def test_claim_many_mixed_batch(services):
    a, b, c = await _queued_jobs(services, 3)
    sm = services.sessionmaker
    # b is taken by another worker first; c is asked with a stale token; a is asked twice
    assert await store.claim(sm, b, 0, "other", 30) is not None
    got = await store.claim_many(sm, [(a, 0), (b, 0), (c, 5), (a, 0)], "w1", 30)
    assert got[0] is not None and got[0].token == 1 and got[0].attempt == 1
    assert got[0].job.id == a and got[0].job.lease_owner == "w1"
    assert got[1:] == [None, None, None]
    async with sm() as s:
        jobs = {j.id: j for j in await s.scalars(select(Job).where(Job.id.in_([a, b, c])))}
        attempts = (await s.scalars(select(JobAttempt).where(JobAttempt.job_id == a))).all()
    assert jobs[a].status == "running" and jobs[a].lease_owner == "w1"
    assert jobs[b].lease_owner == "other" and jobs[c].status == "queued"
    assert [(x.number, x.worker_id, x.lease_token) for x in attempts] == [(1, "w1", 1)]


@pytest.mark.slow
async def test_finish_many_records_only_the_attempts_holding_the_lease(services):
    a, b, c = await _queued_jobs(services, 3)
    sm = services.sessionmaker
    claims = await store.claim_many(sm, [(a, 0), (b, 0), (c, 0)], "w1", 30)
    assert all(claims)
    ok = await store.finish_many(
        sm,
        [
            store.Outcome(a, 1, "succeeded", {"ok": True, "n": 1}, None, None),
            store.Outcome(b, 7, "succeeded", {"ok": True, "n": 2}, None, None),  # lost lease
            store.Outcome(
                c, 1, "failed", {"ok": False}, "boom", "permanent", fetches=[{"url": "u"}]
            ),
        ],
    )
    assert ok == [True, False, True]
    async with sm() as s:
        jobs = {j.id: j for j in await s.scalars(select(Job).where(Job.id.in_([a, b, c])))}
        closed = {
            x.job_id: (x.outcome, x.error)
            for x in await s.scalars(select(JobAttempt).where(JobAttempt.job_id.in_([a, b, c])))
        }
    assert jobs[a].status == "succeeded" and jobs[a].result == {"ok": True, "n": 1}
    assert jobs[a].duration_ms is not None and jobs[a].lease_owner is None
    assert jobs[b].status == "running" and jobs[b].result is None
    assert jobs[c].status == "failed" and jobs[c].error == "boom"
    assert jobs[c].fetches == [{"url": "u"}] and jobs[a].fetches in (None, [])
    assert closed == {a: ("succeeded", None), b: ("running", None), c: ("failed", "boom")}
    # finishing again (a retried flush after a lost reply) records nothing twice
    again = await store.finish_many(sm, [store.Outcome(a, 1, "failed", None, "late", None)])
    assert again == [False]


async def test_an_item_added_as_the_drain_ends_is_not_stranded():
    """A drain that has just returned is still in the batcher's task set until its
    done-callback runs; an item added in that window must start a new drain."""

    async def flush(items: list[int]) -> list[int]:
        return items  # no await: the drain ends right after resolving its waiters

    for concurrency in (1, 2):
        b: Batcher[int, int] = Batcher(flush, concurrency=concurrency)
        async with asyncio.timeout(5):  # (wait_for would run submit in a new task)
            for i in range(20):
                assert await b.submit(i) == i
        await b.flush()


async def test_a_drain_cancelled_before_its_first_step_leaves_no_item_behind():
    """A drain task cancelled before it ever ran (none of its code runs) neither keeps its
    place against the concurrency nor strands the items it was started for."""

    async def flush(items: list[int]) -> list[int]:
        return items

    b: Batcher[int, int] = Batcher(flush, concurrency=1)
    first = b.push(1)
    (drain,) = b._tasks
    drain.cancel()  # before the loop ever ran it
    await asyncio.sleep(0)
    assert drain.cancelled() and not first.done()
    async with asyncio.timeout(5):
        assert await b.submit(2) == 2
        assert await first == 1
    await b.flush()
    assert not b._tasks


async def test_an_item_added_in_the_step_a_drain_is_cancelled_in_is_written():
    async def flush(items: list[int]) -> list[int]:
        return items

    b: Batcher[int, int] = Batcher(flush, concurrency=1)
    first = b.push(1)
    (drain,) = b._tasks
    drain.cancel()
    second = b.push(2)  # the same step: the cancelled drain still holds the only place
    async with asyncio.timeout(5):
        assert await first == 1 and await second == 2


async def test_concurrency_bounds_the_flushes_in_flight():
    in_flight = peak = 0

    async def flush(items: list[int]) -> list[int]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return items

    b: Batcher[int, int] = Batcher(flush, max_batch=5, concurrency=2)
    assert await asyncio.gather(*(b.submit(i) for i in range(40))) == list(range(40))
    assert peak == 2 and b.items == 40


@pytest.mark.slow
async def test_lease_renewal_skips_a_row_a_finish_holds_and_cannot_deadlock(services):
    """A batched finish locks its jobs' rows in its own order while the heartbeat renews
    the same worker's leases: the renewal skips a locked row (neither renewed nor lost)
    instead of waiting for it while holding another, which PostgreSQL reported as
    ``deadlock detected``."""
    a, b = await _queued_jobs(services, 2)
    sm = services.sessionmaker
    assert all(await store.claim_many(sm, [(a, 0), (b, 0)], "w1", 30))
    held = {a: 1, b: 1}
    engine = engine_of(sm)
    if engine.dialect.name != "postgresql":  # one writer at a time: no row locks to skip
        found = await store.renew_leases(sm, "w1", held, 30)
        assert found.still == {a, b} and not found.busy
        return

    async def lease_of_a() -> float:
        async with sm() as s:
            return float(await s.scalar(select(Job.lease_expires_at).where(Job.id == a)))

    claimed_until = await lease_of_a()
    async with engine.connect() as other:  # plays the finish: b locked, a wanted next
        await other.execute(update(Job).where(Job.id == b).values(updated_at=1.0))
        renewal = asyncio.ensure_future(store.renew_leases(sm, "w1", held, 30))
        # the renewal has run (its renewal of a committed), or, waiting for b, holds a: on a
        # loaded host it may take a while to get there; not a failure to wait for
        deadline = time.monotonic() + 10
        await asyncio.sleep(0.3)
        while not renewal.done() and time.monotonic() < deadline:
            if await lease_of_a() > claimed_until:
                break
            await asyncio.sleep(0.05)
        async with asyncio.timeout(10):
            await other.execute(update(Job).where(Job.id == a).values(updated_at=1.0))
            found = await renewal
        await other.commit()
    assert found.still == {a} and found.busy == {b} and not found.cancel
    again = await store.renew_leases(sm, "w1", held, 30)
    assert again.still == {a, b} and not again.busy
    gone = await store.renew_leases(sm, "w1", {**held, a: 7}, 30)  # a's lease taken over
    assert gone.still == {b} and not gone.busy
