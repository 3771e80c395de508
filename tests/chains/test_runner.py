"""The chain runner end to end: real executor, real skills, real databases and Redis."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from sqlalchemy import select, update

from chains import runstore, schedules
from chains.deliver import deliver_outcome
from chains.runner import run_chain
from chains.schedules import validate
from jobs.catalog.configs import ConfigStore
from jobs.context import background_context
from jobs.execution.executor import Executor
from jobs.models import ChainRun
from tests.helpers.chains import (
    COUNTER,
    FAIL,
    FLAKY,
    PROBE,
    SLEEP_ONCE,
    SLOW,
    chain_workspace,
    close_services,
    make_services,
    write_skill,
)
from tests.helpers.settings import make_settings


def _shell_skill(root: Path, name: str, script: str) -> None:
    """A SKILL.md + run.sh skill whose script prints what it is given."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: prints bytes no database stores\n"
        "exec:\n  primary:\n    type: shell\n    entry: run.sh\n---\n# poison\n"
    )
    (folder / "run.sh").write_text(f"#!/bin/sh\n{script}\n")
    (folder / "run.sh").chmod(0o755)


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "testskills"
    _shell_skill(root, "poison_out", r"printf 'weird \000 bytes \377\376 end\n'")
    write_skill(root, "counter", COUNTER)
    write_skill(root, "fail_step", FAIL)
    write_skill(root, "sleep_once", SLEEP_ONCE)
    write_skill(root, "ctx_probe", PROBE)
    write_skill(root, "flaky", FLAKY)
    write_skill(root, "slow_step", SLOW)
    return root


@pytest.fixture
async def env(settings, database_url: str, redis, skills_dir: Path):  # type: ignore[no-untyped-def]
    svc = make_services(
        settings.model_copy(update={"database_url": database_url, "worker_lease_sec": 3.0}),
        redis,
        extra_skills=skills_dir,
    )
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


async def start_run(svc, spec: dict) -> str:  # type: ignore[no-untyped-def]
    """Store the schedule and a queued run of it (as the scheduler would), no enqueue."""
    row = await schedules.create(svc, validate(spec, svc.registry))
    async with svc.sessionmaker() as s:
        run = ChainRun(
            schedule_id=row.id,
            fire_key=f"cron:{row.id}:1767225600",
            fire_at=1767225600.0,
            status="queued",
        )
        s.add(run)
        await s.commit()
        return run.id


def chain(*steps: dict, **over: object) -> dict:
    spec: dict = {
        "name": f"t{time.time_ns()}",
        "cron": "0 9 * * *",
        "timezone": "Asia/Shanghai",
        "identity": {"role_id": "r1", "org_id": "o1", "session_id": "s1"},
        "steps": list(steps),
    }
    spec.update(over)
    return spec


def count(path: Path) -> int:
    return int(path.read_text()) if path.exists() else 0


