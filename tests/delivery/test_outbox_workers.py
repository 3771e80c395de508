"""300 results finishing at once to 10 Telegram chats from 3 real ``skilljobs worker``
processes, against the fake Telegram enforcing its published flood limits (1 message/s per
chat, 30/s per bot; beyond them it answers 429 with ``retry_after``): no 429, every message
delivered exactly once, a result's items in order in its chat (a chart, then its CSV,
whichever workers send them), and every delivery ``sent`` with the platform's message id."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from jobs.models import Delivery, Job
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services
from tests.helpers.settings import FAKE_SKILLS, OWN_HANDLERS, make_settings
from tests.helpers.workers import WorkerProcess

pytestmark = pytest.mark.slow

SKILLS = Path(__file__).parent / "outbox_skills"
CHATS = [f"70{i:02d}" for i in range(10)]
RESULTS = 300
FILES_EVERY = 10  # one result in ten is a chart and a CSV (two messages)
MESSAGES = RESULTS + RESULTS // FILES_EVERY


def _lines_about(log: str, ids: list[str]) -> str:
    """The log lines naming one of ``ids``, each with the traceback that follows it."""
    out: list[str] = []
    keep = False
    for line in log.splitlines():
        if line[:4].isdigit():  # a new record: "2026-…"
            keep = any(j in line for j in ids)
        if keep:
            out.append(line)
    return "\n".join(out)


async def _count(svc: Services, *where: Any) -> int:
    async with svc.sessionmaker() as s:
        return int(await s.scalar(select(func.count()).select_from(Delivery).where(*where)) or 0)


@pytest.mark.timeout(420)
@pytest.mark.slow
async def test_300_results_3_workers_meet_the_flood_limits(
    tmp_path: Path, pg_url: str, redis_server_url: str, redis_prefix: str, tg: Any
) -> None:
    tg.enforce_rates = True
    tg.known_chats.update(CHATS)
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=pg_url,
        skills_path=os.pathsep.join([str(SKILLS), str(FAKE_SKILLS)]),
        # the results come from trusted handlers inside the workers: this test is about the
        # flood limits, and 300 sandboxed skill processes would cost the 2-core host more
        # than all the sending (they are tested in their own files)
        trusted_skills=os.pathsep.join(
            [OWN_HANDLERS, str(SKILLS / "say_inline"), str(FAKE_SKILLS / "two_files")]
        ),
        # a shared 2-core host can starve the workers' loops for seconds at a time; this
        # test is about the flood limits, not take-over, so a worker is presumed dead only
        # after 16 s silent
        worker_lease_sec=40.0,
        worker_heartbeat_sec=5.0,
        reconcile_interval_sec=1.0,
        reconcile_stale_sec=5.0,
    )
    svc = await Services.open(settings)
    env = {"SKILLJOBS_TELEGRAM_BOT_TOKEN": tg.token, "SKILLJOBS_TELEGRAM_API_BASE": tg.url}
    workers: list[WorkerProcess] = []
    try:
        d = Dispatcher(svc)
        ids: list[str] = []
        two_files: set[str] = set()
        for n in range(RESULTS):
            chat = CHATS[n % len(CHATS)]
            ctx = {"channel": "telegram", "actor_key": chat, "role_id": "r1", "org_id": "o1"}
            ctx["session_id"] = f"s{n}"
            if (n // len(CHATS)) % FILES_EVERY != n % len(CHATS):  # 3 in each chat
                res = await d.dispatch("say_inline", {"text": f"{chat} r{n:03d}"}, ctx)
            else:
                res = await d.dispatch("two_files", {}, ctx)
                two_files.add(res.body["job_id"])
            assert res.status_code == 202, res.body
            ids.append(res.body["job_id"])
        # all queued before any worker starts: the results finish together
        workers = [WorkerProcess(settings, tmp_path / f"w{i}.log", **env) for i in range(3)]
        started = time.monotonic()
        deadline = time.monotonic() + 360
        while time.monotonic() < deadline:
            if await _count(svc, Delivery.status == "sent") >= MESSAGES:
                print(f"all {RESULTS} results delivered in {time.monotonic() - started:.1f} s")
                break
            await asyncio.sleep(0.5)
        async with svc.sessionmaker() as s:
            jobs = Counter((await s.scalars(select(Job.status))).all())
            errors = Counter(
                (await s.scalars(select(Job.error).where(Job.error.is_not(None)))).all()
            )
            rows = (await s.scalars(select(Delivery))).all()
    finally:
        for w in workers:
            w.stop()
        await svc.close()
    logs = "\n".join(
        line
        for w in workers
        for line in w.log.read_text(errors="replace").splitlines()
        if " ERROR " in line or "outbox" in line or "429" in line
    )[-3000:]
    assert jobs == {"succeeded": RESULTS}, (jobs, errors.most_common(3))
    per_job = Counter(str(r.job_id) for r in rows)
    short = [j for j, k in per_job.items() if k < (2 if j in two_files else 1)]
    short += [j for j in ids if j not in per_job]
    about = "\n".join(_lines_about(w.log.read_text(errors="replace"), short) for w in workers)
    assert not short, (short, about[-6000:])
    statuses = Counter(r.status for r in rows)
    assert statuses == {"sent": MESSAGES}, (statuses, [r.error for r in rows if r.error][:5], logs)
    assert all(r.message_id and r.verified for r in rows)
    assert tg.too_many == 0, logs  # the shared buckets kept every worker under the limits
    # every message exactly once, each where it belongs
    assert len(tg.sent) == MESSAGES
    assert len({m["message_id"] for m in tg.sent}) == MESSAGES
    texts = Counter(m.get("text") for m in tg.sent if m["method"] == "sendMessage")
    assert len(texts) == RESULTS - RESULTS // FILES_EVERY and set(texts.values()) == {1}
    for m in tg.sent:
        if m["method"] == "sendMessage":
            assert m["text"].startswith(m["chat_id"])
    # a result's items in order: the fake numbers messages in the order it received them
    by_job: dict[str, dict[str, int]] = {}
    for r in rows:
        by_job.setdefault(str(r.job_id), {})[r.kind] = int(str(r.message_id))
    pairs = [kinds for kinds in by_job.values() if len(kinds) == 2]
    assert len(pairs) == RESULTS // FILES_EVERY
    assert all(k["image"] < k["file"] for k in pairs), pairs
