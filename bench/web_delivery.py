"""Web-session delivery throughput: text results stored on chat sessions and pushed live.

Run: ``.venv/bin/python -m bench.web_delivery [--pg URL] [--redis URL] [--n 10000]
[--concurrency 64]``. Creates a throw-away PostgreSQL database (dropped afterwards) and uses
a unique Redis key prefix. Two cases, each over ``n`` results spread over 100 sessions:

* ``post_message`` — store the message + publish it (what the web channel does per item);
* ``deliver_result`` — the whole delivery of a finished job: ledger claim, fence check,
  store + publish, mark sent.

A pattern subscriber counts the live pushes; a case only counts when every message was
both stored and received. Budget: ≥ 1,000 messages/s.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time
import uuid
from typing import Any

import httpx
import redis.asyncio as aioredis
from sqlalchemy import func, insert, select
from sqlalchemy.engine import make_url

from delivery.channels.web import MessageBatcher, Outgoing, ensure_session, post_message
from delivery.router import deliver_result
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.migrate import upgrade
from jobs.models import Job, SessionMessage
from jobs.services import Services
from jobs.settings import Settings
from jobs.skill import SkillRegistry

SESSIONS = 100


async def _admin(url: str, sql: str) -> None:
    import asyncpg

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _counter(
    redis_url: str, pattern: str, ready: asyncio.Event, counts: dict[str, int], done: asyncio.Event
) -> None:
    client = aioredis.from_url(redis_url)
    ps = client.pubsub()
    await ps.psubscribe(pattern)
    ready.set()
    try:
        while True:
            msg = await ps.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if msg is not None and msg["type"] == "pmessage":
                counts["received"] += 1
                if counts["received"] >= counts["expected"]:
                    done.set()
    finally:
        await ps.aclose()
        await client.aclose()


async def _run_case(name: str, n: int, concurrency: int, one, redis_url: str, settings: Settings):
    counts = {"received": 0, "expected": n}
    ready, done = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(
        _counter(redis_url, settings.key("session", "*"), ready, counts, done)
    )
    await ready.wait()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    stored_s = time.perf_counter() - t0
    try:
        await asyncio.wait_for(done.wait(), 30)
    except TimeoutError:
        pass  # reported: received < n
    pushed_s = time.perf_counter() - t0
    listener.cancel()
    await asyncio.gather(listener, return_exceptions=True)
    return {
        "case": name,
        "n": n,
        "stored_s": stored_s,
        "pushed_s": pushed_s,
        "received": counts["received"],
        "rate": n / pushed_s,
    }


async def main(pg: str, redis_url: str, n: int, concurrency: int) -> list[dict[str, Any]]:
    name = f"skilljobs_bench_web_{uuid.uuid4().hex[:8]}"
    await _admin(pg, f'CREATE DATABASE "{name}"')
    url = make_url(pg).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=url,
        redis_url=redis_url,
        redis_prefix=prefix,
        secret_key="t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q=",
    )
    redis = aioredis.from_url(redis_url, max_connections=concurrency * 2)
    out: list[dict[str, Any]] = []
    try:
        await upgrade(engine)
        sm = create_sessionmaker(engine)
        for i in range(SESSIONS):
            await ensure_session(sm, f"sess-{i}", "r1", "o1", "web", "")

        async def direct(i: int) -> None:
            await post_message(sm, redis, settings, f"sess-{i % SESSIONS}", f"result {i}", [])

        out.append(await _run_case("post_message", n, concurrency, direct, redis_url, settings))
        batcher = MessageBatcher(sm, redis, settings)

        async def batched(i: int) -> None:
            await batcher.post(Outgoing(f"sess-{i % SESSIONS}", f"batched {i}"))

        out.append(
            await _run_case("web channel (batched)", n, concurrency, batched, redis_url, settings)
        )

        ids = [uuid.uuid4().hex for _ in range(n)]
        async with sm() as s:
            await s.execute(
                insert(Job),
                [
                    {
                        "id": ids[i],
                        "skill": "report",
                        "status": "running",
                        "channel": "web",
                        "session_id": f"sess-{i % SESSIONS}",
                        "role_id": "r1",
                        "lease_owner": "bench",
                        "lease_token": 1,
                    }
                    for i in range(n)
                ],
            )
            await s.commit()
        jobs = await _all_jobs(sm)
        svc = Services(
            settings=settings,
            engine=engine,
            sessionmaker=sm,
            box=SecretBox(b"t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="),
            registry=SkillRegistry(),
            redis=redis,
            http=httpx.AsyncClient(),
        )

        async def always() -> bool:
            return True

        async def full(i: int) -> None:
            res = await deliver_result(svc, jobs[i], {"message": f"report {i}"}, [], fence=always)
            if res[0]["status"] != "sent":
                raise RuntimeError(res)

        out.append(await _run_case("deliver_result", n, concurrency, full, redis_url, settings))
        await svc.http.aclose()
        async with sm() as s:
            stored = (await s.execute(select(func.count()).select_from(SessionMessage))).scalar()
        if stored != 3 * n:
            raise RuntimeError(f"expected {3 * n} stored messages, found {stored}")
    finally:
        await redis.aclose()
        await engine.dispose()
        await _admin(pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return out


async def _all_jobs(sm: Any) -> list[Job]:
    async with sm() as s:
        rows = (await s.execute(select(Job).order_by(Job.created_at, Job.id))).scalars().all()
    return list(rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pg", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    results = asyncio.run(main(args.pg, args.redis, args.n, args.concurrency))
    print(
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"concurrency {args.concurrency}"
    )
    print("| case | messages | stored in | stored + pushed in | pushed received | msg/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['case']} | {r['n']:,} | {r['stored_s']:.2f} s | {r['pushed_s']:.2f} s | "
            f"{r['received']:,} | {r['rate']:,.0f} |"
        )
