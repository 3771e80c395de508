"""Group commit of background dispatches (jobs.queue.intake) on SQLite and PostgreSQL with
real Redis: concurrent dispatches are each recorded and enqueued exactly once, a receipt
comes only after its batch is committed and enqueued, a refused job fails only its own
caller with nothing half-recorded, and a failed enqueue is a 503 for every job it carried."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, OperationalError

from jobs.models import ChatSession, Job, new_id
from jobs.queue import broker, intake, store
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.store import records

CTX = {"channel": "telegram", "actor_key": "tg-1", "role_id": "r1", "session_id": "s-1"}
N = 60


async def _rows(services: Any) -> list[Job]:
    async with services.sessionmaker() as s:
        return list((await s.scalars(select(Job))).all())


async def _queued_ids(services: Any) -> list[str]:
    raw = await services.redis.zrange(services.settings.queue_name, 0, -1)
    return [r.decode() for r in raw]


@pytest.mark.slow
async def test_concurrent_dispatches_recorded_and_enqueued_exactly_once(services):
    box = intake.intake_of(services)
    flushes0, items0 = box.batcher.flushes, box.batcher.items
    results = await asyncio.gather(
        *(Dispatcher(services).dispatch("bg_sleep", {"seconds": i}, CTX) for i in range(N))
    )
    assert [r.status_code for r in results] == [202] * N
    ids = [r.body["job_id"] for r in results]
    assert len(set(ids)) == N
    rows = await _rows(services)
    assert sorted(j.id for j in rows) == sorted(ids)
    assert {j.status for j in rows} == {"queued"}
    # each job's input is its own (no mix-up inside a batch)
    by_id = {j.id: services.box.unseal(j.input)["seconds"] for j in rows}
    assert [by_id[i] for i in ids] == list(range(N))
    assert sorted(await _queued_ids(services)) == sorted(f"{i}:0" for i in ids)
    # they were carried by fewer writes than jobs
    assert box.batcher.items - items0 == N
    assert box.batcher.flushes - flushes0 < N
    assert intake.intake_of(services) is box  # one intake per process's services


@pytest.mark.slow
async def test_batched_jobs_run_to_completion(services):
    from jobs.queue.worker import build_worker

    results = await asyncio.gather(
        *(Dispatcher(services).dispatch("bg_sleep", {"seconds": 0}, CTX) for _ in range(10))
    )
    assert {r.status_code for r in results} == {202}
    w = build_worker(services, burst=True, scheduler=False)
    await asyncio.wait_for(w.async_run(), 60)
    await w.close()
    assert {j.status for j in await _rows(services)} == {"succeeded"}


@pytest.mark.slow
async def test_receipt_only_after_commit_and_enqueue(services, monkeypatch):
    """While the batch's transaction has not committed no caller has a receipt, and by the
    time the batch is enqueued its rows are visible to any other connection."""
    gate = asyncio.Event()
    real_record, real_enqueue = store.record_jobs, broker.enqueue_many
    seen_committed: list[bool] = []

    async def slow_record(sm, jobs, keys=None, **kw):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await real_record(sm, jobs, keys, **kw)

    async def checked_enqueue(svc, jobs, metas=None, events=None):  # type: ignore[no-untyped-def]
        wanted = [args[0] for _, _, args in jobs]
        async with svc.sessionmaker() as s:  # another connection
            found = await s.scalar(select(func.count()).where(Job.id.in_(wanted)))
        seen_committed.append(found == len(wanted))
        await real_enqueue(svc, jobs, metas=metas, events=events)

    monkeypatch.setattr(store, "record_jobs", slow_record)
    monkeypatch.setattr(broker, "enqueue_many", checked_enqueue)
    tasks = [
        asyncio.create_task(Dispatcher(services).dispatch("bg_sleep", {}, CTX)) for _ in range(8)
    ]
    await asyncio.sleep(0.3)
    assert not any(t.done() for t in tasks)  # no receipt before the commit
    assert await _rows(services) == []
    gate.set()
    results = await asyncio.gather(*tasks)
    assert {r.status_code for r in results} == {202}
    assert seen_committed and all(seen_committed)
    assert len(await _queued_ids(services)) == 8


async def _template(services: Any) -> dict[str, Any]:
    """The values of a real dispatched job, to build more rows from."""
    res = await Dispatcher(services).dispatch("bg_sleep", {}, CTX)
    assert res.status_code == 202
    async with services.sessionmaker() as s:
        job = await s.get(Job, res.body["job_id"])
    values = {c.name: getattr(job, c.name) for c in Job.__table__.columns}
    return {k: v for k, v in values.items() if v is not None}


@pytest.mark.slow
async def test_a_refused_job_fails_only_its_caller(services):
    """One job of a batch violates the primary key: the batch statement fails, the others
    are recorded and enqueued, the culprit's caller gets the database's error, and the
    culprit's new chat session is not recorded without it."""
    base = await _template(services)
    existing = base["id"]
    ids = [existing if i == 4 else new_id() for i in range(10)]  # arq's job keys are global
    jobs = []
    for i in range(10):
        values = {**base, "id": ids[i]}
        values["arq_job_id"] = store.arq_id(values["id"], 0)
        session = (
            {
                "session_id": "new-session-of-culprit",
                "role_id": "r1",
                "org_id": "",
                "channel": "web",
                "external_id": "orgdeleg:x",
            }
            if i == 4
            else None
        )
        jobs.append(intake.NewJob(values=values, session=session, event=None, meta=None))
    before = set(await _queued_ids(services))
    outcomes = await asyncio.gather(
        *(intake.submit(services, j) for j in jobs), return_exceptions=True
    )
    assert isinstance(outcomes[4], IntegrityError)
    assert [o for i, o in enumerate(outcomes) if i != 4] == [None] * 9
    rows = {j.id: j for j in await _rows(services)}
    assert set(rows) == set(ids)
    assert rows[existing].status == "queued"  # the existing job is untouched
    new_entries = set(await _queued_ids(services)) - before
    assert new_entries == {f"{ids[i]}:0" for i in range(10) if i != 4}
    async with services.sessionmaker() as s:
        assert await s.get(ChatSession, "new-session-of-culprit") is None


