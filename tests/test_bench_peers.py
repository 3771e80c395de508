"""The peer drivers of ``python -m bench.queue --peers`` (bench/peers.py) against the test
Redis: each drains every job it enqueued and leaves no key behind. Skipped without the
``bench`` extra (SAQ, taskiq-redis, streaQ)."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("saq")
pytest.importorskip("taskiq_redis")
pytest.importorskip("streaq")

from bench import peers  # only with the bench extra installed

pytestmark = pytest.mark.redis_server
N = 20


async def _redis_version(url: str) -> tuple[int, ...]:
    from redis import asyncio as aioredis

    r = aioredis.from_url(url)
    try:
        info = await r.info("server")
    finally:
        await r.aclose()
    return tuple(int(p) for p in str(info["redis_version"]).split("."))


@pytest.mark.parametrize("shape", peers.SHAPES)
@pytest.mark.parametrize("lib", list(peers.PEERS))
async def test_peer_drains_and_cleans_up(lib: str, shape: str, redis_server_url: str) -> None:
    from redis import asyncio as aioredis

    if lib == "streaq" and await _redis_version(redis_server_url) < (7,):
        pytest.skip("streaQ loads a Redis function library: Redis 7+")
    name = f"sjt-peer-{lib}-{uuid.uuid4().hex[:8]}"
    drain = peers.PEERS[lib]

    rate = await drain(N, shape, redis_server_url, name)

    assert rate > 0
    assert rate.cpu_us > 0
    if shape == "sleep100":  # every job really slept its 100 ms: N jobs take ≥ 0.1 s
        assert rate <= N / 0.1
    r = aioredis.from_url(redis_server_url)
    try:
        left = [k async for k in r.scan_iter(match=f"*{name}*")]
    finally:
        await r.aclose()
    assert left == []
