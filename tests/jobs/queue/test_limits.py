"""Fairness across organisations, concurrency limits (SKILLJOBS_LIMITS) and priorities:
the claim script against a real Redis, then real `skilljobs worker` processes on SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from arq.constants import in_progress_key_prefix
from pydantic import ValidationError
from sqlalchemy import func, select

from dashboard.app import create_app
from jobs.constants import FN_RUN_JOB, WORKER_HEARTBEAT
from jobs.models import Job
from jobs.queue import broker, limits, store
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services
from tests.helpers.jobs import wait_status
from tests.helpers.settings import ADMIN_AUTH, JOB_SKILLS, make_settings
from tests.helpers.workers import WorkerProcess

# --- pure logic ----------------------------------------------------------------------------


def test_limit_keys_exact_wins_over_any_value():
    lim = {"skill:video_gen": 2, "org:*": 20, "org:big": 50, "actor:*": 1}
    data = limits.meta(skill="video_gen", org="big", actor="u1", role="r1")
    assert limits.keys_for(lim, data) == [("skill:video_gen", 2), ("org:big", 50), ("actor:u1", 1)]
    assert limits.keys_for(lim, limits.meta(skill="other")) == []  # no org, no actor
    assert json.loads(limits.for_claim(lim)) == {
        "exact": {"skill:video_gen": 2, "org:big": 50},
        "any": {"org": 20, "actor": 1},
    }
    assert limits.for_claim({}) == ""


def test_priority_and_limits_are_validated(tmp_path):
    assert limits.priority_problem(0) is None and limits.priority_problem(9) is None
    assert limits.priority_problem(10) and limits.priority_problem(-1)
    assert limits.priority_problem(True) and limits.priority_problem("3")
    for bad in ({"team:*": 2}, {"org:": 2}, {"org:*": 0}):
        with pytest.raises(ValidationError):
            make_settings(tmp_path, redis_url=None, prefix="x", limits=bad)
    s = make_settings(tmp_path, redis_url=None, prefix="x", limits={"org:*": 20})
    assert s.limits == {"org:*": 20}


# --- the claim script, on Redis ------------------------------------------------------------


@pytest.fixture
async def rsvc(tmp_path, redis_server_url, redis_prefix, sqlite_url):
    s = await Services.open(
        make_settings(
            tmp_path, redis_url=redis_server_url, prefix=redis_prefix, database_url=sqlite_url
        )
    )
    yield s
    assert s.redis is not None
    keys = [k async for k in s.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
    if keys:
        await s.redis.delete(*keys)
    await s.close()


async def _put(svc, n: int, org: str, *, actor: str = "", priority: int | None = None, tag=""):
    ids = [f"{tag or org}-{i}:{svc.settings.redis_prefix}" for i in range(n)]
    metas = [limits.meta(skill="s", org=org, actor=actor, priority=priority) for _ in ids]
    await broker.enqueue_many(svc, [(aid, FN_RUN_JOB, (aid, 0)) for aid in ids], metas)
    return ids


async def _claim(svc, free: int, lim: dict[str, int] | None = None, holder: str = "w1"):
    _, got = await broker.claim(
        svc.redis,
        broker.queue_name(svc),
        free=free,
        in_progress_ms=60_000,
        read_limit=100,
        limits=limits.for_claim(lim or {}),
        holder=holder,
        heartbeat_prefix=svc.settings.key(WORKER_HEARTBEAT, ""),
        grace_ms=0,
    )
    return [aid for aid, _, _ in got]


@pytest.mark.slow
async def test_round_robin_across_orgs(rsvc):
    a_ids, b_ids = await _put(rsvc, 500, "A"), await _put(rsvc, 5, "B")
    first = await _claim(rsvc, 10)
    # one from each lane per pass: B is served in the first round, and all of it in 10
    assert {first[0][0], first[1][0]} == {"A", "B"}
    assert sorted(a for a in first if a.startswith("B")) == b_ids
    assert len(set(first) & set(a_ids)) == 5
    later = await _claim(rsvc, 3)  # B is empty: A alone
    assert len(set(later) & set(a_ids) - set(first)) == 3


@pytest.mark.slow
async def test_entries_queued_within_a_millisecond_keep_their_order(rsvc):
    """Ids are random: ordered by id, entries queued in one millisecond (or one batch)
    would be claimed in no particular order."""
    names = [f"{c}{i}:{rsvc.settings.redis_prefix}" for i, c in enumerate("zyxwvutsrq")]
    metas = [limits.meta(skill="s", org="A", actor="", priority=None) for _ in names]
    batch = [(aid, FN_RUN_JOB, (aid, 0)) for aid in names[:5]]
    await broker.enqueue_many(rsvc, batch, metas[:5])  # one batch, one millisecond
    for aid, meta in zip(names[5:], metas[5:], strict=True):
        await broker.enqueue(rsvc, FN_RUN_JOB, aid, 0, job_id=aid, meta=meta)  # one by one
    assert await _claim(rsvc, 10) == names


@pytest.mark.slow
async def test_priority_lanes_first_then_round_robin(rsvc):
    late = await _put(rsvc, 3, "A", priority=9, tag="late")
    normal = await _put(rsvc, 2, "B")  # default (3)
    urgent = await _put(rsvc, 2, "C", priority=0, tag="urgent")
    assert await _claim(rsvc, 5) == urgent + normal + late[:1]


async def test_limit_blocks_until_released_and_dead_holders_are_freed(rsvc):
    lim = {"actor:*": 1}
    await broker.beat(rsvc, "w1", {}, 60)
    ids = await _put(rsvc, 3, "A", actor="u1")
    other = await _put(rsvc, 1, "A", actor="u2", tag="other")
    assert await _claim(rsvc, 10, lim) == [ids[0], other[0]]
    await asyncio.sleep(0.01)
    assert await _claim(rsvc, 10, lim) == []  # u1's next waits, queued
    assert await broker.limit_usage(rsvc, ["actor:u1", "actor:u2"]) == [1, 1]
    assert await broker.release(rsvc, [ids[0]]) == 1
    assert await _claim(rsvc, 10, lim) == [ids[1]]
    # the holder's heartbeat key is gone (killed worker): a claim that finds the limit
    # full frees its slot
    await rsvc.redis.delete(rsvc.settings.key(WORKER_HEARTBEAT, "w1"))
    await asyncio.sleep(0.01)
    assert await _claim(rsvc, 10, lim, holder="w2") == [ids[2]]


async def test_hand_back_returns_to_lane_and_remove_leaves_it(rsvc):
    ids = await _put(rsvc, 3, "A")
    assert await _claim(rsvc, 1) == [ids[0]]
    await broker.tidy(rsvc.redis, broker.queue_name(rsvc), [(ids[0], False)])
    assert await _claim(rsvc, 1) == [ids[0]]  # claimable again, first in its lane
    await broker.remove(rsvc, ids[1])
    assert await _claim(rsvc, 5) == [ids[2]]
    assert await rsvc.redis.exists(in_progress_key_prefix + ids[2])


@pytest.mark.slow
async def test_entries_without_lanes_are_still_claimed(rsvc):
    """Entries enqueued by arq itself (or an earlier version) are served in arq's order."""
    queue = broker.queue_name(rsvc)
    aid = f"legacy:{rsvc.settings.redis_prefix}"
    await rsvc.redis.enqueue_job(FN_RUN_JOB, "legacy", 0, _job_id=aid, _queue_name=queue)
    assert await _claim(rsvc, 5) == [aid]