@pytest.mark.slow
async def test_database_unavailable_fails_every_caller(services, monkeypatch):
    async def down(sm, jobs, keys=None, **kw):  # type: ignore[no-untyped-def]
        raise OperationalError("INSERT", {}, ConnectionRefusedError("database is away"))

    monkeypatch.setattr(store, "record_jobs", down)
    key = "key-of-a-failed-dispatch"
    tasks = [Dispatcher(services).dispatch("bg_sleep", {"n": i}, CTX) for i in range(5)]
    tasks.append(Dispatcher(services).dispatch("bg_sleep", {}, CTX, idempotency_key=key))
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(o, OperationalError) for o in outcomes)
    assert await _queued_ids(services) == []
    monkeypatch.undo()
    # the key was released: a retry with it makes a job that runs
    res = await Dispatcher(services).dispatch("bg_sleep", {}, CTX, idempotency_key=key)
    assert res.status_code == 202
    assert [j.id for j in await _rows(services)] == [res.body["job_id"]]


@pytest.mark.slow
async def test_failed_enqueue_is_a_503_for_each_job_of_the_batch(services, monkeypatch):
    async def redis_down(*_a, **_k):  # type: ignore[no-untyped-def]
        raise ConnectionError("redis went away")

    monkeypatch.setattr(broker, "enqueue_many", redis_down)
    results = await asyncio.gather(
        *(Dispatcher(services).dispatch("bg_sleep", {}, CTX) for _ in range(12)),
        Dispatcher(services).dispatch("bg_sleep", {}, CTX, idempotency_key="k-503"),
    )
    assert {r.status_code for r in results} == {503}
    assert all(r.body["error_type"] == "transient" for r in results)
    # refused, not failed: no job of them is in the record
    assert await _rows(services) == []
    monkeypatch.undo()
    res = await Dispatcher(services).dispatch("bg_sleep", {}, CTX, idempotency_key="k-503")
    assert res.status_code == 202
    assert [j.id for j in await _rows(services)] == [res.body["job_id"]]


@pytest.mark.slow
async def test_concurrent_dispatches_with_one_idempotency_key(services):
    results = await asyncio.gather(
        *(
            Dispatcher(services).dispatch("bg_sleep", {"a": 1}, CTX, idempotency_key="same")
            for _ in range(10)
        )
    )
    assert {r.status_code for r in results} == {202}
    assert len({r.body["job_id"] for r in results}) == 1
    assert len(await _rows(services)) == 1
    assert len(await _queued_ids(services)) == 1


@pytest.mark.parametrize("n", [1, 300])
@pytest.mark.slow
async def test_batches_of_any_size(services, n):
    """A lone dispatch (no waiting for company) and more than one batch's worth."""
    results = await asyncio.gather(
        *(Dispatcher(services).dispatch("bg_sleep", {}, CTX) for _ in range(n))
    )
    assert {r.status_code for r in results} == {202}
    assert len(await _rows(services)) == n
    assert len(await _queued_ids(services)) == n


