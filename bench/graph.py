"""Chains as graphs: a ``for_each`` step fanned out over 1,000 items, through a real worker.

Run: ``.venv/bin/python -m bench.graph [--items 1000] [--parallel 4,16] [--sqlite]``. Needs
PostgreSQL and Redis (``SKILLJOBS_BENCH_DATABASE_URL`` / ``SKILLJOBS_BENCH_REDIS_URL``,
defaults on localhost); a throw-away database (or SQLite file) and a unique Redis prefix are
used and removed afterwards.

The chain: ``list`` returns ``--items`` rows; ``each`` (``for_each: $steps.list.rows``, an
in-process skill that doubles a number) runs once per row, each item recorded as its own step
run; ``sum`` (needs ``each``) adds the fan-in list up and is checked. One ``skilljobs
worker`` process runs it, ``policy.max_parallel`` = each value of ``--parallel``. Reported:
run wall time (lease taken → finished), items per second, and the time from the list step's
end to the last item's end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select

from bench.common import REDIS, drop_db, make_db
from chains import schedules
from chains.runs import trigger_manual
from jobs.db import create_engine
from jobs.migrate import upgrade
from jobs.models import ChainRun, ChainStep
from jobs.services import Services
from jobs.settings import Settings

LIST = """
def execute(input_data, ctx):
    return {"rows": [{"n": i} for i in range(int(input_data["n"]))]}
"""
DOUBLE = """
def execute(input_data, ctx):
    return {"double": input_data["n"] * 2}
"""
SUM = """
def execute(input_data, ctx):
    return {"message": f"sum {sum(x['double'] for x in input_data['each'])}",
            "total": sum(x["double"] for x in input_data["each"])}
"""


def _skills(root: Path) -> None:
    for name, body in (("bg_list", LIST), ("bg_double", DOUBLE), ("bg_sum", SUM)):
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: bench\n---\n# {name}\n")
        (folder / "handler.py").write_text(body)


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli.app", "worker", "--no-scheduler"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def _one(
    svc: Services, env: dict[str, str], data: Path, items: int, parallel: int
) -> dict[str, Any]:
    spec = {
        "name": f"fanout-{parallel}-{uuid.uuid4().hex[:6]}",
        "cron": "0 3 1 1 *",
        "identity": {"role_id": "bench", "session_id": "bench-graph"},
        "policy": {"max_parallel": parallel},
        "steps": [
            {"id": "list", "skill": "bg_list", "input": {"n": items}},
            {
                "id": "each",
                "skill": "bg_double",
                "for_each": "$steps.list.rows",
                "max_items": max(items, 1),
                "input": {"n": "$item.n"},
            },
            {"id": "sum", "skill": "bg_sum", "input": {"each": "$steps.each"}},
        ],
    }
    row = await schedules.create(svc, spec)
    proc = _worker(env, data / f"worker-{parallel}.log")
    try:
        await asyncio.sleep(3.0)
        run_id = await trigger_manual(svc, row.id)
        deadline = time.time() + 600
        while time.time() < deadline:
            async with svc.sessionmaker() as s:
                run = await s.get(ChainRun, run_id)
            if run is not None and run.status in ("succeeded", "failed", "stopped_empty"):
                break
            await asyncio.sleep(0.2)
        assert run is not None and run.status == "succeeded", (
            run and run.status,
            run and run.error,
        )
        async with svc.sessionmaker() as s:
            steps = {
                st.idx: st
                for st in (
                    await s.execute(select(ChainStep).where(ChainStep.run_id == run_id))
                ).scalars()
            }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    total = svc.box.unseal(steps[2].output)["total"]
    assert total == items * (items - 1), total
    item_rows = [st for idx, st in steps.items() if idx >= 1_000_000]
    assert len(item_rows) == items and all(st.status == "succeeded" for st in item_rows)
    wall = (run.finished_at or 0) - (run.started_at or 0)
    fan = max(st.finished_at or 0 for st in item_rows) - (steps[0].finished_at or 0)
    return {"parallel": parallel, "wall": wall, "fan": fan, "per_s": items / fan if fan else 0}


async def main(items: int, parallel: list[int], sqlite: bool) -> None:
    from cryptography.fernet import Fernet

    data = Path(tempfile.mkdtemp(prefix="skilljobs-bench-"))
    _skills(data / "skills")
    name = None
    if sqlite:
        url = f"sqlite+aiosqlite:///{data / 'bench.db'}"
        engine = create_engine(url)
        await upgrade(engine)
        await engine.dispose()
    else:
        url, name = await make_db()
    prefix = f"sjbench{uuid.uuid4().hex[:8]}"
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=url,
        redis_url=REDIS,
        data_dir=data,
        redis_prefix=prefix,
        queue_name=f"{prefix}:queue",
        secret_key=Fernet.generate_key().decode(),
        skills_path=str(data / "skills"),
    )
    svc = await Services.open(settings)
    env = {
        **os.environ,
        "SKILLJOBS_DATABASE_URL": url,
        "SKILLJOBS_REDIS_URL": REDIS,
        "SKILLJOBS_REDIS_PREFIX": prefix,
        "SKILLJOBS_QUEUE_NAME": settings.queue_name,
        "SKILLJOBS_DATA_DIR": str(data),
        "SKILLJOBS_SECRET_KEY": settings.secret_key.get_secret_value(),  # type: ignore[union-attr]
        "SKILLJOBS_SKILLS_PATH": str(data / "skills"),
        "SKILLJOBS_LOG_LEVEL": "WARNING",
    }
    try:
        for p in parallel:
            got = await _one(svc, env, data, items, p)
            print(
                f"{'SQLite' if sqlite else 'PostgreSQL'}, {items} items, max_parallel {p}: "
                f"run {got['wall']:.2f} s, fan-out {got['fan']:.2f} s, "
                f"{got['per_s']:.0f} items/s",
                flush=True,
            )
    finally:
        redis = svc.redis
        if redis is not None:
            keys = [k async for k in redis.scan_iter(match=f"{prefix}*")]
            if keys:
                await redis.delete(*keys)
        await svc.close()
        if name:
            await drop_db(name)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--parallel", default="4,16")
    ap.add_argument("--sqlite", action="store_true")
    a = ap.parse_args()
    asyncio.run(main(a.items, [int(x) for x in a.parallel.split(",")], a.sqlite))
