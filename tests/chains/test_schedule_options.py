"""Schedule options: one-shot ``at:`` schedules, ``quiet_when_empty`` and ``empty_when`` (on
the schedule and per step, for seed-style results such as ``sql_query``'s ``{rows,
row_count, sql}``), and cron ``jitter``. Pure rules first, then through the API and real
workers on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func, select

from chains import emptiness, timing
from chains.cron import NEVER, next_fire
from chains.scheduler import Scheduler
from jobs.models import ChainRun, ChainStep, Delivery, Schedule
from jobs.services import Services
from tests.helpers.chains import write_skill
from tests.helpers.inprocess import api, running_worker
from tests.helpers.settings import JOB_SKILLS

# --- pure logic ---------------------------------------------------------------------------


def test_empty_when_rules():
    nothing = {"ok": True, "total": 0, "rows": []}
    some = {"ok": True, "total": 2, "rows": [1, 2]}
    sql = {"rows": [], "row_count": 0, "sql": "select 1"}  # seed 001 sql_query
    rules = emptiness.parse("total == 0")
    assert emptiness.is_empty(nothing, rules) and not emptiness.is_empty(some, rules)
    assert not emptiness.is_empty(nothing, [])  # the guard alone: 0 is a value
    assert not emptiness.is_empty(sql, [])
    assert emptiness.is_empty(sql, emptiness.parse("rows"))
    assert emptiness.is_empty(sql, emptiness.parse("rows is empty"))
    assert emptiness.is_empty(sql, emptiness.parse(["total > 5", "row_count <= 0"]))
    assert emptiness.is_empty(sql, emptiness.parse("total == 1 or rows"))
    # under the envelope's data; nested paths; a list item
    assert emptiness.is_empty({"ok": True, "data": {"rows": []}, "x": 1}, emptiness.parse("rows"))
    page = {"list": [], "pageInfo": {"totalRows": 0}}  # seed 001 datatable query
    assert emptiness.is_empty(page, emptiness.parse("pageInfo.totalRows == 0"))
    assert emptiness.is_empty({"a": [{"n": 0}]}, emptiness.parse("a.0.n == 0"))
    # a missing field compared does not match; a missing named field is empty
    assert not emptiness.is_empty(some, emptiness.parse("count == 0"))
    assert emptiness.is_empty(some, emptiness.parse("missing"))
    assert emptiness.is_empty({"s": "none"}, emptiness.parse('s == "none"'))
    assert not emptiness.is_empty({"flag": 0}, emptiness.parse("flag == false"))
    for bad in ("total = 0", "total == zero", "", "== 0", "rows == [1]"):
        with pytest.raises(emptiness.RuleError):
            emptiness.parse(bad)


def test_jitter_is_fixed_per_schedule_and_moves_every_fire_time():
    a = timing.jitter_offset("daily-a", 30)
    assert a == timing.jitter_offset("daily-a", 30) and 0 <= a < 30
    offsets = {timing.jitter_offset(f"daily-{i}", 30) for i in range(20)}
    assert len(offsets) > 5  # spread, not one second for all
    assert timing.jitter_offset("x", 0) == 0
    tz = ZoneInfo("Asia/Shanghai")
    nine = datetime(2026, 12, 7, 9, 0, tzinfo=tz).timestamp()
    expr = timing.expr_of("0 9 * * *", {"jitter_offset_s": 17})
    first = next_fire(expr, tz, nine - 3600)
    assert first == nine + 17
    assert next_fire(expr, tz, first) == nine + 86400 + 17
    assert next_fire(expr, tz, nine + 5) == nine + 17  # between 09:00 and its fire time


def test_one_shot_expression_fires_once():
    tz = ZoneInfo("UTC")
    expr = timing.expr_of("", {"at_epoch": 2_000_000_000.0})
    assert next_fire(expr, tz, 1_000.0) == 2_000_000_000.0
    assert next_fire(expr, tz, 2_000_000_000.0) == NEVER
    assert timing.next_time("", {"at_epoch": 5.0}, "UTC", 10.0) is None


# --- through the API and real workers -----------------------------------------------------

NOTHING_TODAY = """
def execute(input_data, ctx):
    return {"ok": True, "total": 0, "rows": []}
