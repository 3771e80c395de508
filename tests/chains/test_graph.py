"""Chains as graphs: ``needs`` (independent steps side by side, bounded), ``for_each`` fan-out
with each item a tracked step run and the fan-in as a list, and the chain rules on graphs —
the empty guard, a failing item, the chain policy, re-run from a step, resume after a
worker is killed. Pure checks first, then through the API and real workers on SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from chains.graph import GraphError, build, item_idx, item_of
from chains.refs import StepRefs, static_errors
from chains.schedules import ScheduleError, validate
from jobs.services import Services
from tests.helpers.chains import write_skill
from tests.helpers.inprocess import api, running_worker
from tests.helpers.settings import JOB_SKILLS
from tests.helpers.workers import WorkerProcess

# --- pure logic ---------------------------------------------------------------------------


def test_graph_shapes_and_refusals():
    g = build(["list", "a", "b", "join"], [[], ["list"], ["list"], ["a", "b"]], [None] * 4)
    assert g.is_graph and g.deps == ((), (0,), (0,), (1, 2))
    assert g.ancestors(3) == {0, 1, 2} and g.descendants(0) == {1, 2, 3}
    assert g.levels() == [[0], [1, 2], [3]]
    assert g.prev(1) == 0 and g.prev(3) is None
    line = build(["x", "y"], [None, None], [None, "$steps.x.rows"])
    assert line.deps == ((), (0,)) and line.is_graph and line.source_of(1) == 0
    assert not build(["x", "y"], [None, None], [None, None]).is_graph
    for needs, for_each, why in (
        ([["b"], ["a"]], [None, None], "cycle"),
        ([["a"], []], [None, None], "needs itself"),
        ([["zz"], []], [None, None], "unknown step 'zz'"),
        ([[], []], [None, "$steps.a.rows"], "does not wait for"),
        ([[], ["a"]], [None, "rows"], "for_each must be one reference"),
    ):
        with pytest.raises(GraphError, match=why):
            build(["a", "b"], needs, for_each)
    assert item_of(item_idx(2, 17)) == (2, 17) and item_of(5) is None


def test_references_in_a_graph_go_to_steps_it_waits_for():
    steps = [
        StepRefs("list", {}, {}, needs=()),
        StepRefs("a", {"x": "$steps.list.rows"}, {}, needs=("list",)),
        StepRefs("b", {"y": "$steps.a.x"}, {}, needs=("list",)),
        StepRefs("c", {"z": "$item.n"}, {}, needs=("list",)),
    ]
    g = build([s.id for s in steps], [s.needs for s in steps], [None] * 4)
    errs = "\n".join(
        static_errors(steps, [g.ancestors(i) for i in range(4)], [g.prev(i) for i in range(4)])
    )
    assert "step 2 (b): $steps.a.x refers to step 'a', which it does not wait for" in errs
    assert "step 3 (c): $item.n is only set in a for_each step" in errs
    assert "step 1" not in errs


def test_schedule_validation_names_graph_problems():
    base = {"name": "g", "cron": "0 9 * * *"}
    with pytest.raises(ScheduleError) as e:
        validate(
            {
                **base,
                "steps": [
                    {"id": "a", "skill": "x", "needs": ["b"]},
                    {"id": "b", "skill": "x", "needs": ["a"]},
                ],
            },
            None,
        )
    assert "cycle" in str(e.value)
    spec = validate(
        {
            **base,
            "policy": {"max_parallel": 8},
            "steps": [
                {"id": "list", "skill": "x"},
                {"id": "each", "skill": "x", "for_each": "$steps.list.rows", "max_items": 50},
            ],
        },
        None,
    )
    assert spec.graph().is_graph and spec.steps[1].max_items == 50


# --- through the API and real workers -----------------------------------------------------

LIST = """
import json, pathlib
def execute(input_data, ctx):
    n = int(input_data.get("n", 3))
    log = input_data.get("log")
    if log:
        with open(log, "a") as fh:
            fh.write("list\\n")
    return {"rows": [{"n": i + 1} for i in range(n)], "chat_mode": ctx.get("chat_mode")}
"""
NAP = """
import time
def execute(input_data, ctx):
    start = time.time()
    time.sleep(float(input_data.get("sec", 0.5)))
    log = input_data.get("log")
    if log:
        with open(log, "a") as fh:
            fh.write(input_data.get("name", "nap") + "\\n")
    return {"name": input_data.get("name"), "start": start, "end": time.time()}
