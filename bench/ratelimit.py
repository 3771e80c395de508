"""Overhead of the shared outbound rate limiter (``python -m bench.ratelimit``).

Budget: ≤ 1 ms per message. Each message takes a token from its bot and chat buckets in one
Redis script call, and its answer restarts the chat bucket's clock in another; here the buckets are large enough never to make anyone wait, so what is
measured is the limiter's own cost: 1,000 acquisitions spread over 10 chats from 3
concurrent limiters (one Redis connection each, as three workers), against the Redis at
``SKILLJOBS_BENCH_REDIS_URL``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from types import SimpleNamespace

import redis.asyncio as aioredis

from bench.common import REDIS, pct
from delivery.channels.limits import Target
from delivery.ratelimit import RateLimiter, load_limits

MESSAGES = 1000
CHATS = 10
WORKERS = 3


async def _pass(limiters: list[RateLimiter], settle: bool) -> tuple[list[float], float, float]:
    times: list[float] = []

    async def worker(w: int) -> None:
        for n in range(w, MESSAGES, WORKERS):
            t0 = time.perf_counter()
            target = Target(f"40{n % CHATS:02d}")
            await limiters[w].acquire("telegram", target)
            if settle:  # the answer restarts the chat bucket's clock
                await limiters[w].settle("telegram", target)
            times.append((time.perf_counter() - t0) * 1000)

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(w) for w in range(WORKERS)))
    return times, time.perf_counter() - t0, time.process_time() - c0


async def main(rounds: int = 3) -> None:
    """Acquire alone and acquire + settle (what each message costs now), interleaved."""
    prefix = f"bench-rl-{uuid.uuid4().hex[:8]}"
    settings = SimpleNamespace(key=lambda *parts: ":".join((prefix, *parts)))
    limits = load_limits(json.dumps({"telegram": {"bot": "100000/s", "chat": "100000/s"}}))
    clients = [aioredis.from_url(REDIS) for _ in range(WORKERS)]
    limiters = [RateLimiter(c, settings, limits) for c in clients]
    for lim in limiters:  # load the scripts once (as a worker does at its first send)
        await lim.acquire("telegram", Target("warm-up"))
        await lim.settle("telegram", Target("warm-up"))
    found: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, float] = {False: 0.0, True: 0.0}
    for _ in range(rounds):
        for settle in (False, True):
            times, _wall, used = await _pass(limiters, settle)
            found[settle] += times
            cpu[settle] += used
    keys = [k async for k in clients[0].scan_iter(match=f"{prefix}*")]
    if keys:
        await clients[0].delete(*keys)
    for c in clients:
        await c.aclose()
    for settle, times in found.items():
        mean = sum(times) / len(times)
        what = "acquire + settle" if settle else "acquire alone   "
        print(
            f"{what}: {len(times)} messages, {WORKERS} limiters, {CHATS} chats: mean "
            f"{mean:.3f} ms, p50 {pct(times, 50):.3f} ms, p99 {pct(times, 99):.3f} ms; "
            f"budget 1 ms: {'ok' if mean <= 1.0 else 'OVER'}; the sender's CPU "
            f"{1000 * cpu[settle] / len(times):.3f} ms per message"
        )
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


async def throughput(messages: int = MESSAGES) -> None:
    """``--throughput``: ``messages`` to 10 chats from 3 limiters (as 3 workers) against the
    fake Telegram enforcing 1/s per chat and 30/s per bot; total time against the
    limit-implied minimum (messages / 10 chats at 1/s), and the 429s it had to answer."""
    import httpx

    from delivery.channels.telegram import TelegramChannel
    from tests.fakes.telegram import FakeTelegram

    prefix = f"bench-rl-{uuid.uuid4().hex[:8]}"
    settings = SimpleNamespace(key=lambda *parts: ":".join((prefix, *parts)))
    limits = load_limits("")
    chats = [f"50{i:02d}" for i in range(CHATS)]
    clients = [aioredis.from_url(REDIS) for _ in range(WORKERS)]
    with FakeTelegram() as tg:
        tg.enforce_rates = True
        tg.known_chats.update(chats)
        async with httpx.AsyncClient(timeout=30) as http:
            adapters = []
            for c in clients:
                ch = TelegramChannel(http, tg.token, api_base=tg.url)
                ch.limiter = RateLimiter(c, settings, limits)
                adapters.append(ch)

            async def worker(w: int) -> None:
                mine = list(range(w, messages, WORKERS))
                await asyncio.gather(
                    *(adapters[w].send_text(chats[n % CHATS], f"m{n}") for n in mine)
                )

            t0 = time.perf_counter()
            await asyncio.gather(*(worker(w) for w in range(WORKERS)))
            wall = time.perf_counter() - t0
        sent, too_many = len(tg.sent), tg.too_many
    for c in clients:
        await c.aclose()
    floor = messages / CHATS  # 1 message/s in each chat
    print(
        f"{sent}/{messages} messages to {CHATS} chats from {WORKERS} limiters: {wall:.1f} s "
        f"(limit-implied minimum {floor - 1:.0f} s, {100 * (wall / (floor - 1) - 1):+.1f} %), "
        f"429s: {too_many}"
    )


if __name__ == "__main__":
    import sys

    if "--throughput" in sys.argv:
        asyncio.run(throughput())
    else:
        asyncio.run(main())
