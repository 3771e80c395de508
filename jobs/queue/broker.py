"""The one module that reads and writes arq's entries and keys in Redis.

Jobs are written in arq's own layout (job record, queue sorted set, in-progress and retry
keys), with one Lua script instead of arq's WATCH/MULTI round trips and the wake-up
published in the same call. Payloads are JSON, never pickle: an entry planted in Redis can
at worst name a job id, which the database then decides about.

Producers: ``enqueue``, ``enqueue_many``; queue inspection: ``waiting``; removal:
``remove``; live events: ``job_event``, ``publish_job_event``, ``publish_cancel``;
worker heartbeats: ``beat``, ``alive``; the worker's side: ``claim``, ``load``, ``tidy``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from arq.connections import ArqRedis
from arq.constants import (
    abort_jobs_ss,
    default_queue_name,
    expires_extra_ms,
    in_progress_key_prefix,
    job_key_prefix,
    result_key_prefix,
    retry_key_prefix,
)
from arq.jobs import SerializationError, deserialize_job_raw, serialize_job
from arq.utils import timestamp_ms

from jobs.constants import CANCEL_CHANNEL, JOB_EVENTS, WAKE_CHANNEL, WORKER_HEARTBEAT
from jobs.services import Services

if TYPE_CHECKING:
    from jobs.execution.executor import Executor
    from jobs.queue.runner import JobRunner

log = logging.getLogger("skilljobs.broker")


class WorkerContext(TypedDict, total=False):
    """What arq hands our job functions: the worker's wiring (set at start-up) and the
    entry being run."""

    services: Services
    executor: Executor
    worker_id: str
    runner: JobRunner
    redis: ArqRedis
    job_id: str
    job_try: int
    score: int


# --- payloads ----------------------------------------------------------------------------


def dumps(data: dict[str, Any]) -> bytes:
    """arq ``job_serializer``: JSON (our job arguments are ids and integers)."""
    return json.dumps(data, separators=(",", ":")).encode()


def loads(raw: bytes) -> dict[str, Any]:
    """arq ``job_deserializer``: JSON only; anything else is refused, never unpickled."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("arq job record is not a JSON object")
    return data


def decode(payload: bytes) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """(function name, args, kwargs) of a stored arq record; ``SerializationError`` when
    it is not one of ours."""
    name, args, kwargs, _, _ = deserialize_job_raw(payload, deserializer=loads)
    return name, tuple(args), kwargs


# --- producing ---------------------------------------------------------------------------

_ENQUEUE_LUA = """
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then return 0 end
redis.call('PSETEX', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
redis.call('PUBLISH', ARGV[5], '1')
if ARGV[6] then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
return 1
"""

_scripts: dict[tuple[int, str], Any] = {}


def _script(redis: ArqRedis, source: str) -> Any:
    """A registered Lua script, cached per connection pool."""
    key = (id(redis), source)
    found = _scripts.get(key)
    if found is None or found.registered_client is not redis:
        found = _scripts[key] = redis.register_script(source)
    return found


def _redis(services: Services) -> ArqRedis:
    if services.redis is None:
        raise RuntimeError("no Redis connection: cannot enqueue")
    return services.redis