"""
DOUBLE = """
import pathlib, time
def execute(input_data, ctx):
    n = input_data["n"]
    log = input_data.get("log")
    if log:
        with open(log, "a") as fh:
            fh.write(f"item {n}\\n")
    if n == input_data.get("fail_on"):
        return {"ok": False, "error": f"no double for {n}"}
    slow = input_data.get("slow_once")
    if slow and n == slow["n"] and not pathlib.Path(slow["marker"]).exists():
        pathlib.Path(slow["marker"]).write_text("x")
        time.sleep(60)
    return {"n": n, "double": n * 2, "chat_mode": ctx.get("chat_mode")}
"""
JOIN = """
def execute(input_data, ctx):
    return {"message": "doubled: " + ",".join(str(x["double"]) for x in input_data["doubled"]),
            "names": [input_data.get("a"), input_data.get("b")]}
"""


@pytest.fixture
def skill_root(tmp_path: Path) -> Path:
    root = tmp_path / "graph_skills"
    write_skill(root, "g_list", LIST)
    write_skill(root, "g_nap", NAP)
    write_skill(root, "g_double", DOUBLE)
    write_skill(root, "g_join", JOIN)
    return root


@pytest.fixture
async def svc(job_settings, skill_root):
    # the graph's skills are the test's own (trusted): they log their calls beside it
    settings = job_settings.model_copy(
        update={"skills_path": os.pathsep.join([str(JOB_SKILLS), f"trusted={skill_root}"])}
    )
    s = await Services.open(settings)
    yield s
    assert s.redis is not None
    keys = [k async for k in s.redis.scan_iter(count=1000, match=f"{settings.redis_prefix}*")]
    if keys:
        await s.redis.delete(*keys)
    await s.close()


def _graph(name: str, log: Path, **item_input) -> dict:
    return {
        "name": name,
        "cron": "0 3 1 1 *",
        "identity": {"role_id": "r1", "org_id": "o1", "session_id": f"s-{name}"},
        "policy": {"max_parallel": 4},
        "steps": [
            {"id": "list", "skill": "g_list", "input": {"n": 3, "log": str(log)}},
            {
                "id": "a",
                "skill": "g_nap",
                "needs": ["list"],
                "input": {"name": "a", "log": str(log)},
            },
            {
                "id": "b",
                "skill": "g_nap",
                "needs": ["list"],
                "input": {"name": "b", "log": str(log)},
            },
            {
                "id": "each",
                "skill": "g_double",
                "needs": ["list"],
                "for_each": "$steps.list.rows",
                "input": {"n": "$item.n", "log": str(log), **item_input},
            },
            {
                "id": "join",
                "skill": "g_join",
                "needs": ["a", "b", "each"],
                "input": {"doubled": "$steps.each", "a": "$steps.a.name", "b": "$steps.b.name"},
            },
        ],
    }


async def _run(c, spec: dict, svc: Services, *, limit: float = 60) -> dict:
    r = await c.post("/api/v1/schedules", json=spec)
    assert r.status_code in (200, 201), r.text
    r = await c.post(f"/api/v1/schedules/{r.json()['id']}/run")
    assert r.status_code == 202, r.text
    return await _wait_run(c, r.json()["run_id"], limit)


async def _wait_run(c, run_id: str, limit: float = 60) -> dict:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        run = (await c.get(f"/api/v1/chain-runs/{run_id}", params={"items": "true"})).json()
        if run["status"] in ("succeeded", "failed", "stopped_empty"):
            return run
        await asyncio.sleep(0.1)
    raise AssertionError(f"chain run {run_id} did not finish: {run['status']}")


async def _wait_recorded(c, run_id: str, *, steps: tuple[str, ...], items: int) -> None:
    """Until ``steps`` and ``items`` item runs are recorded as succeeded: what a worker
    killed now must not run again (a fixed pause is too short on a loaded host)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = (await c.get(f"/api/v1/chain-runs/{run_id}", params={"items": "true"})).json()
        done = {s["id"] for s in run["steps"] if s["status"] == "succeeded"}
        ok_items = [i for i in run.get("items", []) if i["status"] == "succeeded"]
        if done.issuperset(steps) and len(ok_items) >= items:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"chain run {run_id}: {steps} and {items} items never recorded")