@pytest.mark.slow
async def test_chain_succeeds_and_records_every_step(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    run_id = await start_run(
        svc,
        chain(
            {
                "id": "fetch",
                "skill": "chain_fetch_orders",
                "input": {"day": "2026-01-05", "count": 12},
            },
            {
                "id": "keep",
                "skill": "chain_filter",
                "input": {"rows": "$steps.fetch.data.rows", "min_total": 0},
            },
            {
                "skill": "echo",
                "input": {
                    "n": "$steps.keep.data.rows",
                    "api_token": "tok-123",
                    "first": "first id $prev.data.rows.0.id",
                },
            },
        ),
    )
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "succeeded"
    run = await schedules.get_run(svc, run_id)
    assert run is not None and run["status"] == "succeeded"
    assert [s["status"] for s in run["steps"]] == ["succeeded"] * 3
    assert [s["id"] for s in run["steps"]] == ["fetch", "keep", "echo"]
    last = run["steps"][2]
    assert len(last["input"]["n"]) == 12
    assert last["input"]["first"] == "first id 2026-01-05-000"
    assert last["input"]["api_token"] != "tok-123"  # secrets are never shown
    assert "tok-123" not in json.dumps(run)
    async with svc.sessionmaker() as s:
        stored = (
            await s.execute(select(runstore.ChainStep).where(runstore.ChainStep.idx == 2))
        ).scalar_one()
    assert "tok-123" not in json.dumps(stored.output) and "tok-123" not in json.dumps(stored.input)
    assert run["started_at"] and run["finished_at"] >= run["started_at"]
    # the run is finished: running it again changes nothing
    assert await run_chain(svc, ex, run_id, worker_id="w2") == "succeeded"


@pytest.mark.slow
async def test_empty_result_guard_stops_the_chain(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    counter = chain_workspace(svc.settings) / "after.count"
    run_id = await start_run(
        svc,
        chain(
            {"id": "fetch", "skill": "chain_fetch_orders", "input": {"day": "d", "count": 5}},
            {
                "id": "big",
                "skill": "chain_filter",
                "input": {"rows": "$steps.fetch.data.rows", "min_total": 1e9},
            },
            {"id": "after", "skill": "counter", "input": {"counter_file": str(counter)}},
        ),
    )
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "stopped_empty"
    run = await schedules.get_run(svc, run_id)
    assert [s["status"] for s in run["steps"]] == ["succeeded", "stopped_empty", "skipped"]  # type: ignore[index]
    assert run["status"] == "stopped_empty" and "returned nothing" in run["error"]  # type: ignore[index]
    assert count(counter) == 0


@pytest.mark.slow
async def test_failed_step_fails_the_run_with_its_error(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    counter = chain_workspace(svc.settings) / "after.count"
    run_id = await start_run(
        svc,
        chain(
            {"id": "a", "skill": "fail_step"},
            {"id": "b", "skill": "counter", "input": {"counter_file": str(counter)}},
        ),
    )
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "failed"
    run = await schedules.get_run(svc, run_id)
    assert run["status"] == "failed" and "upstream said no" in run["error"]  # type: ignore[index]
    assert [s["status"] for s in run["steps"]] == ["failed", "skipped"]  # type: ignore[index]
    assert "upstream said no" in run["steps"][0]["error"]  # type: ignore[index]
    assert count(counter) == 0


@pytest.mark.slow
async def test_unresolved_reference_fails_before_the_step_runs(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    counter = chain_workspace(svc.settings) / "c.count"
    run_id = await start_run(
        svc,
        chain(
            {"id": "fetch", "skill": "chain_fetch_orders", "input": {"day": "d", "count": 2}},
            {
                "id": "use",
                "skill": "counter",
                "input": {"counter_file": str(counter), "value": "$steps.fetch.data.nope"},
            },
        ),
    )
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "failed"
    run = await schedules.get_run(svc, run_id)
    step = run["steps"][1]  # type: ignore[index]
    assert step["status"] == "failed"
    assert "$steps.fetch.data.nope" in step["error"]
    assert step["output"]["non_retriable"] is True
    assert "$steps.fetch.data.nope" in run["error"]  # type: ignore[index]
    assert count(counter) == 0  # the step never ran


@pytest.mark.slow
async def test_chain_context_identity_policy_and_configs(env) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    await ConfigStore(svc.sessionmaker, svc.box).set("r1", "ctx_probe", "region", "cn-east")
    run_id = await start_run(svc, chain({"skill": "ctx_probe"}))
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "succeeded"
    run = await schedules.get_run(svc, run_id)
    seen = run["steps"][0]["output"]["seen"]  # type: ignore[index]
    assert seen["chat_mode"] is False
    assert seen["channel"] == "schedule"
    assert seen["triggered_at"] == 1767225600.0
    assert (seen["role_id"], seen["org_id"], seen["session_id"]) == ("r1", "o1", "s1")
    assert seen["region"] == "cn-east"
    assert seen["workspace_dir"].endswith("/r1/s1")


@pytest.mark.slow
async def test_policy_wall_clock_applies(env) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    run_id = await start_run(
        svc, chain({"skill": "slow_step", "input": {"sec": 5}}, policy={"wall_sec": 1})
    )
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "failed"
    run = await schedules.get_run(svc, run_id)
    assert "ran over 1 s" in run["error"]  # type: ignore[index]


@pytest.mark.slow
async def test_transient_failures_are_re_run(env, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import chains.runner

    monkeypatch.setattr(chains.runner, "TRANSIENT_BACKOFF_SEC", 0.01)
    svc, ex = env
    counter = chain_workspace(svc.settings) / "flaky.count"
    run_id = await start_run(
        svc, chain({"skill": "flaky", "input": {"counter_file": str(counter)}})
    )
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "succeeded"
    assert count(counter) == 3


@pytest.mark.slow
async def test_purge_completes_in_a_chain_but_asks_in_chat(env) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    run_id = await start_run(
        svc,
        chain(
            {"id": "fetch", "skill": "chain_fetch_orders", "input": {"day": "d", "count": 12}},
            {
                "id": "purge",
                "skill": "chain_purge_rows",
                "input": {"table": "orders", "rows": "$steps.fetch.data.rows"},
            },
        ),
    )
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "succeeded"
    run = await schedules.get_run(svc, run_id)
    out = run["steps"][1]["output"]  # type: ignore[index]
    assert out["deleted"] == 12 and out.get("confirm_required") is None
    ws = Path(svc.settings.resolved_workspace_root) / "r1" / "s1"
    assert (ws / out["backup_file"]).is_file()
    # an intermediate file, in a sub-folder (seed 000 §5): never backfilled as a result
    assert out["backup_file"].startswith("backups/del_backup_orders_")
    assert not list(ws.glob("del_backup_*"))

    # the same call from a chat line (chat_mode True) asks for confirmation first
    rows = [{"id": f"x{i}"} for i in range(12)]
    ctx = background_context(
        {"role_id": "r1", "session_id": "s1", "channel": "telegram"},
        skill="chain_purge_rows",
        configs={},
    )
    assert ctx["chat_mode"] is True
    asked = await ex.run("chain_purge_rows", {"rows": rows}, ctx)
    assert asked["confirm_required"] is True and "deleted" not in asked
    done = await ex.run(
        "chain_purge_rows", {"rows": rows, "confirm_token": asked["confirm_token"]}, ctx
    )
    assert done["deleted"] == 12
    # an unknown count (deletion by filter) asks too
    unknown = await ex.run("chain_purge_rows", {"filters": {"status": "refunded"}}, ctx)
    assert unknown["confirm_required"] is True and unknown["would_delete"] is None
    # ten rows or fewer never ask
    few = await ex.run("chain_purge_rows", {"rows": rows[:10]}, ctx)
    assert few["deleted"] == 10


@pytest.mark.slow
async def test_resume_skips_succeeded_steps_and_refuses_a_live_lease(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    counter, marker = chain_workspace(svc.settings) / "step0.count", tmp_path / "slept"
    run_id = await start_run(
        svc,
        chain(
            {
                "id": "first",
                "skill": "counter",
                "input": {"counter_file": str(counter), "value": 41},
            },
            {"id": "slow", "skill": "sleep_once", "input": {"marker": str(marker), "sec": 20}},
            {
                "id": "last",
                "skill": "echo",
                "input": {"v": "$steps.first.value", "msg": "$steps.slow.message"},
            },
        ),
    )
    first = asyncio.create_task(run_chain(svc, ex, run_id, worker_id="w1"))
    for _ in range(200):
        if marker.exists():
            break
        await asyncio.sleep(0.05)
    assert marker.exists() and count(counter) == 1
    # w1 holds a live lease: another worker is refused
    assert await run_chain(svc, ex, run_id, worker_id="w2") == "busy"
    # w1 dies mid-step (no more heartbeats); its lease runs out
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    async with svc.sessionmaker() as s:
        await s.execute(
            update(ChainRun).where(ChainRun.id == run_id).values(lease_expires_at=time.time() - 1)
        )
        await s.commit()
    assert await run_chain(svc, ex, run_id, worker_id="w2") == "succeeded"
    assert count(counter) == 1  # step 0 was not run again
    run = await schedules.get_run(svc, run_id)
    assert run["steps"][2]["output"]["v"] == 41  # type: ignore[index]
    assert run["steps"][2]["output"]["msg"] == "woke up"  # type: ignore[index]


@pytest.mark.slow
async def test_outcome_delivered_to_a_web_session_once(env) -> None:  # type: ignore[no-untyped-def]
    from delivery.channels.web import ensure_session, list_messages

    svc, ex = env
    await ensure_session(svc.sessionmaker, "sched-s1", role_id="r1")
    spec = chain(
        {"id": "fetch", "skill": "chain_fetch_orders", "input": {"day": "d", "count": 3}},
        {
            "id": "none",
            "skill": "chain_filter",
            "input": {"rows": "$steps.fetch.data.rows", "status": "no-such"},
        },
        deliver={"session_id": "sched-s1"},
    )
    run_id = await start_run(svc, spec)
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "stopped_empty"
    msgs = await list_messages(svc.sessionmaker, "sched-s1")
    items = msgs["items"] if isinstance(msgs, dict) else msgs
    assert len(items) == 1 and "nothing to report" in items[0]["text"]
    run = await schedules.get_run(svc, run_id)
    assert run["result"]["delivery"]["status"] == "sent"  # type: ignore[index]

    # a resumed attempt that reaches delivery again does not send a second time
    async with svc.sessionmaker() as s:
        row = await s.get(ChainRun, run_id)
        await s.execute(
            update(ChainRun)
            .where(ChainRun.id == run_id)
            .values(status="running", lease_expires_at=None)
        )
        await s.commit()
    lease = await runstore.take_lease(svc.sessionmaker, run_id, "w9", 5.0)
    assert lease is not None
    again = await deliver_outcome(
        svc, lease, row, validate(spec, svc.registry), "stopped_empty", None, "x"
    )
    assert again["delivery"]["status"] == "sent"  # recorded once, not sent again
    msgs = await list_messages(svc.sessionmaker, "sched-s1")
    items = msgs["items"] if isinstance(msgs, dict) else msgs
    assert len(items) == 1


@pytest.mark.slow
async def test_delivery_to_a_session_no_dispatch_created(env) -> None:  # type: ignore[no-untyped-def]
    from delivery.channels.web import list_messages

    svc, ex = env
    run_id = await start_run(
        svc, chain({"skill": "echo", "input": {"message": "hi"}}, deliver={"session_id": "nobody"})
    )
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "succeeded"
    run = await schedules.get_run(svc, run_id)
    # created for the schedule's identity and delivered there: never a silent "succeeded"
    assert run["result"]["delivery"]["status"] == "sent"  # type: ignore[index]
    assert [m["text"] for m in await list_messages(svc.sessionmaker, "nobody")] == ["hi"]


async def _run_at(svc, schedule_id: str, fire_at: float) -> str:  # type: ignore[no-untyped-def]
    async with svc.sessionmaker() as s:
        run = ChainRun(
            schedule_id=schedule_id,
            fire_key=f"cron:{schedule_id}:{fire_at:.0f}",
            fire_at=fire_at,
            status="queued",
        )
        s.add(run)
        await s.commit()
        return run.id


@pytest.mark.slow
async def test_demo_chain_stops_on_quiet_days_and_reports(env) -> None:  # type: ignore[no-untyped-def]
    from chains.demo import install_demo
    from delivery.channels.web import list_messages

    svc, ex = env
    sid = await install_demo(svc)
    assert sid is not None and await install_demo(svc) is None  # installed once
    # fired 2026-01-02 09:00 Shanghai: yesterday (2026-01-01) had no refunds over 100
    quiet = await _run_at(svc, sid, 1767315600.0)
    assert await run_chain(svc, ex, quiet, worker_id="w1") == "stopped_empty"
    run = await schedules.get_run(svc, quiet)
    assert [s["status"] for s in run["steps"]] == [
        "succeeded",
        "stopped_empty",
        "skipped",
        "skipped",
    ]  # type: ignore[index]
    # fired 2026-01-06 09:00 Shanghai: three refunds on 2026-01-05 are purged, inside the chain
    busy = await _run_at(svc, sid, 1767661200.0)
    assert await run_chain(svc, ex, busy, worker_id="w1") == "succeeded"
    run = await schedules.get_run(svc, busy)
    assert run["steps"][2]["output"]["deleted"] == 3  # type: ignore[index]
    msgs = await list_messages(svc.sessionmaker, "sched-daily-orders")
    items = msgs["items"] if isinstance(msgs, dict) else msgs
    texts = [m["text"] for m in items]
    assert any("nothing to report" in t for t in texts)
    assert "daily-orders: Deleted 3 rows from orders." in texts


@pytest.mark.slow
async def test_async_skills_run_inline_in_a_chain(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    svc, ex = env
    root = tmp_path / "more"
    write_skill(
        root,
        "bg_job",
        "async def execute(input_data, ctx):\n    return {'ran': 'inline'}\n",
        frontmatter="async: true\n",
    )
    from jobs.catalog.loader import load_skill

    svc.registry.add(load_skill(root / "bg_job"))
    assert svc.registry.get("bg_job").is_async  # type: ignore[union-attr]
    run_id = await start_run(svc, chain({"skill": "bg_job"}))
    assert await run_chain(svc, ex, run_id, worker_id="w1") == "succeeded"
    run = await schedules.get_run(svc, run_id)
    assert run["steps"][0]["output"]["ran"] == "inline"  # type: ignore[index]


@pytest.mark.slow
async def test_outcome_to_a_person_and_to_a_notify_alias(  # type: ignore[no-untyped-def]
    tmp_path, sqlite_url, redis, redis_server_url, redis_prefix, skills_dir
) -> None:
    from tests.fakes.sink import FakeSink
    from tests.fakes.telegram import FakeTelegram

    with FakeTelegram() as tg, FakeSink() as sink:
        settings = make_settings(
            tmp_path,
            redis_url=redis_server_url,
            prefix=redis_prefix,
            database_url=sqlite_url,
            telegram_bot_token=tg.token,
            telegram_api_base=tg.url,
            notify_targets=json.dumps({"ops": [f"json://127.0.0.1:{sink.port}/ops"]}),
            fetch_allow_hosts="127.0.0.1",  # the loopback sink passes the outbound policy
        )
        svc = make_services(
            settings,
            redis,
            extra_skills=skills_dir,
        )
        ex = Executor(
            settings=svc.settings,
            registry=svc.registry,
            sessionmaker=svc.sessionmaker,
            box=svc.box,
            http=svc.http,
        )
        try:
            to_person = await start_run(
                svc,
                chain(
                    {"skill": "echo", "input": {"message": "3 refunds purged"}},
                    deliver={"to": "telegram:1001"},
                ),
            )
            assert await run_chain(svc, ex, to_person, worker_id="w1") == "succeeded"
            assert [m.get("text") for m in tg.sent] == ["3 refunds purged"]
            run = await schedules.get_run(svc, to_person)
            assert run["result"]["delivery"] == {
                "recipient": "telegram:1001",
                "kind": "text",
                "status": "sent",
                "error": None,
            }  # type: ignore[index]

            to_ops = await start_run(
                svc,
                chain(
                    {"id": "boom", "skill": "fail_step"},
                    deliver={"target": "ops", "title": "nightly"},
                ),
            )
            assert await run_chain(svc, ex, to_ops, worker_id="w1") == "failed"
            (call,) = sink.calls("/ops")
            assert call.json["title"] == "nightly"
            assert (
                "did not complete" in call.json["message"]
                and "upstream said no" in call.json["message"]
            )
            assert "Traceback" not in call.json["message"]

            unknown = await start_run(
                svc,
                chain({"skill": "echo", "input": {"message": "x"}}, deliver={"to": "telegram:555"}),
            )
            assert await run_chain(svc, ex, unknown, worker_id="w1") == "succeeded"
            run = await schedules.get_run(svc, unknown)
            assert run["result"]["delivery"]["status"] == "failed"  # type: ignore[index]
            assert "chat not found" in run["result"]["delivery"]["error"]  # type: ignore[index]
        finally:
            await ex.aclose()
            await close_services(svc)


@pytest.mark.slow
async def test_a_step_printing_nul_and_bad_bytes_is_stored(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """NUL and undecodable bytes in a step's output (and so in the next step's input and the
    run's result) are escaped where they are written, on both backends: the chain ends."""
    svc, ex = env
    run_id = await start_run(
        svc,
        chain(
            {"id": "dirty", "skill": "poison_out"},
            {"id": "echo", "skill": "echo", "passthrough": True},
        ),
    )
    status = await run_chain(svc, ex, run_id, worker_id="w1")
    got = await schedules.get_run(svc, run_id)
    assert got is not None and status == got["status"] == "succeeded", got["error"]
    stored = json.dumps([got["steps"], got["result"]], ensure_ascii=False)
    assert "\\u0000" not in stored and "\\\\x00" in stored  # no NUL; NUL escaped
    assert "weird" in json.dumps(svc.box.unseal(got["steps"][1]["output"]), ensure_ascii=False)
