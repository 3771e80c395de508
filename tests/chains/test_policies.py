"""Fire policies: misfires, overlap, auto-pause and alerts — scheduler ticks on a
controllable clock, chain runs through the real executor, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select, update

from chains import policies, schedules
from chains.policies import Busy, default_grace, plan_fires
from chains.runner import run_chain
from chains.scheduler import Scheduler
from jobs.execution.executor import Executor
from jobs.models import ChainRun, OpsAction, Schedule
from tests.fakes.sink import FakeSink
from tests.helpers.chains import FAIL, SLOW, close_services, make_services, write_skill
from tests.helpers.settings import make_settings

T0 = datetime(2026, 3, 2, 8, 0, 0, tzinfo=UTC).timestamp()  # a Monday, on the hour
UTC_TZ = ZoneInfo("UTC")


# --- pure planning --------------------------------------------------------------------------


def test_default_grace_is_half_the_period_within_bounds() -> None:
    assert default_grace("*/5 * * * *", UTC_TZ, T0) == 150
    assert default_grace("0 * * * *", UTC_TZ, T0) == 1800
    assert default_grace("* * * * *", UTC_TZ, T0) == 120  # at least 2 min
    assert default_grace("0 9 * * *", UTC_TZ, T0) == 7200  # at most 2 h


def _plan(fires: list[float], now: float, **kw: object) -> list[tuple[float, str, bool]]:
    kw.setdefault("misfire", None)
    kw.setdefault("overlap", None)
    kw.setdefault("grace", 150.0)
    kw.setdefault("busy", Busy())
    return [(f.at, f.status, f.hold) for f in plan_fires(fires, now, **kw)]  # type: ignore[arg-type]


def test_misfire_one_none_all() -> None:
    fires = [T0, T0 + 300, T0 + 600]
    # one: the latest, within the grace, runs; the overtaken ones are missed
    assert _plan(fires, T0 + 700) == [
        (T0, "missed", False),
        (T0 + 300, "missed", False),
        (T0 + 600, "queued", False),
    ]
    # later than the grace: nothing runs
    assert {s for _, s, _ in _plan(fires, T0 + 800)} == {"missed"}
    # none: after downtime nothing is caught up; a single on-time fire runs
    assert {s for _, s, _ in _plan(fires, T0 + 700, misfire={"catch_up": "none"})} == {"missed"}
    assert _plan([T0], T0 + 5, misfire={"catch_up": "none"}) == [(T0, "queued", False)]
    # all: each replayed, one after another
    assert _plan(fires, T0 + 700, misfire={"catch_up": "all"}, grace=None) == [
        (T0, "queued", False),
        (T0 + 300, "queued", True),
        (T0 + 600, "queued", True),
    ]
    many = [T0 + 60 * i for i in range(250)]
    plan = plan_fires(
        many, T0 + 60 * 250, misfire={"catch_up": "all"}, overlap=None, grace=None, busy=Busy()
    )
    assert sum(f.status == "queued" for f in plan) == 100  # capped
    assert sum(f.status == "missed" for f in plan) == 100  # newest missed rows recorded


def test_overlap_skip_queue_one_allow() -> None:
    going = Busy(active=1)
    assert _plan([T0], T0 + 1, busy=going) == [(T0, "skipped", False)]
    assert _plan([T0], T0 + 1, busy=going, overlap="queue_one") == [(T0, "queued", True)]
    # queue_one holds at most one
    assert _plan([T0], T0 + 1, busy=Busy(2, 1), overlap="queue_one") == [(T0, "skipped", False)]
    assert _plan([T0], T0 + 1, busy=going, overlap="allow") == [(T0, "queued", False)]


# --- on the databases -----------------------------------------------------------------------


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "testskills"
    write_skill(root, "fail_step", FAIL)
    write_skill(root, "slow_step", SLOW)
    return root


@pytest.fixture
def sink():  # type: ignore[no-untyped-def]
    with FakeSink() as server:
        yield server


@pytest.fixture
async def env(tmp_path, database_url, redis, redis_server_url, redis_prefix, skills_dir, sink):  # type: ignore[no-untyped-def]
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        worker_lease_sec=3.0,
        notify_targets=json.dumps({"ops": [f"json://127.0.0.1:{sink.port}/alerts"]}),
        fetch_allow_hosts="127.0.0.1",
    )
    svc = make_services(settings, redis, extra_skills=skills_dir)
    ex = Executor(
        settings=svc.settings,
        registry=svc.registry,
        sessionmaker=svc.sessionmaker,
        box=svc.box,
        http=svc.http,
    )
    yield svc, ex
    await ex.aclose()
    await close_services(svc)


def spec(**over: object) -> dict:
    data: dict = {
        "name": "report",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "identity": {"role_id": "r1", "org_id": "o1", "session_id": "s1"},
        "steps": [{"skill": "echo", "input": {"message": "hourly"}}],
    }
    data.update(over)
    return data


async def _runs(svc) -> list[ChainRun]:  # type: ignore[no-untyped-def]
    async with svc.sessionmaker() as s:
        return list((await s.execute(select(ChainRun).order_by(ChainRun.fire_at))).scalars())


@pytest.mark.slow
async def test_downtime_longer_than_the_grace_records_missed_and_runs_nothing(env) -> None:  # type: ignore[no-untyped-def]
    svc, _ = env
    row = await schedules.create(svc, spec(), now=T0 - 1)
    # down for five hours; the last fire (T0+4h) is 40 min old, the grace is 30 min
    assert await Scheduler(svc).tick(T0 + 4 * 3600 + 40 * 60) == []
    runs = await _runs(svc)
    assert [r.status for r in runs] == ["missed"] * 5
    assert [r.fire_at for r in runs] == [T0 + 3600 * h for h in range(5)]
    assert all("1800 s" in (r.error or "") for r in runs)
    # the schedule goes on from now, and the rows are in its run list
    fresh = await schedules.get(svc, row.id)
    assert fresh.next_fire_at == T0 + 5 * 3600  # type: ignore[union-attr]
    listed = await schedules.list_runs(svc, row.id)
    assert [r["status"] for r in listed] == ["missed"] * 5


@pytest.mark.slow
async def test_catch_up_all_replays_each_one_after_another(env) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    await schedules.create(svc, spec(misfire={"catch_up": "all"}), now=T0 - 1)
    started = await Scheduler(svc).tick(T0 + 2 * 3600 + 60)
    runs = await _runs(svc)
    assert [r.status for r in runs] == ["queued"] * 3
    assert started == [runs[0].id]  # the others wait their turn
    assert [r.arq_job_id is None for r in runs] == [False, True, True]
    assert await run_chain(svc, ex, runs[0].id, worker_id="w1") == "succeeded"
    runs = await _runs(svc)
    assert [r.arq_job_id is None for r in runs] == [False, False, True]  # the next released
    assert await run_chain(svc, ex, runs[1].id, worker_id="w1") == "succeeded"
    assert await run_chain(svc, ex, runs[2].id, worker_id="w1") == "succeeded"
    assert [r.status for r in await _runs(svc)] == ["succeeded"] * 3


@pytest.mark.parametrize("overlap", ["skip", "queue_one"])
@pytest.mark.slow
async def test_a_fire_during_a_slow_run_is_skipped_or_held(env, overlap: str) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    # (slow enough to be still going through the ticks below on a loaded host)
    body = spec(overlap=overlap, steps=[{"skill": "slow_step", "input": {"sec": 3}}])
    await schedules.create(svc, body, now=T0 - 1)
    sched = Scheduler(svc)
    [first] = await sched.tick(T0 + 1)
    slow = asyncio.create_task(run_chain(svc, ex, first, worker_id="w1"))
    while (await _runs(svc))[0].status != "running":
        await asyncio.sleep(0.05)
    assert await sched.tick(T0 + 3600 + 1) == []
    second = (await _runs(svc))[1]
    if overlap == "skip":
        assert second.status == "skipped" and "still going" in (second.error or "")
    else:
        assert second.status == "queued" and second.arq_job_id is None
    assert await sched.tick(T0 + 2 * 3600 + 1) == []
    third = (await _runs(svc))[2]
    assert third.status == "skipped"  # queue_one holds one at most
    assert await slow == "succeeded"
    second = (await _runs(svc))[1]
    if overlap == "queue_one":  # released when the slow run finished
        assert second.arq_job_id == f"chain:{second.id}:0"
        assert await run_chain(svc, ex, second.id, worker_id="w1") == "succeeded"


async def _fail_runs(svc, ex, schedule_id: str, n: int) -> None:  # type: ignore[no-untyped-def]
    for _ in range(n):
        run_id = await schedules.trigger_manual(svc, schedule_id, enqueue=False)
        assert await run_chain(svc, ex, run_id, worker_id="w1") == "failed"


@pytest.mark.slow
async def test_auto_pause_after_consecutive_failures(env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    body = spec(policy={"pause_after_failures": 3}, steps=[{"skill": "fail_step"}])
    row = await schedules.create(svc, body)
    await _fail_runs(svc, ex, row.id, 2)
    assert (await schedules.get(svc, row.id)).enabled  # type: ignore[union-attr]
    await _fail_runs(svc, ex, row.id, 1)
    paused = await schedules.get(svc, row.id)
    assert paused is not None and not paused.enabled
    assert "3 consecutive failed runs" in (paused.paused_reason or "")
    assert "upstream said no" in (paused.paused_reason or "")
    assert schedules.to_dict(paused)["paused_reason"] == paused.paused_reason
    async with svc.sessionmaker() as s:
        audit = (
            await s.execute(select(OpsAction).where(OpsAction.action == "schedule.pause"))
        ).scalars()
        assert [a.target for a in audit] == [row.id]
    # the CLI says so
    from typer.testing import CliRunner

    from jobs.cli.app import app

    st = svc.settings
    for key, value in {
        "SKILLJOBS_DATA_DIR": str(st.data_dir),
        "SKILLJOBS_DATABASE_URL": st.resolved_database_url,
        "SKILLJOBS_SKILLS_PATH": str(st.skills_path or ""),
        "COLUMNS": "250",
    }.items():
        monkeypatch.setenv(key, value)
    res = await asyncio.to_thread(CliRunner().invoke, app, ["schedules", "list"])
    assert res.exit_code == 0 and "paused" in res.output, res.output
    # enabling it again clears the reason
    again = await schedules.set_enabled(svc, row.id, True)
    assert again.enabled and again.paused_reason is None


@pytest.mark.slow
async def test_an_alert_reaches_the_sink_once_per_cooldown(env, sink) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    body = spec(
        alert={"target": "ops", "after": 2, "cooldown_sec": 3600}, steps=[{"skill": "fail_step"}]
    )
    row = await schedules.create(svc, body)
    await _fail_runs(svc, ex, row.id, 1)
    assert sink.calls("/alerts") == []  # one failure is below the threshold
    await _fail_runs(svc, ex, row.id, 3)
    [alert] = sink.calls("/alerts")
    payload = alert.json
    assert "2 consecutive failed runs" in payload["message"]
    assert "upstream said no" in payload["message"]
    # once the cooldown has passed, the next failure alerts again
    async with svc.sessionmaker() as s:
        await s.execute(update(Schedule).where(Schedule.id == row.id).values(alerted_at=1.0))
        await s.commit()
    await _fail_runs(svc, ex, row.id, 1)
    assert len(sink.calls("/alerts")) == 2
    assert "5 consecutive failed runs" in sink.calls("/alerts")[1].json["message"]


@pytest.mark.slow
async def test_release_waits_while_a_run_is_going(env) -> None:  # type: ignore[no-untyped-def]
    svc, _ = env
    await schedules.create(svc, spec(misfire={"catch_up": "all"}), now=T0 - 1)
    await Scheduler(svc).tick(T0 + 3600 + 1)
    first, held = await _runs(svc)
    assert await policies.next_held(svc.sessionmaker, first.schedule_id) is None
    async with svc.sessionmaker() as s:
        await s.execute(update(ChainRun).where(ChainRun.id == first.id).values(status="succeeded"))
        await s.commit()
    assert await policies.next_held(svc.sessionmaker, first.schedule_id) == held.id