@pytest.mark.integration
@pytest.mark.slow
async def test_graph_runs_in_parallel_fans_out_and_in(svc, tmp_path):
    log = tmp_path / "calls.log"
    async with api(svc) as c, running_worker(svc):
        run = await _run(c, _graph("graph-ok", log), svc)
    assert run["status"] == "succeeded", run
    steps = {s["id"]: s for s in run["steps"]}
    assert list(steps) == ["list", "a", "b", "each", "join"]
    assert steps["join"]["needs"] == ["a", "b", "each"]
    assert steps["each"]["for_each"] == "$steps.list.rows"
    assert steps["each"]["items"] == {"total": 3, "succeeded": 3}
    # a and b ran side by side
    a, b = steps["a"]["output"], steps["b"]["output"]
    assert a["start"] < b["end"] and b["start"] < a["end"], (a, b)
    # the fan-in: the items' outputs, in order; each item a tracked run
    assert [x["double"] for x in steps["each"]["output"]] == [2, 4, 6]
    assert steps["join"]["output"]["message"] == "doubled: 2,4,6"
    assert steps["join"]["output"]["names"] == ["a", "b"]
    items = run["items"]
    assert [(i["id"], i["item"], i["status"]) for i in items] == [
        ("each[0]", 0, "succeeded"),
        ("each[1]", 1, "succeeded"),
        ("each[2]", 2, "succeeded"),
    ]
    assert items[1]["input"]["n"] == 2 and items[1]["output"]["double"] == 4
    # the chain policy holds for items too
    assert steps["list"]["output"]["chat_mode"] is False
    assert all(i["output"]["chat_mode"] is False for i in items)


@pytest.mark.integration
@pytest.mark.slow
async def test_graph_empty_list_and_failing_item_stop_the_run(svc, tmp_path):
    log = tmp_path / "calls.log"
    empty = _graph("graph-empty", log)
    empty["steps"][0]["input"]["n"] = 0
    failing = _graph("graph-fail", log, fail_on=2)
    async with api(svc) as c, running_worker(svc):
        stopped = await _run(c, empty, svc)
        failed = await _run(c, failing, svc)
    # nothing to fan out over: the guard stops the chain at the for_each step
    assert stopped["status"] == "stopped_empty"
    st = {s["id"]: s["status"] for s in stopped["steps"]}
    assert st["list"] == "succeeded" and st["each"] == "stopped_empty" and st["join"] == "skipped"
    assert "is empty" in stopped["error"]
    # one failing item fails the step and the run, naming the item
    assert failed["status"] == "failed"
    fs = {s["id"]: s for s in failed["steps"]}
    assert fs["each"]["status"] == "failed" and "item 1: no double for 2" in fs["each"]["error"]
    assert fs["join"]["status"] == "skipped"
    assert "item 1" in failed["error"]


@pytest.mark.integration
@pytest.mark.slow
async def test_graph_rerun_from_a_step_reuses_the_others(svc, tmp_path):
    log = tmp_path / "calls.log"
    async with api(svc) as c, running_worker(svc):
        first = await _run(c, _graph("graph-rerun", log), svc)
        assert first["status"] == "succeeded"
        before = log.read_text().splitlines()
        r = await c.post(f"/api/v1/chain-runs/{first['id']}/rerun", json={"from_step": "each"})
        assert r.status_code == 202, r.text
        again = await _wait_run(c, r.json()["run_id"])
    assert again["status"] == "succeeded"
    ran = log.read_text().splitlines()[len(before) :]
    # list, a and b do not wait for `each`: reused; each (3 items) and join ran again
    assert sorted(ran) == ["item 1", "item 2", "item 3"]
    steps = {s["id"]: s for s in again["steps"]}
    assert steps["join"]["output"]["message"] == "doubled: 2,4,6"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.timeout(180)
async def test_graph_resumes_after_its_worker_is_killed(svc, tmp_path):
    """SIGKILL of the worker while item 2 runs: the next worker runs only what had not
    succeeded — items 0 and 1 and the independent steps are not run again."""
    log, marker = tmp_path / "calls.log", tmp_path / "slow.marker"
    spec = _graph("graph-kill", log, slow_once={"n": 3, "marker": str(marker)})
    first = WorkerProcess(svc.settings, tmp_path / "w1.log", "--no-scheduler")
    second = None
    try:
        async with api(svc) as c:
            r = await c.post("/api/v1/schedules", json=spec)
            r = await c.post(f"/api/v1/schedules/{r.json()['id']}/run")
            run_id = r.json()["run_id"]
            deadline = time.monotonic() + 60
            while not marker.exists():  # item 2 is running (it sleeps the first time)
                assert time.monotonic() < deadline, "the slow item never started"
                await asyncio.sleep(0.1)
            await _wait_recorded(c, run_id, steps=("list", "a", "b"), items=2)
            first.signal(signal.SIGKILL)
            first.proc.wait(10)
            second = WorkerProcess(svc.settings, tmp_path / "w2.log", "--no-scheduler")
            run = await _wait_run(c, run_id, limit=90)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert run["status"] == "succeeded", run
    calls = log.read_text().splitlines()
    assert calls.count("list") == 1 and calls.count("a") == 1 and calls.count("b") == 1
    assert calls.count("item 1") == 1 and calls.count("item 2") == 1
    assert calls.count("item 3") == 2  # killed once, run again
    steps = {s["id"]: s for s in run["steps"]}
    assert steps["join"]["output"]["message"] == "doubled: 2,4,6"