@pytest.mark.slow
async def test_postgres_records_a_batch_in_one_statement(services, monkeypatch):
    """On PostgreSQL the dispatcher's rows take the one-statement form (a new column in
    the dispatcher's row must be added there too, or every batch takes the slow form)."""
    if services.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL only")
    calls: list[str] = []
    real = records.raw_fetch

    async def counting(engine, sql, *args):  # type: ignore[no-untyped-def]
        calls.append(sql)
        return await real(engine, sql, *args)

    monkeypatch.setattr(records, "raw_fetch", counting)
    ctx = {**CTX, "channel": "web", "session_id": "fresh-session"}
    results = await asyncio.gather(
        *(Dispatcher(services).dispatch("bg_sleep", {}, ctx, "orgdeleg:o") for _ in range(10))
    )
    assert {r.status_code for r in results} == {202}
    assert calls and all(sql is records._PG_NEW_JOBS_AT_GENERATION for sql in calls)
    async with services.sessionmaker() as s:
        row = await s.get(ChatSession, "fresh-session")
    assert row is not None and row.external_id == "orgdeleg:o" and row.role_id == "r1"


@pytest.mark.slow
async def test_configs_are_read_per_batch_and_baked_per_job(services):
    from jobs.catalog.configs import ConfigStore

    store_ = ConfigStore(services.sessionmaker, services.box)
    await store_.replace("r1", "bg_sleep", {"colour": "red", "api_key": "s3cret"})
    await store_.replace("r2", "bg_sleep", {"colour": "blue"})
    got = await store_.get_many([("r2", "bg_sleep"), ("r1", "bg_sleep"), ("r3", "bg_sleep")])
    assert got == [{"colour": "blue"}, {"colour": "red", "api_key": "s3cret"}, {}]
    results = await asyncio.gather(
        *(
            Dispatcher(services).dispatch("bg_sleep", {}, {**CTX, "role_id": f"r{1 + i % 3}"})
            for i in range(9)
        )
    )
    for i, res in enumerate(results):
        async with services.sessionmaker() as s:
            job = await s.get(Job, res.body["job_id"])
        baked = services.box.unseal(job.context)["skill_configs"]["bg_sleep"]
        assert baked == [got[1], got[0], {}][i % 3]


def test_the_servers_run_on_uvloop() -> None:
    """``skilljobs web`` / ``up`` run their event loop on uvloop (other commands keep
    asyncio's default)."""
    import uvloop

    from jobs.cli.common import run_async

    async def loop_type() -> type:
        return type(asyncio.get_running_loop())

    assert issubclass(run_async(loop_type, fast_loop=True), uvloop.Loop)
    assert not issubclass(run_async(loop_type), uvloop.Loop)


@pytest.mark.slow
async def test_batched_enqueue_survives_a_server_without_the_script(services, monkeypatch):
    """Redis restarted (its script cache empty): the batch loads the script and is sent
    again, every job enqueued once."""
    fresh = broker._ENQUEUE_LUA + f"\n-- {new_id()}"  # a script this server has not seen
    monkeypatch.setattr(broker, "_ENQUEUE_LUA", fresh)
    results = await asyncio.gather(
        *(Dispatcher(services).dispatch("bg_sleep", {}, CTX) for _ in range(5))
    )
    assert {r.status_code for r in results} == {202}
    assert sorted(await _queued_ids(services)) == sorted(f"{r.body['job_id']}:0" for r in results)


async def _baked(services: Any, job_id: str) -> dict[str, Any]:
    async with services.sessionmaker() as s:
        job = await s.get(Job, job_id)
    assert job is not None
    configs: dict[str, Any] = services.box.unseal(job.context)["skill_configs"]["bg_sleep"]
    return configs