# --- real worker processes -----------------------------------------------------------------

pytest_slow = pytest.mark.slow


def _ctx(org: str, actor: str) -> dict[str, str]:
    return {
        "channel": "web",
        "role_id": "r1",
        "org_id": org,
        "actor_key": actor,
        "session_id": f"s-{org}",
        "external_id": f"orgdeleg:{org}",
    }


@pytest.fixture
def wsettings(tmp_path, database_url, redis_server_url, redis_prefix):
    return make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=str(JOB_SKILLS),
        worker_lease_sec=5.0,
        worker_heartbeat_sec=0.5,
        reconcile_interval_sec=1.0,
        reconcile_stale_sec=30.0,
        worker_grace_sec=2.0,
    )


@pytest.fixture
async def wsvc(wsettings):
    s = await Services.open(wsettings)
    yield s
    assert s.redis is not None
    keys = [k async for k in s.redis.scan_iter(count=1000, match=f"{wsettings.redis_prefix}*")]
    if keys:
        await s.redis.delete(*keys)
    await s.close()


@pytest.fixture
def start_workers(tmp_path):
    started: list[WorkerProcess] = []

    async def start(svc, n: int, max_jobs: int, lim: dict[str, int] | None = None):
        env = {"SKILLJOBS_LIMITS": json.dumps(lim)} if lim else {}
        svc.settings.limits = lim or {}  # the web side reads the same setting
        for _ in range(n):
            log = Path(tmp_path / f"worker{len(started)}.log")
            started.append(
                WorkerProcess(
                    svc.settings, log, "--no-scheduler", "--max-jobs", str(max_jobs), **env
                )
            )
        deadline = time.monotonic() + 60
        pattern = svc.settings.key(WORKER_HEARTBEAT, "*")
        while len([k async for k in svc.redis.scan_iter(count=1000, match=pattern)]) < len(started):
            assert time.monotonic() < deadline, "workers did not start"
            await asyncio.sleep(0.1)
        return started

    yield start
    for w in started:
        w.stop()


