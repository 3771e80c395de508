"""Results through the shared rate limits end to end (``python -m bench.outbox``).

``n`` (1,000) results finishing at once for 10 Telegram chats, run and delivered by 3 real
``skilljobs worker`` processes against the fake Telegram enforcing its published flood
limits (1 message/s per chat, 30/s per bot; 429 beyond them): the time from the workers'
start until every message is delivered, against the limit-implied minimum (n / 10 - 1 s),
and the 429s, lost and repeated messages. Also: the time from the first message the fake
received to the last (the workers' start-up left out), the gaps between consecutive messages
in one chat as the fake received them (the limit is 1 s: what is above it is ours), the
workers' CPU time, and the load average. A throw-away PostgreSQL database and a unique
Redis prefix; ``--n`` to change the count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import resource
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from sqlalchemy import func, select

from bench.common import REDIS, drop_db, make_db, pct
from jobs.models import Delivery
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services
from jobs.settings import Settings
from tests.fakes.telegram import FakeTelegram
from tests.helpers.workers import WorkerProcess

CHATS = [f"80{i:02d}" for i in range(10)]
SKILLS = Path(__file__).parent / "skills"


async def run(n: int, max_jobs: int | None = None) -> list[tuple[float, str, str]]:
    """Run it, print the figures; each message's arrival (s from the start), chat, text."""
    url, name = await make_db()
    folder = Path(tempfile.mkdtemp(prefix="bench-outbox-"))
    from cryptography.fernet import Fernet

    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        secret_key=Fernet.generate_key().decode(),
        database_url=url,
        redis_url=REDIS,
        redis_prefix=f"bench-ob-{uuid.uuid4().hex[:8]}",
        queue_name=f"bench-ob-{uuid.uuid4().hex[:8]}",
        skills_path=f"trusted={SKILLS}",  # the harness's own skills: the outbox is measured
        data_dir=str(folder),
        # the workers' lease and heartbeat are the defaults (30 s, 2.5 s): with 1 s / 10 s
        # the loaded host's stalls at the start (each worker takes 100 jobs at once) made
        # workers look dead and their jobs run twice
    )
    workers: list[WorkerProcess] = []
    with FakeTelegram() as tg:
        tg.enforce_rates = True
        tg.known_chats.update(CHATS)
        svc = await Services.open(settings)
        try:
            d = Dispatcher(svc)
            for i in range(n):
                chat = CHATS[i % len(CHATS)]
                ctx = {"channel": "telegram", "actor_key": chat, "role_id": "r1", "org_id": "o1"}
                await d.dispatch("echo_text", {"text": f"{chat} m{i}"}, ctx)
            env = {"SKILLJOBS_TELEGRAM_BOT_TOKEN": tg.token, "SKILLJOBS_TELEGRAM_API_BASE": tg.url}
            if max_jobs is not None:  # jobs one worker runs at once (default 100)
                env["SKILLJOBS_WORKER_MAX_JOBS"] = str(max_jobs)
            t0 = time.monotonic()
            started = time.time()
            workers = [WorkerProcess(settings, folder / f"w{i}.log", **env) for i in range(3)]
            while time.monotonic() - t0 < 3 * n / len(CHATS) + 120:
                async with svc.sessionmaker() as s:
                    done = await s.scalar(
                        select(func.count()).select_from(Delivery).where(Delivery.status == "sent")
                    )
                if (done or 0) >= n:
                    break
                await asyncio.sleep(0.2)
            wall = time.monotonic() - t0
            async with svc.sessionmaker() as s:
                statuses = Counter((await s.scalars(select(Delivery.status))).all())
        finally:
            for w in workers:
                w.stop()
            # the workers are this process's only children, reaped by ``stop``
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = used.ru_utime + used.ru_stime
            with contextlib.suppress(Exception):
                keys = [k async for k in svc.redis.scan_iter(match=f"{settings.redis_prefix}*")]
                if keys:
                    await svc.redis.delete(*keys)
            await svc.close()
            await drop_db(name)
        texts = Counter(m["text"] for m in tg.sent)
        arrivals = [m["at"] for m in tg.sent]
        got = [(m["at"] - started, str(m["chat_id"]), str(m.get("text"))) for m in tg.sent]
        gaps: list[float] = []
        for chat in CHATS:
            times = [m["at"] for m in tg.sent if m["chat_id"] == chat]
            gaps += [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    floor = n / len(CHATS) - 1  # 1 message/s in each chat, the first at once
    repeated = sum(c - 1 for c in texts.values() if c > 1)
    lost = n - len(texts)
    print(
        f"{n} results, 10 chats, 3 worker processes: all delivered in {wall:.1f} s "
        f"(limit-implied minimum {floor:.0f} s, {100 * (wall / floor - 1):+.1f} %); "
        f"429s {tg.too_many}, lost {lost}, repeated {repeated}; ledger {dict(statuses)}"
    )
    if arrivals and gaps:
        span = max(arrivals) - min(arrivals)
        print(
            f"  the first message reached the platform {min(arrivals) - started:.1f} s "
            "after the start"
        )
        print(
            f"  first to last message at the platform: {span:.1f} s "
            f"({100 * (span / floor - 1):+.1f} %); gaps in a chat: mean "
            f"{sum(gaps) / len(gaps):.0f} ms, p50 {pct(gaps, 50):.0f} ms, p90 "
            f"{pct(gaps, 90):.0f} ms, p99 {pct(gaps, 99):.0f} ms; workers' CPU {cpu:.1f} s; "
            f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
        )
    return got


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--max-jobs", type=int, help="SKILLJOBS_WORKER_MAX_JOBS of the workers")
    p.add_argument("--dump", help="write each message's arrival (s), chat and text as JSON")
    args = p.parse_args()
    got = asyncio.run(run(args.n, args.max_jobs))
    if args.dump:  # each message as the platform received it, for a closer look
        Path(args.dump).write_text(json.dumps(got))