def queue_name(services: Services) -> str:
    return services.settings.queue_name or default_queue_name


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
    redis = _redis(services)
    now = timestamp_ms()
    score = now + int(defer * 1000)
    payload = serialize_job(function, args, {}, None, now, serializer=dumps)
    done = await _script(redis, _ENQUEUE_LUA)(
        keys=[job_key_prefix + job_id, result_key_prefix + job_id, queue_name(services)],
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


async def enqueue_many(
    services: Services, jobs: Sequence[tuple[str, str, tuple[Any, ...]]]
) -> None:
    """Enqueue ``(arq id, function, args)`` for each item and wake idle workers, in one
    round trip (the ids are new, so arq's duplicate check is ``NX``)."""
    redis = _redis(services)
    at = timestamp_ms()
    queue = queue_name(services)
    async with redis.pipeline(transaction=False) as pipe:
        for job_id, function, args in jobs:
            payload = serialize_job(function, args, {}, None, at, serializer=dumps)
            pipe.set(job_key_prefix + job_id, payload, px=expires_extra_ms, nx=True)
            pipe.zadd(queue, {job_id: at}, nx=True)
        pipe.publish(services.settings.key(WAKE_CHANNEL), "1")
        await pipe.execute()


# --- inspecting and removing -------------------------------------------------------------


async def waiting(services: Services, job_ids: Sequence[str]) -> list[bool]:
    """For each arq id: its record exists and no worker has started it."""
    redis = services.redis
    if redis is None or not job_ids:
        return [False] * len(job_ids)
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.exists(job_key_prefix + job_id)
            pipe.exists(in_progress_key_prefix + job_id)
        found = await pipe.execute()
    return [bool(found[2 * i]) and not found[2 * i + 1] for i in range(len(job_ids))]


async def remove(services: Services, job_id: str) -> None:
    """Take a not-yet-started entry off the queue (its record expires on its own)."""
    if services.redis is not None:
        await services.redis.zrem(queue_name(services), job_id)


# --- live events -------------------------------------------------------------------------


def job_event(services: Services, job_id: str, status: str, skill: str) -> tuple[str, str]:
    """The (channel, message) live dashboards receive for a job status change."""
    return services.settings.key(JOB_EVENTS), json.dumps(
        {"id": job_id, "status": status, "skill": skill, "at": time.time()}
    )


async def publish_job_event(services: Services, job_id: str, status: str, skill: str) -> None:
    """Tell live dashboards about a status change (best effort: the row is the record)."""
    if services.redis is None:
        return
    try:
        await services.redis.publish(*job_event(services, job_id, status, skill))
    except Exception as exc:  # pragma: no cover - Redis hiccup
        log.debug("job event not published: %s", exc)


async def publish_events(services: Services, events: Sequence[tuple[str, str, str]]) -> None:
    """Many ``(job id, status, skill)`` events in one round trip."""
    redis = _redis(services)
    async with redis.pipeline(transaction=False) as pipe:
        for job_id, status, skill in events:
            pipe.publish(*job_event(services, job_id, status, skill))
        await pipe.execute()


async def publish_cancel(services: Services, job_id: str) -> None:
    """Ask whichever worker runs ``job_id`` to stop it (it checks the database first)."""
    if services.redis is not None:
        await services.redis.publish(services.settings.key(CANCEL_CHANNEL), job_id)


# --- worker heartbeats -------------------------------------------------------------------


async def beat(services: Services, worker_id: str, info: dict[str, Any], ttl: float) -> None:
    """This worker is alive: its heartbeat key, gone ``ttl`` seconds after the last beat."""
    await _redis(services).set(
        services.settings.key(WORKER_HEARTBEAT, worker_id),
        json.dumps(info),
        px=max(int(ttl * 1000), 1),
    )


async def alive(services: Services, worker_ids: Sequence[str]) -> list[bool]:
    """Per worker id, in order: is its heartbeat key present?"""
    if not worker_ids:
        return []
    redis = _redis(services)
    async with redis.pipeline(transaction=False) as pipe:
        for wid in worker_ids:
            pipe.exists(services.settings.key(WORKER_HEARTBEAT, wid))
        found = await pipe.execute()
    return [bool(n) for n in found]


# --- the worker's side -------------------------------------------------------------------

# Reads the due part of the queue, marks up to ARGV[3] jobs not already running as in
# progress (arq's own key, so arq's bookkeeping stays valid) and returns
# [number read, id, score, payload, id, score, payload, ...] of those it claimed
# (payload: the arq job record, false when it has expired).
_CLAIM_LUA = (
    """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[4])
local out = {#due / 2}
local want = tonumber(ARGV[3])
for i = 1, #due, 2 do
  if (#out - 1) / 3 >= want then break end
  local id = due[i]
  if redis.call('SET', '"""
    + in_progress_key_prefix
    + """' .. id, '1', 'NX', 'PX', ARGV[2]) then
    out[#out + 1] = id
    out[#out + 1] = due[i + 1]
    out[#out + 1] = redis.call('GET', '"""
    + job_key_prefix
    + """' .. id)
  end
end
return out
"""
)


async def claim(
    redis: ArqRedis, queue: str, *, free: int, in_progress_ms: int, read_limit: int
) -> tuple[int, list[tuple[str, int, bytes | None]]]:
    """Claim up to ``free`` due entries: (entries read, [(id, score, payload)])."""
    raw = await _script(redis, _CLAIM_LUA)(
        keys=[queue], args=[timestamp_ms(), in_progress_ms, free, read_limit]
    )
    claimed = []
    for i in range(1, len(raw), 3):
        rid = raw[i]
        job_id = rid.decode() if isinstance(rid, bytes) else str(rid)
        claimed.append((job_id, int(float(raw[i + 1])), raw[i + 2] or None))
    return int(raw[0]), claimed


async def load(redis: ArqRedis, job_id: str) -> bytes | None:
    """The stored record of an entry (None when it expired)."""
    payload: bytes | None = await redis.get(job_key_prefix + job_id)
    return payload


async def tidy(redis: ArqRedis, queue: str, items: Sequence[tuple[str, bool]]) -> None:
    """Drop the in-progress mark of each ``(id, finished)``; finished entries leave the
    queue with their record and retry counter."""
    done = [job_id for job_id, finished in items if finished]
    keys = [in_progress_key_prefix + job_id for job_id, _ in items]
    for job_id in done:
        keys += [job_key_prefix + job_id, retry_key_prefix + job_id]
    async with redis.pipeline(transaction=True) as tr:
        tr.delete(*keys)
        if done:
            tr.zrem(queue, *done)
            tr.zrem(abort_jobs_ss, *done)
        await tr.execute()


__all__ = [
    "SerializationError",
    "WorkerContext",
    "alive",
    "beat",
    "claim",
    "decode",
    "dumps",
    "enqueue",
    "enqueue_many",
    "job_event",
    "load",
    "loads",
    "publish_cancel",
    "publish_events",
    "publish_job_event",
    "remove",
    "tidy",
    "waiting",
]