async def _started(svc, ids: list[str]) -> list[Job]:
    async with svc.sessionmaker() as s:
        rows = (await s.scalars(select(Job).where(Job.id.in_(ids)))).all()
    return list(rows)


async def _dispatch(d: Dispatcher, n: int, seconds: float, ctx, priority=None) -> list[str]:
    ids = []
    for _ in range(n):
        res = await d.dispatch("bg_sleep", {"seconds": seconds}, ctx, priority=priority)
        assert res.status_code == 202, res.body
        ids.append(res.body["job_id"])
    return ids


@pytest_slow
@pytest.mark.slow
async def test_one_orgs_backlog_does_not_starve_another(wsvc, start_workers):
    """Org A enqueues 500 × 1 s jobs, then org B 5: with 3 workers × 10 slots, B's first
    job starts within 2 s of its dispatch."""
    await start_workers(wsvc, 3, 10)
    d = Dispatcher(wsvc)
    await _dispatch(d, 500, 1.0, _ctx("A", "a1"))
    b_ids = await _dispatch(d, 5, 1.0, _ctx("B", "b1"))
    deadline = time.monotonic() + 30
    while True:
        rows = [j for j in await _started(wsvc, b_ids) if j.started_at is not None]
        if rows:
            break
        assert time.monotonic() < deadline, "org B never started"
        await asyncio.sleep(0.05)
    first = min(rows, key=lambda j: j.started_at)
    assert first.started_at - first.queued_at < 2.0
    async with wsvc.sessionmaker() as s:
        a_done = await s.scalar(
            select(func.count()).where(Job.org_id == "A", Job.started_at.is_not(None))
        )
    assert a_done < 500  # A's backlog was still there when B ran


@pytest_slow
@pytest.mark.slow
async def test_actor_limit_keeps_second_job_queued_until_the_first_ends(wsvc, start_workers):
    await start_workers(wsvc, 2, 10, {"actor:*": 1})
    d = Dispatcher(wsvc)
    # (long enough that the other actor's short job ends while the first still runs, even
    # on a loaded host)
    first, second = await _dispatch(d, 2, 5.0, _ctx("A", "video-fan"))
    other = (await _dispatch(d, 1, 0.1, _ctx("A", "someone-else")))[0]
    await wait_status(wsvc, first, {"running"}, limit=30)
    assert (await wait_status(wsvc, other, {"succeeded"}, limit=30)).status == "succeeded"
    job = await store.get_job(wsvc.sessionmaker, second)
    assert job.status == "queued"  # never failed, waiting
    assert await limits.waiting_for(wsvc, job) == "limit actor:video-fan"
    done = await wait_status(wsvc, first, {"succeeded"}, limit=30)
    job = await wait_status(wsvc, second, {"running", "succeeded"}, limit=30)
    assert job.started_at >= done.finished_at


@pytest_slow
@pytest.mark.slow
async def test_limits_hold_across_workers_during_a_burst(wsvc, start_workers):
    """A burst over 3 workers with skill:bg_sleep 3 and org:* 2: the running jobs counted
    from the database never exceed a limit."""
    await start_workers(wsvc, 3, 10, {"skill:bg_sleep": 3, "org:*": 2})
    d = Dispatcher(wsvc)
    ids = []
    for org in ("A", "B", "C"):
        ids += await _dispatch(d, 8, 0.3, _ctx(org, f"u-{org}"))
    peak_total, peak_org = 0, 0
    deadline = time.monotonic() + 90
    while True:
        async with wsvc.sessionmaker() as s:
            rows = (
                await s.execute(
                    select(Job.org_id, func.count())
                    .where(Job.id.in_(ids), Job.status == "running")
                    .group_by(Job.org_id)
                )
            ).all()
            left = await s.scalar(
                select(func.count()).where(Job.id.in_(ids), Job.status != "succeeded")
            )
        peak_total = max(peak_total, sum(n for _, n in rows))
        peak_org = max([peak_org, *(n for _, n in rows)])
        assert peak_total <= 3 and peak_org <= 2, rows
        if not left:
            break
        assert time.monotonic() < deadline, f"{left} jobs never finished"
        await asyncio.sleep(0.02)
    assert peak_total >= 2  # the burst did run in parallel


