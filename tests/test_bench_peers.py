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
@pytest.mark.slow
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
        left = [k async for k in r.scan_iter(count=1000, match=f"*{name}*")]
    finally:
        await r.aclose()
    assert left == []


async def test_compare_warms_every_library_up_without_counting_it() -> None:
    """``--warmup``: each library drains that many jobs of each shape once before the
    measured repetitions, and only the repetitions are reported."""
    calls: list[tuple[str, int, str]] = []

    def drain(lib: str) -> peers.Drain:
        async def run(n: int, shape: str) -> float:
            calls.append((lib, n, shape))
            return peers.Rate(n, 1.0 if n == 7 else 2.0, 0.01)

        return run

    out = await peers.compare(drain("ours"), drain("raw"), 100, 50, 2, only=("none",), warmup=7)

    assert calls[:4] == [("ours", 7, "noop"), ("ours", 7, "sleep100"),
                         ("raw", 7, "noop"), ("raw", 7, "sleep100")]  # fmt: skip
    assert all(n != 7 for _, n, _ in calls[4:]) and len(calls) == 4 + 2 * 2 * 2
    assert out["warmup_jobs"] == 7
    assert out["noop"]["jobs_s"]["skilljobs"]["per_rep"] == [50.0, 50.0]  # warm-up not in it
