"""300 results finishing at once to 10 Telegram chats from 3 real ``skilljobs worker``
processes, against the fake Telegram enforcing its published flood limits (1 message/s per
chat, 30/s per bot; beyond them it answers 429 with ``retry_after``): no 429, every message
delivered exactly once, each long result's parts together and in order in its chat, and
every delivery ``sent`` with the platform's message id."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from jobs.models import Delivery, Job
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services
from tests.helpers.settings import make_settings
from tests.helpers.workers import WorkerProcess

pytestmark = pytest.mark.slow

SKILLS = Path(__file__).parent / "outbox_skills"
CHATS = [f"70{i:02d}" for i in range(10)]
RESULTS = 300
LONG_EVERY = 10  # one result in ten is longer than a Telegram message: two parts


def _text(n: int) -> str:
    head = f"{CHATS[n % len(CHATS)]} r{n:03d}"
    if n % LONG_EVERY:
        return head
    filler = "x" * 3000
    return f"{head} part one {filler}\n\n{head} part two {filler}"


async def _count(svc: Services, *where: Any) -> int:
    async with svc.sessionmaker() as s:
        return int(await s.scalar(select(func.count()).select_from(Delivery).where(*where)) or 0)


@pytest.mark.timeout(420)
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
        skills_path=str(SKILLS),
        worker_lease_sec=10.0,
        worker_heartbeat_sec=1.0,
        reconcile_interval_sec=1.0,
        reconcile_stale_sec=5.0,
    )
    svc = await Services.open(settings)
    env = {"SKILLJOBS_TELEGRAM_BOT_TOKEN": tg.token, "SKILLJOBS_TELEGRAM_API_BASE": tg.url}
    workers: list[WorkerProcess] = []
    try:
        d = Dispatcher(svc)
        for n in range(RESULTS):
            chat = CHATS[n % len(CHATS)]
            ctx = {"channel": "telegram", "actor_key": chat, "role_id": "r1", "org_id": "o1"}
            res = await d.dispatch("say", {"text": _text(n)}, {**ctx, "session_id": f"s{n}"})
            assert res.status_code == 202, res.body
        # all queued before any worker starts: the results finish together
        workers = [WorkerProcess(settings, tmp_path / f"w{i}.log", **env) for i in range(3)]
        started = time.monotonic()
        deadline = time.monotonic() + 330
        while time.monotonic() < deadline:
            if await _count(svc, Delivery.status == "sent") >= RESULTS:
                print(f"all {RESULTS} results delivered in {time.monotonic() - started:.1f} s")
                break
            await asyncio.sleep(0.5)
        async with svc.sessionmaker() as s:
            jobs = Counter((await s.scalars(select(Job.status))).all())
            rows = (await s.scalars(select(Delivery))).all()
    finally:
        for w in workers:
            w.stop()
        await svc.close()
    logs = "\n".join(
        line
        for w in workers
        for line in w.log.read_text(errors="replace").splitlines()
        if " ERROR " in line or "outbox" in line
    )[-3000:]
    assert jobs == {"succeeded": RESULTS}, (jobs, logs)
    statuses = Counter(r.status for r in rows)
    assert statuses == {"sent": RESULTS}, (statuses, [r.error for r in rows if r.error][:5], logs)
    assert all(r.message_id and r.verified for r in rows)
    assert tg.too_many == 0  # the shared buckets kept every worker under the limits
    # every message exactly once
    long_results = RESULTS // LONG_EVERY
    assert len(tg.sent) == RESULTS + long_results
    for n in range(RESULTS):
        chat = CHATS[n % len(CHATS)]
        head = f"{chat} r{n:03d}"
        stream = [m["text"] for m in tg.sent if m["chat_id"] == chat]
        mine = [i for i, t in enumerate(stream) if t.startswith(head)]
        if n % LONG_EVERY:
            assert len(mine) == 1, head
        else:  # the two parts, one right after the other
            assert len(mine) == 2 and mine[1] == mine[0] + 1, (head, mine)
            assert "part one" in stream[mine[0]] and "part two" in stream[mine[1]]