@pytest_slow
@pytest.mark.slow
async def test_priorities_order_with_one_slot(wsvc, start_workers):
    d = Dispatcher(wsvc)
    late = await _dispatch(d, 2, 0.05, _ctx("A", "u1"), priority=9)
    normal = await _dispatch(d, 2, 0.05, _ctx("A", "u1"))
    urgent = await _dispatch(d, 2, 0.05, _ctx("A", "u1"), priority=0)
    await start_workers(wsvc, 2, 1, {"org:*": 1})  # one job at a time, across 2 workers
    for job_id in late:
        await wait_status(wsvc, job_id, {"succeeded"}, limit=60)
    order = [j.id for j in sorted(await _started(wsvc, late + normal + urgent), key=_start)]
    assert order == urgent + normal + late
    job = await store.get_job(wsvc.sessionmaker, urgent[0])
    assert job.priority == 0


def _start(job: Job) -> float:
    return job.started_at or 0.0


@pytest.mark.slow
async def test_http_priority_and_waiting_for(wsvc):
    """The dispatch body takes ``priority``; the job detail shows it and, while a limit is
    full, what the job waits for."""
    wsvc.settings.limits = {"actor:*": 1}
    app = create_app(wsvc.settings, services=wsvc)
    body = {"skill": "bg_sleep", "input": {"seconds": 0.01}, "context": _ctx("o1", "fan")}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers=ADMIN_AUTH,
    ) as c:
        bad = await c.post("/api/v1/dispatch", json={**body, "priority": 10})
        assert bad.status_code == 422
        first = (await c.post("/api/v1/dispatch", json={**body, "priority": 1})).json()
        second = (await c.post("/api/v1/dispatch", json=body)).json()
        await broker.beat(wsvc, "w1", {}, 60)
        assert await _claim(wsvc, 5, wsvc.settings.limits) == [f"{first['job_id']}:0"]
        detail = (await c.get(f"/api/v1/jobs/{second['job_id']}")).json()
        assert detail["status"] == "queued" and detail["priority"] == 3
        assert detail["waiting_for"] == "limit actor:fan"
        detail = (await c.get(f"/api/v1/jobs/{first['job_id']}")).json()
        assert detail["priority"] == 1 and detail["waiting_for"] is None


@pytest.mark.slow
def test_cli_dispatch_priority(tmp_path, monkeypatch, redis_server_url, redis_prefix, sqlite_url):
    from typer.testing import CliRunner

    from jobs.cli.app import app

    for k, v in {
        "SKILLJOBS_DATA_DIR": str(tmp_path / "data"),
        "SKILLJOBS_DATABASE_URL": sqlite_url,
        "SKILLJOBS_REDIS_URL": redis_server_url,
        "SKILLJOBS_REDIS_PREFIX": redis_prefix,
        "SKILLJOBS_QUEUE_NAME": f"{redis_prefix}:queue",
        "SKILLJOBS_SKILLS_PATH": str(JOB_SKILLS),
    }.items():
        monkeypatch.setenv(k, v)
    args = ["dispatch", "bg_sleep", "--channel", "telegram", "--actor-key", "tg-1"]
    assert CliRunner().invoke(app, [*args, "--priority", "10"]).exit_code != 0
    res = CliRunner().invoke(app, [*args, "--priority", "7"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    job_id = json.loads(res.output)["job_id"]

    async def priority() -> int:
        svc = await Services.open(
            make_settings(
                tmp_path, redis_url=redis_server_url, prefix=redis_prefix, database_url=sqlite_url
            )
        )
        try:
            job = await store.get_job(svc.sessionmaker, job_id)
            return job.priority
        finally:
            await svc.close()

    assert asyncio.run(priority()) == 7
