"""Leaving the shared Redis server as a test found it."""

from __future__ import annotations

from typing import Any

from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix


async def clear_keys(redis: Any, prefix: str) -> None:
    """Delete a test's keys: its own (``prefix…``, its queue among them) and arq's entries of
    the jobs still in its queue, which arq does not prefix (left behind, they pile up by the
    thousand on a shared server and every ``SCAN`` of it gets slower)."""
    queued = await redis.zrange(f"{prefix}:queue", 0, -1)
    keys = [k async for k in redis.scan_iter(count=1000, match=f"{prefix}*")]
    for raw in queued:
        job = raw.decode() if isinstance(raw, bytes) else str(raw)
        keys += [p + job for p in (job_key_prefix, in_progress_key_prefix, retry_key_prefix)]
    if keys:
        await redis.delete(*keys)
