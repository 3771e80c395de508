"""Putting work on the arq queue and waking idle workers at once.

Jobs are written in arq's own format (so a stock arq worker could run them), but with one
Lua script instead of arq's WATCH/MULTI round trips, and the wake-up published in the same
call.
"""

from __future__ import annotations

from typing import Any

from arq.constants import default_queue_name, expires_extra_ms, job_key_prefix, result_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms

from jobs.constants import WAKE_CHANNEL
from jobs.services import Services

_ENQUEUE_LUA = """
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then return 0 end
redis.call('PSETEX', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
redis.call('PUBLISH', ARGV[5], '1')
if ARGV[6] then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
return 1
"""


async def enqueue(
    services: Services,
    function: str,
    *args: Any,
    job_id: str,
    defer: float = 0.0,
    event: tuple[str, str] | None = None,
) -> bool:
    """Enqueue ``function(*args)`` under the arq id ``job_id`` and wake idle workers
    (``event``: a ``(channel, message)`` to publish in the same round trip).

    Returns False when a job with that id already exists (callers use a fresh id per
    enqueue, so that means "already there").
    """
    redis = services.redis
    if redis is None:
        raise RuntimeError("no Redis connection: cannot enqueue")
    script = getattr(redis, "_skilljobs_enqueue", None)
    if script is None:
        script = redis.register_script(_ENQUEUE_LUA)
        redis._skilljobs_enqueue = script  # type: ignore[attr-defined]
    now = timestamp_ms()
    score = now + int(defer * 1000)
    payload = serialize_job(function, args, {}, None, now)
    queue = services.settings.queue_name or default_queue_name
    done = await script(
        keys=[job_key_prefix + job_id, result_key_prefix + job_id, queue],
        args=[
            score - now + expires_extra_ms,
            payload,
            score,
            job_id,
            services.settings.key(WAKE_CHANNEL),
            *(event or ()),
        ],
    )
    return bool(done)