"""
SQL_QUERY = """
def execute(input_data, ctx):
    return {"rows": [], "row_count": 0, "sql": "select * from orders where day = :d"}
"""
REPORT = """
def execute(input_data, ctx):
    return {"ok": True, "message": "report of " + str(input_data.get("n"))}
"""


@pytest.fixture
async def svc(job_settings, tmp_path):
    root = tmp_path / "sched_skills"
    write_skill(root, "nothing_today", NOTHING_TODAY)
    write_skill(root, "sql_rows", SQL_QUERY)
    write_skill(root, "report", REPORT)
    settings = job_settings.model_copy(
        update={"skills_path": os.pathsep.join([str(JOB_SKILLS), str(root)])}
    )
    s = await Services.open(settings)
    yield s
    assert s.redis is not None
    keys = [k async for k in s.redis.scan_iter(count=1000, match=f"{settings.redis_prefix}*")]
    if keys:
        await s.redis.delete(*keys)
    await s.close()


def _schedule(name: str, at: float, steps: list[dict], **extra) -> dict:
    return {
        "name": name,
        "at": datetime.fromtimestamp(at, UTC).isoformat(),
        "identity": {"role_id": "r1", "org_id": "o1", "session_id": f"s-{name}"},
        "deliver": {"session_id": f"s-{name}"},
        "steps": steps,
        **extra,
    }


async def _runs(s: Services, schedule_id: str) -> list[ChainRun]:
    async with s.sessionmaker() as db:
        return list(await db.scalars(select(ChainRun).where(ChainRun.schedule_id == schedule_id)))


async def _wait_final(s: Services, schedule_id: str, limit: float = 30.0) -> ChainRun:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        runs = await _runs(s, schedule_id)
        if runs and runs[0].status in ("succeeded", "failed", "stopped_empty"):
            return runs[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"schedule {schedule_id} did not finish a run")


async def _deliveries(s: Services, run_id: str) -> int:
    async with s.sessionmaker() as db:
        n = await db.scalar(
            select(func.count()).select_from(Delivery).where(Delivery.chain_run_id == run_id)
        )
    return int(n or 0)


@pytest.mark.integration
@pytest.mark.slow
async def test_one_shot_quiet_and_empty_when_through_workers(svc):
    at = time.time() + 2.0
    later = [{"id": "report", "skill": "report", "input": {"n": "$steps.fetch.total"}}]
    specs = {
        "quiet": _schedule(
            "quiet",
            at,
            [{"id": "fetch", "skill": "nothing_today"}, *later],
            quiet_when_empty=True,
            empty_when="total == 0",
        ),
        "loud": _schedule(
            "loud", at, [{"id": "fetch", "skill": "nothing_today"}, *later], empty_when="total == 0"
        ),
        "step_rule": _schedule(
            "step_rule",
            at,
            [{"id": "fetch", "skill": "sql_rows", "empty_when": "rows"}, *later],
            quiet_when_empty=True,
        ),
        "no_rule": _schedule("no_rule", at, [{"id": "fetch", "skill": "nothing_today"}, *later]),
    }
    ids = {}
    async with api(svc) as c:
        for key, spec in specs.items():
            r = await c.post("/api/v1/schedules", json=spec)
            assert r.status_code in (200, 201), r.text
            body = r.json()
            ids[key] = body["id"]
            assert body["cron"] is None and body["at"] == spec["at"]
            assert body["next_fire_at"] is not None and len(body["next_fires"]) == 1
        shown = (await c.get(f"/api/v1/schedules/{ids['quiet']}")).json()
        assert shown["quiet_when_empty"] is True and shown["empty_when"] == "total == 0"
    # two workers, each with its scheduler: every one-shot schedule fires exactly once
    async with running_worker(svc, scheduler=True), running_worker(svc, scheduler=True):
        done = {key: await _wait_final(svc, sid) for key, sid in ids.items()}
        await asyncio.sleep(1.5)  # more scheduler ticks: nothing fires again
    for key, sid in ids.items():
        assert len(await _runs(svc, sid)) == 1, key
        async with svc.sessionmaker() as db:
            row = await db.get(Schedule, sid)
        assert row is not None and row.next_fire_at is None
    assert done["quiet"].started_at is not None and done["quiet"].started_at - at < 1.5
    quiet, loud, step_rule, no_rule = (done[k] for k in ("quiet", "loud", "step_rule", "no_rule"))
    assert quiet.status == loud.status == step_rule.status == "stopped_empty"
    assert no_rule.status == "succeeded"  # 0 is a value for the guard alone
    assert await _deliveries(svc, quiet.id) == 0 and await _deliveries(svc, step_rule.id) == 0
    assert await _deliveries(svc, loud.id) >= 1  # not quiet: "nothing to report" is sent
    async with svc.sessionmaker() as db:
        steps = list(
            await db.scalars(
                select(ChainStep).where(ChainStep.run_id == quiet.id).order_by(ChainStep.idx)
            )
        )
    assert [st.status for st in steps] == ["stopped_empty", "skipped"]


@pytest.mark.integration
@pytest.mark.slow
async def test_schedule_options_are_checked(svc):
    now = time.time()
    step = [{"skill": "report"}]
    async with api(svc) as c:
        for spec, why in (
            (_schedule("a", now + 60, step, empty_when="total = 0"), "empty_when"),
            (_schedule("b", now - 60, step), "has passed"),
            (_schedule("c", now + 60, step, cron="0 9 * * *"), "one of them"),
            ({**_schedule("d", now, step), "at": "someday"}, "at:"),
            (_schedule("e", now + 60, [{"skill": "report", "empty_when": "x ~ 1"}]), "steps.0"),
            ({**_schedule("f", now, step, jitter="2h"), "cron": "0 9 * * *", "at": None}, "jitter"),
        ):
            r = await c.post("/api/v1/schedules", json=spec)
            assert 400 <= r.status_code < 500 and why in r.text, (spec, r.text)


@pytest.mark.integration
@pytest.mark.slow
async def test_jitter_fires_each_time_once_at_its_offset(svc):
    base = {
        "cron": "* * * * *",
        "jitter": "30s",
        "identity": {"role_id": "r1"},
        "steps": [{"skill": "report"}],
    }
    async with api(svc) as c:
        made = []
        for name in ("jit-a", "jit-b", "jit-c"):
            r = await c.post("/api/v1/schedules", json={"name": name, **base})
            assert r.status_code in (200, 201), r.text
            made.append(r.json())
    for body in made:
        offset = timing.jitter_offset(body["name"], 30)
        fire = datetime.fromisoformat(body["next_fire_at"]).timestamp()
        assert fire % 60 == offset, (body["name"], fire % 60, offset)
        assert body["jitter"] == "30s"
    async with svc.sessionmaker() as db:
        row = await db.scalar(select(Schedule).where(Schedule.name == "jit-a"))
    assert row is not None and row.next_fire_at is not None
    due = row.next_fire_at
    # several schedulers at the fire time: one run; the next fire keeps the offset
    created = await asyncio.gather(*(Scheduler(svc).tick(now=due + 0.1) for _ in range(3)))
    async with svc.sessionmaker() as db:
        mine = [r for r in await db.scalars(select(ChainRun)) if r.schedule_id == row.id]
        again = await db.get(Schedule, row.id)
    assert len(mine) == 1 and mine[0].fire_at == due
    assert sum(len(c) for c in created) >= 1
    assert again is not None and again.next_fire_at == due + 60
