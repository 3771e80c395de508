"""Overhead of the shared outbound rate limiter (``python -m bench.ratelimit``).

Budget: ≤ 1 ms per message. Each message takes a token from its bot and chat buckets in one
Redis script call; here the buckets are large enough never to make anyone wait, so what is
measured is the limiter's own cost: 1,000 acquisitions spread over 10 chats from 3
concurrent limiters (one Redis connection each, as three workers), against the Redis at
``SKILLJOBS_BENCH_REDIS_URL``.
"""

from __future__ import annotations

import asyncio
import json
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


async def main() -> None:
    prefix = f"bench-rl-{uuid.uuid4().hex[:8]}"
    settings = SimpleNamespace(key=lambda *parts: ":".join((prefix, *parts)))
    limits = load_limits(json.dumps({"telegram": {"bot": "100000/s", "chat": "100000/s"}}))
    clients = [aioredis.from_url(REDIS) for _ in range(WORKERS)]
    limiters = [RateLimiter(c, settings, limits) for c in clients]
    times: list[float] = []

    async def worker(w: int) -> None:
        for n in range(w, MESSAGES, WORKERS):
            t0 = time.perf_counter()
            await limiters[w].acquire("telegram", Target(f"40{n % CHATS:02d}"))
            times.append((time.perf_counter() - t0) * 1000)

    for lim in limiters:  # load the script once (as a worker does at its first send)
        await lim.acquire("telegram", Target("warm-up"))
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(WORKERS)))
    wall = time.perf_counter() - t0
    keys = [k async for k in clients[0].scan_iter(match=f"{prefix}*")]
    if keys:
        await clients[0].delete(*keys)
    for c in clients:
        await c.aclose()
    mean = sum(times) / len(times)
    print(f"{len(times)} acquisitions, {WORKERS} limiters, {CHATS} chats, wall {wall:.2f} s")
    print(
        f"per message: mean {mean:.3f} ms, p50 {pct(times, 50):.3f} ms, "
        f"p99 {pct(times, 99):.3f} ms; budget 1 ms: {'ok' if mean <= 1.0 else 'OVER'}"
    )


if __name__ == "__main__":
    asyncio.run(main())
