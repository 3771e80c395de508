"""Schedules: validation, the store, and the exactly-once scheduler on real databases."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from arq.constants import in_progress_key_prefix, job_key_prefix
from sqlalchemy import select, update

from chains import schedules
from chains.scheduler import Scheduler
from chains.schedules import ScheduleError, validate
from jobs.models import ChainRun, Schedule
from tests.helpers.chains import close_services, make_services, write_skill
from tests.helpers.settings import make_settings

T0 = datetime(2026, 3, 2, 8, 0, 0, tzinfo=UTC).timestamp()  # a Monday, on a minute


def base_spec(**over: object) -> dict:
    spec: dict = {
        "name": "daily",
        "cron": "*/5 * * * *",
        "timezone": "Europe/Berlin",
        "identity": {"role_id": "r1", "org_id": "o1", "session_id": "s1"},
        "steps": [
            {"id": "fetch", "skill": "chain_fetch_orders", "input": {"day": "d"}},
            {"id": "f", "skill": "chain_filter", "input": {"rows": "$steps.fetch.data.rows"}},
        ],
    }
    spec.update(over)
    return spec


@pytest.fixture
def registry(tmp_path: Path):  # type: ignore[no-untyped-def]
    from jobs.catalog.loader import load_registry
    from jobs.settings import BUNDLED_SKILLS

    extra = tmp_path / "extra"
    (extra / "doc_only").mkdir(parents=True)
    (extra / "doc_only" / "SKILL.md").write_text(
        "---\nname: doc_only\ndescription: a document\nskill_type: skill_md\n---\n# doc\n"
    )
    write_skill(extra, "broken", "def nothing_here(:\n")
    return load_registry([BUNDLED_SKILLS, extra])


# --- validation ---------------------------------------------------------------------------


def test_demo_schedule_file_is_valid(registry, repo_root: Path) -> None:  # type: ignore[no-untyped-def]
    data = yaml.safe_load((repo_root / "chains/demo/daily_orders.yaml").read_text())
    spec = validate(data, registry)
    assert [s.id for s in spec.steps] == ["fetch", "refunds", "purge", "echo"]
    assert spec.policy.chat_mode is False


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"cron": "0 25 * * *"}, "cron field 2 (hour) value 25 is out of range 0-23"),
        ({"timezone": "Mars/Olympus"}, "'Mars/Olympus' is not a known IANA timezone"),
        ({"steps": [{"skill": "nope"}]}, "step 0 (nope): unknown skill 'nope'"),
        ({"steps": [{"skill": "doc_only"}]}, "skill 'doc_only' is a skill_md skill and cannot run"),
        ({"steps": [{"skill": "broken"}]}, "skill 'broken' cannot load"),
        (
            {"steps": [{"id": "a", "skill": "echo"}, {"id": "a", "skill": "echo"}]},
            "duplicate step id 'a'",
        ),
        (
            {
                "steps": [
                    {"id": "a", "skill": "echo", "input": {"x": "$steps.b.y"}},
                    {"id": "b", "skill": "echo"},
                ]
            },
            "$steps.b.y refers to later step 'b'",
        ),
        (
            {"steps": [{"id": "a", "skill": "echo", "input": {"x": "$steps.zz.y"}}]},
            "$steps.zz.y refers to unknown step 'zz'",
        ),
        ({"deliver": {"title": "x"}}, "deliver: needs a recipient"),
        ({"deliver": {"to": "feishu:ou_1", "target": "ops"}}, "give one recipient"),
        ({"policy": {"chat_mode": True}}, "policy.chat_mode: must be false"),
        ({"steps": []}, "steps: List should have at least 1 item"),
        ({"bogus": 1}, "bogus: unknown field"),
        ({"steps": [{"id": "a b", "skill": "echo"}]}, "id may use letters"),
    ],
)
@pytest.mark.slow
def test_validation_errors_name_the_problem(registry, change: dict, expected: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ScheduleError) as err:
        validate(base_spec(**change), registry)
    assert expected in str(err.value), err.value.problems


def test_every_problem_is_reported_at_once(registry) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ScheduleError) as err:
        validate(
            base_spec(cron="61 * * * *", timezone="Nowhere/X", steps=[{"skill": "nope"}]), registry
        )
    assert len(err.value.problems) == 3


def test_default_step_ids(registry) -> None:  # type: ignore[no-untyped-def]
    spec = validate(
        base_spec(
            steps=[
                {"skill": "echo"},
                {"skill": "chain_filter", "input": {"rows": []}},
                {"skill": "echo"},
            ]
        ),
        registry,
    )
    assert [s.id for s in spec.steps] == ["0", "chain_filter", "2"]


# --- store --------------------------------------------------------------------------------


async def test_store_roundtrip(sessionmaker, registry) -> None:  # type: ignore[no-untyped-def]
    spec = validate(base_spec(deliver={"target": "ops"}), registry)
    row = await schedules.create(sessionmaker, spec, now=T0 + 1)
    assert row.next_fire_at == T0 + 300
    d = schedules.to_dict(row)
    assert d["next_fire_at"] == "2026-03-02T08:05:00+00:00"
    assert d["next_fires"] == [f"2026-03-02T08:{m:02d}:00+00:00" for m in range(5, 30, 5)]
    assert d["enabled"] is True and d["steps"][1]["input"] == {"rows": "$steps.fetch.data.rows"}
    with pytest.raises(ScheduleError, match="already exists"):
        await schedules.create(sessionmaker, spec)

    assert [s.name for s in await schedules.list_schedules(sessionmaker)] == ["daily"]
    assert (await schedules.get(sessionmaker, "daily")).id == row.id  # type: ignore[union-attr]

    off = await schedules.set_enabled(sessionmaker, row.id, False, now=T0 + 10)
    assert off.enabled is False and schedules.to_dict(off)["next_fire_at"] is None
    assert schedules.to_dict(off)["next_fires"] == []
    # re-enabling much later does not replay the fire times missed while disabled
    on = await schedules.set_enabled(sessionmaker, row.id, True, now=T0 + 3600 + 1)
    assert on.next_fire_at == T0 + 3600 + 300

    changed = await schedules.update(
        sessionmaker, row.id, {"cron": "0 9 * * *"}, registry, now=T0 - 1
    )
    assert changed.cron == "0 9 * * *"
    assert changed.next_fire_at == datetime(2026, 3, 2, 8, 0, tzinfo=UTC).timestamp()  # 09:00 CET
    # the next fires: the stored one first, then the cron's, in its timezone
    assert schedules.to_dict(changed)["next_fires"] == [
        f"2026-03-0{day}T08:00:00+00:00" for day in range(2, 7)
    ]
    assert schedules.to_dict(changed, fires=2)["next_fires"] == [
        "2026-03-02T08:00:00+00:00",
        "2026-03-03T08:00:00+00:00",
    ]
    with pytest.raises(ScheduleError, match="cron field 1"):
        await schedules.update(sessionmaker, row.id, {"cron": "99 * * * *"}, registry)
    with pytest.raises(LookupError):
        await schedules.set_enabled(sessionmaker, "missing", True)


# --- the scheduler: exactly once ----------------------------------------------------------


async def _arq_cleanup(redis, run_ids: list[str], upto: int = 3) -> None:  # type: ignore[no-untyped-def]
    keys = [
        p + f"chain:{r}:{n}"
        for r in run_ids
        for n in range(upto)
        for p in (job_key_prefix, in_progress_key_prefix)
    ]
    if keys:
        await redis.delete(*keys)


@pytest.mark.slow
async def test_three_schedulers_claim_each_fire_time_exactly_once(
    tmp_path: Path,
    database_url: str,
    redis_server_url: str,
    redis_prefix: str,
    redis,
    registry,  # type: ignore[no-untyped-def]
) -> None:
    settings = make_settings(
        tmp_path, redis_url=redis_server_url, prefix=redis_prefix, database_url=database_url
    )
    svcs = [make_services(settings, redis) for _ in range(3)]
    n_sched, minutes = 25, 6
    try:
        for i in range(n_sched):
            spec = validate(
                base_spec(
                    name=f"s{i}", cron="* * * * *", timezone="America/New_York", overlap="allow"
                ),
                registry,
            )
            await schedules.create(svcs[0].sessionmaker, spec, now=T0 - 30)
        schedulers = [Scheduler(s) for s in svcs]
        created: list[str] = []
        for m in range(minutes):
            now = T0 + 60 * m + 0.25
            # every scheduler ticks twice at the same moment, all concurrently
            results = await asyncio.gather(*(s.tick(now) for s in schedulers * 2))
            created += [r for res in results for r in res]
        async with svcs[0].sessionmaker() as s:
            runs = list((await s.execute(select(ChainRun))).scalars())
        assert len(runs) == n_sched * minutes == len(created) == len(set(created))
        per_fire = Counter((r.schedule_id, r.fire_at) for r in runs)
        assert set(per_fire.values()) == {1}
        assert {r.fire_at for r in runs} == {T0 + 60 * m for m in range(minutes)}
        assert all(r.status == "queued" and r.fire_key.startswith("cron:") for r in runs)
        # each run was enqueued exactly once
        assert await redis.zcard(settings.queue_name) == n_sched * minutes
        await _arq_cleanup(redis, [r.id for r in runs])
    finally:
        for s in svcs:
            await close_services(s)


@pytest.mark.slow
async def test_downtime_within_the_grace_runs_the_latest_fire_once(
    settings, sessionmaker, redis, registry
) -> None:  # type: ignore[no-untyped-def]
    svc = make_services(
        settings.model_copy(
            update={
                "database_url": str(
                    sessionmaker.kw["bind"].url.render_as_string(hide_password=False)
                )
            }
        ),
        redis,
    )
    try:
        spec = validate(base_spec(cron="*/5 * * * *"), registry)
        row = await schedules.create(svc.sessionmaker, spec, now=T0 + 1)
        sched = Scheduler(svc)
        # the scheduler was down for ~3 hours; the latest fire is 2 min late (grace 2.5 min)
        now = T0 + 3 * 3600 + 2 * 60
        first = await sched.tick(now)
        assert len(first) == 1
        assert await sched.tick(now + 1) == []
        async with svc.sessionmaker() as s:
            runs = list((await s.execute(select(ChainRun).order_by(ChainRun.fire_at))).scalars())
            fresh = await s.get(Schedule, row.id)
        assert [r.id for r in runs if r.status == "queued"] == first
        assert runs[-1].fire_at == T0 + 3 * 3600  # the latest due fire time
        # every earlier fire time of the downtime is a ``missed`` row, not a run
        assert [r.status for r in runs[:-1]] == ["missed"] * 35
        assert {r.fire_at for r in runs[:-1]} == {T0 + 300 * k for k in range(1, 36)}
        assert all(r.finished_at == now and "grace" in (r.error or "") for r in runs[:-1])
        assert fresh.last_fire_at == T0 + 3 * 3600  # type: ignore[union-attr]
        assert fresh.next_fire_at == T0 + 3 * 3600 + 300  # type: ignore[union-attr]
        await _arq_cleanup(redis, [r.id for r in runs] + first)
    finally:
        await close_services(svc)


@pytest.mark.slow
async def test_disabled_schedules_do_not_fire(settings, sessionmaker, redis, registry) -> None:  # type: ignore[no-untyped-def]
    svc = make_services(
        settings.model_copy(
            update={
                "database_url": str(
                    sessionmaker.kw["bind"].url.render_as_string(hide_password=False)
                )
            }
        ),
        redis,
    )
    try:
        row = await schedules.create(svc.sessionmaker, validate(base_spec(), registry), now=T0)
        await schedules.set_enabled(svc.sessionmaker, row.id, False)
        assert await Scheduler(svc).tick(T0 + 86400) == []
    finally:
        await close_services(svc)


@pytest.mark.slow
async def test_reconcile_re_enqueues_lost_and_abandoned_runs(
    settings, sessionmaker, redis, registry
) -> None:  # type: ignore[no-untyped-def]
    svc = make_services(
        settings.model_copy(
            update={
                "database_url": str(
                    sessionmaker.kw["bind"].url.render_as_string(hide_password=False)
                ),
                "worker_lease_sec": 5.0,
            }
        ),
        redis,
    )
    try:
        await schedules.create(svc.sessionmaker, validate(base_spec(name="a"), registry), now=T0)
        await schedules.create(svc.sessionmaker, validate(base_spec(name="b"), registry), now=T0)
        sched = Scheduler(svc)
        lost, waiting = await sched.tick(T0 + 300)
        # nothing to do while the arq jobs are waiting in the queue
        assert await sched.reconcile(T0 + 1000) == []
        # Redis lost the first run's job (flushed, or the enqueue never happened)
        await redis.delete(job_key_prefix + f"chain:{lost}:0")
        assert await sched.reconcile(T0 + 300 + 1) == []  # still within the grace period
        assert await sched.reconcile(T0 + 1000) == [lost]
        assert await sched.reconcile(T0 + 1000) == []  # its new job is waiting now
        async with svc.sessionmaker() as s:
            assert (await s.get(ChainRun, lost)).arq_job_id == f"chain:{lost}:1"  # type: ignore[union-attr]
            # the second run was taken by a worker that then died (lease expired mid-run)
            await s.execute(
                update(ChainRun)
                .where(ChainRun.id == waiting)
                .values(
                    status="running", lease_owner="dead", lease_token=1, lease_expires_at=T0 + 400
                )
            )
            await s.commit()
        await redis.set(in_progress_key_prefix + f"chain:{waiting}:0", "1")
        assert await sched.reconcile(T0 + 1000) == [waiting]
        assert await redis.exists(job_key_prefix + f"chain:{waiting}:1")
        await _arq_cleanup(redis, [lost, waiting])
    finally:
        await close_services(svc)


@pytest.mark.slow
async def test_manual_runs_are_each_their_own_run(settings, sessionmaker, redis, registry) -> None:  # type: ignore[no-untyped-def]
    svc = make_services(
        settings.model_copy(
            update={
                "database_url": str(
                    sessionmaker.kw["bind"].url.render_as_string(hide_password=False)
                )
            }
        ),
        redis,
    )
    try:
        row = await schedules.create(svc.sessionmaker, validate(base_spec(), registry))
        a = await schedules.trigger_manual(svc, row.id)
        b = await schedules.trigger_manual(svc, "daily")
        assert a != b
        runs = await schedules.list_runs(svc, row.id)
        assert {r["id"] for r in runs} == {a, b}
        assert all(r["status"] == "queued" and r["fire_key"].startswith("manual:") for r in runs)
        got = await schedules.get_run(svc, a)
        assert got is not None and got["schedule_id"] == row.id and got["steps"] == []
        assert await redis.exists(job_key_prefix + f"chain:{a}:0")
        with pytest.raises(LookupError):
            await schedules.trigger_manual(svc, "nope")
        await _arq_cleanup(redis, [a, b])
    finally:
        await close_services(svc)


@pytest.mark.slow
async def test_run_forever_survives_an_unreachable_database(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Ticks against a database that refuses connections are logged and retried; the loop
    keeps going until asked to stop."""
    settings = make_settings(
        tmp_path,
        redis_url=None,
        prefix="sjt-down",
        database_url="postgresql+asyncpg://postgres@127.0.0.1:1/nowhere",
        scheduler_interval_sec=0.01,
    )
    svc = make_services(settings, None)
    try:
        stop = asyncio.Event()
        task = asyncio.create_task(Scheduler(svc).run_forever(stop))
        await asyncio.sleep(0.5)
        deadline = time.monotonic() + 15  # (a loaded host may not have ticked yet)
        while not any("scheduler tick failed" in r.getMessage() for r in caplog.records):
            assert not task.done() and time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert not task.done()
        stop.set()
        await asyncio.wait_for(task, 5)
    finally:
        await close_services(svc)
    assert any("scheduler tick failed" in r.getMessage() for r in caplog.records)


def test_next_fires_cross_a_daylight_saving_change() -> None:
    from jobs.models import Schedule

    before = datetime(2026, 3, 27, 8, 0, tzinfo=UTC).timestamp()  # 09:00 CET, a Friday
    row = Schedule(
        name="x", cron="0 9 * * *", timezone="Europe/Berlin", enabled=True, next_fire_at=before
    )
    hours = [datetime.fromtimestamp(t, UTC).hour for t in schedules.next_fires(row, 5)]
    assert hours == [8, 8, 7, 7, 7]  # 09:00 local: CET, then CEST from March 29
    row.enabled = False
    assert schedules.next_fires(row) == []
