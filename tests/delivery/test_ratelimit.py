"""Outbound rate limits shared by every worker (token buckets in Redis): several limiters
(as several workers) never overdraw a bucket, a 429's retry_after pauses the chat for all
of them, and results sent from three "workers" at once to a fake Telegram that enforces
1/s per chat and 30/s per bot meet no 429 and arrive in order."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from delivery.channels.limits import Target
from delivery.channels.telegram import TelegramChannel
from delivery.ratelimit import RateLimiter, load_limits, parse_rate
from tests.helpers.settings import make_settings


def test_parse_and_override() -> None:
    assert parse_rate("30/s") == (30, 1) and parse_rate("20/min") == (20, 60)
    assert parse_rate([2, 0.5]) == (2, 0.5) and parse_rate(0) is None
    limits = load_limits(json.dumps({"telegram": {"chat": "2/s", "group": 0}}))
    assert limits["telegram"]["chat"] == (2, 1) and limits["telegram"]["group"] is None
    assert limits["telegram"]["bot"] == (30, 1)  # the default stays
    with pytest.raises(ValueError):
        load_limits('{"telegram": {"chat": "fast"}}')
    bad = RateLimiter.from_settings(None, type("S", (), {"rate_limits": "{not json"})())
    assert bad.limits["telegram"]["chat"] == (1, 1)  # the defaults, not no limits


@pytest.fixture
async def limiters(tmp_path: Path, redis_server_url: str, redis_prefix: str):
    """Three limiters on three Redis connections, as three workers would have."""
    rates = json.dumps({"telegram": {"bot": [30, 1], "chat": [2, 0.2]}})
    settings = make_settings(
        tmp_path, redis_url=redis_server_url, prefix=redis_prefix, rate_limits=rates
    )
    clients = [aioredis.from_url(redis_server_url) for _ in range(3)]
    yield settings, [RateLimiter.from_settings(c, settings) for c in clients]
    keys = [k async for k in clients[0].scan_iter(count=1000, match=f"{redis_prefix}*")]
    if keys:
        await clients[0].delete(*keys)
    for c in clients:
        await c.aclose()


@pytest.mark.slow
async def test_buckets_are_shared_by_all_limiters(limiters) -> None:
    _, workers = limiters
    stamps: list[float] = []
    t0 = time.monotonic()

    async def send(limiter: RateLimiter) -> None:
        for _ in range(4):
            await limiter.acquire("telegram", Target("1001"))
            stamps.append(time.monotonic() - t0)

    await asyncio.gather(*(send(w) for w in workers))
    stamps.sort()
    # capacity 2, then 10 per second: 12 sends need at least (12 - 2) / 10 = 1 s
    assert stamps[-1] >= 0.9
    for i, t in enumerate(stamps):  # never ahead of the bucket
        assert i + 1 <= 2 + 10 * t + 1, (i, t)


@pytest.mark.slow
async def test_a_pause_holds_every_worker(limiters) -> None:
    _, (a, b, _) = limiters
    await a.pause("telegram", Target("1002"), 2.0)
    t0 = time.monotonic()
    await b.acquire("telegram", Target("1003"))  # other chats are not paused
    assert time.monotonic() - t0 < 1.0
    await b.acquire("telegram", Target("1002"))
    assert time.monotonic() - t0 >= 1.8


@pytest.mark.slow
async def test_many_results_at_once_meet_no_429(
    tmp_path: Path, redis_server_url: str, redis_prefix: str, tg
) -> None:
    """60 messages to 10 chats from 3 workers: the fake answers 429 beyond 1/s per chat and
    30/s per bot; with the shared default limits it never has to, and each chat's messages
    arrive in order."""
    tg.enforce_rates = True
    chats = [f"30{i:02d}" for i in range(10)]
    tg.known_chats.update(chats)
    settings = make_settings(tmp_path, redis_url=redis_server_url, prefix=redis_prefix)
    clients = [aioredis.from_url(redis_server_url) for _ in range(3)]
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            adapters = []
            for c in clients:
                ch = TelegramChannel(http, tg.token, api_base=tg.url)
                ch.limiter = RateLimiter.from_settings(c, settings)
                adapters.append(ch)

            async def worker(w: int) -> None:
                for n in range(2):
                    await asyncio.gather(
                        *(adapters[w].send_text(chat, f"{chat} w{w} n{n}") for chat in chats)
                    )

            t0 = time.monotonic()
            await asyncio.gather(*(worker(w) for w in range(3)))
            elapsed = time.monotonic() - t0
    finally:
        keys = [k async for k in clients[0].scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await clients[0].delete(*keys)
        for c in clients:
            await c.aclose()
    assert tg.too_many == 0
    assert len(tg.sent) == 60
    assert elapsed >= 4.5  # 6 per chat at 1/s: the limits were kept, not luck
    for chat in chats:
        mine = [m["text"] for m in tg.sent if m["chat_id"] == chat]
        assert len(mine) == 6
        for w in range(3):  # each worker's messages to a chat keep their order
            seq = [t for t in mine if f" w{w} " in t]
            assert seq == [f"{chat} w{w} n0", f"{chat} w{w} n1"]
