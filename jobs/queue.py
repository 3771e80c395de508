"""Putting work on the arq queue and waking idle workers at once."""

from __future__ import annotations

from typing import Any

from jobs.constants import WAKE_CHANNEL
from jobs.services import Services


async def enqueue(services: Services, function: str, *args: Any, job_id: str) -> bool:
    """Enqueue ``function(*args)`` under the arq id ``job_id`` and wake idle workers.

    Returns False when arq refused the id because a job with it is already queued or
    running (callers use unique ids per attempt, so this means "already there").
    """
    redis = services.redis
    if redis is None:
        raise RuntimeError("no Redis connection: cannot enqueue")
    job = await redis.enqueue_job(
        function, *args, _job_id=job_id, _queue_name=services.settings.queue_name
    )
    await redis.publish(services.settings.key(WAKE_CHANNEL), "1")
    return job is not None