@pytest.mark.slow
async def test_cached_configuration_is_never_recorded_after_it_changed(services):
    """The second dispatch of a (role, skill) reads no configuration; a change made
    afterwards — through the store, or by hand on another connection — is baked into the
    next job all the same."""
    from sqlalchemy import text

    from jobs.catalog.configs import ConfigStore

    configs = ConfigStore(services.sessionmaker, services.box)
    await configs.replace("r1", "bg_sleep", {"colour": "red"})
    reads = intake.intake_of(services).configs
    first = await Dispatcher(services).dispatch("bg_sleep", {}, CTX)
    flushes = reads.flushes
    second = await Dispatcher(services).dispatch("bg_sleep", {}, CTX)
    assert reads.flushes == flushes  # from the cache
    assert await _baked(services, first.body["job_id"]) == {"colour": "red"}
    assert await _baked(services, second.body["job_id"]) == {"colour": "red"}

    await configs.set("r1", "bg_sleep", "colour", "green")
    third = await Dispatcher(services).dispatch("bg_sleep", {}, CTX)
    assert await _baked(services, third.body["job_id"]) == {"colour": "green"}

    async with services.engine.begin() as conn:  # by hand, not through the store
        await conn.execute(text("UPDATE skill_configs SET value = '\"blue\"' WHERE key = 'colour'"))
    racing = await asyncio.gather(
        *(Dispatcher(services).dispatch("bg_sleep", {}, CTX) for _ in range(10))
    )
    for res in racing:
        assert res.status_code == 202
        assert await _baked(services, res.body["job_id"]) == {"colour": "blue"}

    await configs.set("r1", "bg_sleep", "colour", None)  # deleted
    gone = await Dispatcher(services).dispatch("bg_sleep", {}, CTX)
    assert await _baked(services, gone.body["job_id"]) == {}
    assert len(await _queued_ids(services)) == 14


@pytest.mark.slow
async def test_a_batch_built_from_an_old_configuration_writes_nothing(services):
    """Recorded with a generation that is not the current one: no job, no key, no session;
    each job is answered as stale (and is then built again by its dispatcher)."""
    from jobs.catalog.configs import ConfigStore

    base = await _template(services)
    generation, _ = await ConfigStore(services.sessionmaker, services.box).snapshot([])
    jobs = []
    for i in range(3):
        values = {**base, "id": new_id()}
        values["arq_job_id"] = store.arq_id(values["id"], 0)
        session = {
            "session_id": f"stale-session-{i}",
            "role_id": "r1",
            "org_id": "",
            "channel": "web",
            "external_id": "orgdeleg:x",
        }
        jobs.append(
            intake.NewJob(
                values=values,
                session=session,
                event=None,
                meta=None,
                generation=generation - 1,
                key=(f"stale-key-{i}", "h", 0.0),
            )
        )
    outcomes = await asyncio.gather(
        *(intake.submit(services, j) for j in jobs), return_exceptions=True
    )
    assert all(isinstance(o, intake.StaleConfig) for o in outcomes), outcomes
    assert len(await _rows(services)) == 1  # the template's job only
    from jobs.models import DispatchKey

    async with services.sessionmaker() as s:
        assert await s.get(DispatchKey, "stale-key-0") is None
        assert await s.get(ChatSession, "stale-session-0") is None


@pytest.mark.slow
async def test_idempotency_key_is_claimed_in_the_batch(services, monkeypatch):
    """A new key is claimed in the batch's own transaction (no statement of its own); a
    key that exists already is looked up: same job, or a 409 for another request."""
    from jobs.models import DispatchKey
    from jobs.queue import idempotency

    separate: list[str] = []
    real_claim = idempotency.claim

    async def counted(sm, key, *a, **kw):  # type: ignore[no-untyped-def]
        separate.append(key)
        return await real_claim(sm, key, *a, **kw)

    monkeypatch.setattr(idempotency, "claim", counted)
    fresh = await asyncio.gather(
        *(
            Dispatcher(services).dispatch("bg_sleep", {}, CTX, idempotency_key=f"b-{i}")
            for i in range(10)
        )
    )
    assert {r.status_code for r in fresh} == {202} and separate == []
    async with services.sessionmaker() as s:
        for i, res in enumerate(fresh):
            row = await s.get(DispatchKey, idempotency.scoped(f"b-{i}", CTX))
            assert row is not None and row.job_id == res.body["job_id"]
    again = await Dispatcher(services).dispatch("bg_sleep", {}, CTX, idempotency_key="b-3")
    assert again.status_code == 202 and again.body["job_id"] == fresh[3].body["job_id"]
    clash = await Dispatcher(services).dispatch("bg_sleep", {"x": 1}, CTX, idempotency_key="b-4")
    assert clash.status_code == 409 and clash.body["job_id"] == fresh[4].body["job_id"]
    assert separate == [idempotency.scoped("b-3", CTX), idempotency.scoped("b-4", CTX)]
    assert len(await _rows(services)) == 10
    assert len(await _queued_ids(services)) == 10
