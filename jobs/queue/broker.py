"""The one module that reads and writes arq's entries and keys in Redis.

Jobs are written in arq's own layout (job record, queue sorted set, in-progress and retry
keys), with one Lua script instead of arq's WATCH/MULTI round trips and the wake-up
published in the same call. Payloads are JSON, never pickle: an entry planted in Redis can
at worst name a job id, which the database then decides about.

Beside arq's queue sorted set, each entry also waits in a *lane*, one sorted set per
``priority|org`` (``<queue>:lane:<lane>``), listed in ``<queue>:lanes`` by priority and then
by when the lane was last served: the claim takes the lanes of the lowest priority number
round-robin, one entry per lane per pass, so one organisation's backlog cannot starve
another's job. A claimed entry leaves its lane (it stays in arq's queue until tidied).
Concurrency limits (``SKILLJOBS_LIMITS``) are hashes ``<queue>:limit:<key>`` of the entries
holding a slot (value: ``claimed ms|expires ms|worker id``); a holding whose worker's
heartbeat key is gone is freed by the next claim that finds the limit full. Lanes and
holdings are rebuilt from what is enqueued: the reconciler's re-enqueues carry the job's
lane metadata (``sj`` in the arq record, ignored by arq's decoder).

Producers: ``enqueue``, ``enqueue_many``; queue inspection: ``waiting``, ``limit_usage``;
removal: ``remove``; live events: ``job_event``, ``publish_job_event``, ``publish_cancel``;
worker heartbeats: ``beat``, ``alive``; the worker's side: ``claim``, ``load``, ``tidy``,
``release``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any, cast

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
from arq.jobs import SerializationError
from arq.utils import timestamp_ms
from redis.exceptions import NoScriptError

from jobs import counters, jsontext
from jobs.constants import (
    CANCEL_CHANNEL,
    FN_RUN_CHAIN,
    JOB_EVENTS,
    JOBS_TOTAL,
    PRIORITY_CHAIN,
    PRIORITY_INTERACTIVE,
    WAKE_CHANNEL,
    WORKER_HEARTBEAT,
)
from jobs.models import FINAL_STATUSES
from jobs.services import Services

log = logging.getLogger("skilljobs.broker")


# --- payloads ----------------------------------------------------------------------------


def dumps(data: dict[str, Any]) -> bytes:
    """arq ``job_serializer``: JSON (our job arguments are ids and integers)."""
    return jsontext.dumpb(data)


def loads(raw: bytes) -> dict[str, Any]:
    """arq ``job_deserializer``: JSON only; anything else is refused, never unpickled."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("arq job record is not a JSON object")
    return data


def decode(payload: bytes) -> tuple[str, tuple[Any, ...], dict[str, Any], int]:
    """(function name, args, kwargs, priority) of a stored arq record (the priority of its
    lane; the function's default without one); ``SerializationError`` when it is not one
    of ours."""
    try:
        d = loads(payload)
        name, args, kwargs, meta = d["f"], tuple(d["a"]), d["k"], d.get("sj")
        if not isinstance(name, str) or not isinstance(kwargs, dict):
            raise TypeError("not an arq job record")
    except Exception as exc:  # as arq's own decoder: anything else is unusable
        raise SerializationError(f"unable to deserialize job: {exc}") from exc
    prio = PRIORITY_CHAIN if name == FN_RUN_CHAIN else PRIORITY_INTERACTIVE
    if isinstance(meta, dict) and isinstance(meta.get("l"), str):
        head = meta["l"].split("|", 1)[0]
        prio = int(head) if head.isdigit() else prio
    return name, args, kwargs, prio


# --- producing ---------------------------------------------------------------------------

# Lane scores: priority × LANE_STEP + the serve counter when the lane was last served (or
# created), so lanes sort by priority, then least recently served first.
LANE_STEP = 10**12

# Lua helper: list a lane in the lane index when it is not there yet, behind the lanes
# served so far in its priority (so a new organisation is served in the current round).
_LANE_LUA = """
local function add_lane(queue, lane)
  if not redis.call('ZSCORE', queue .. ':lanes', lane) then
    local prio = tonumber(string.match(lane, '^(%d+)|')) or 0
    local seq = tonumber(redis.call('GET', queue .. ':seq') or '0')
    redis.call('ZADD', queue .. ':lanes', string.format('%.0f', prio * 1e12 + seq), lane)
  end
end
"""

_ENQUEUE_LUA = (
    _LANE_LUA
    + """
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then return 0 end
redis.call('PSETEX', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[3] .. ':lane:' .. ARGV[8], ARGV[3], ARGV[4])
add_lane(KEYS[3], ARGV[8])
if ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], '1') end
if ARGV[6] ~= '' then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
return 1
"""
)

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


def _record(
    function: str, args: Sequence[Any], at: int, meta: dict[str, Any] | None
) -> tuple[bytes, str]:
    """arq's job record (what ``serialize_job`` writes) plus our lane metadata ``sj``, and
    the entry's lane."""
    if meta is None:
        prio = PRIORITY_CHAIN if function == FN_RUN_CHAIN else PRIORITY_INTERACTIVE
        meta = {"l": f"{prio}|"}
    data = {"t": None, "f": function, "a": list(args), "k": {}, "et": at, "sj": meta}
    return dumps(data), str(meta["l"])


async def enqueue(
    services: Services,
    function: str,
    *args: Any,
    job_id: str,
    defer: float = 0.0,
    event: tuple[str, str] | None = None,
    meta: dict[str, Any] | None = None,
) -> bool:
    """Enqueue ``function(*args)`` under the arq id ``job_id`` and wake idle workers
    (``event``: a ``(channel, message)`` to publish in the same round trip; ``meta``: the
    lane and limit keys from ``jobs.queue.limits.meta``, default the function's priority
    without an organisation).

    Returns False when a job with that id already exists (callers use a fresh id per
    enqueue, so that means "already there").
    """
    redis = _redis(services)
    now = timestamp_ms()
    (at,) = _fifo_scores(1)
    payload, lane = _record(function, args, now, meta)
    done = await _script(redis, _ENQUEUE_LUA)(
        keys=[job_key_prefix + job_id, result_key_prefix + job_id, queue_name(services)],
        args=[
            int(defer * 1000) + expires_extra_ms,
            payload,
            at + int(defer * 1000),
            job_id,
            services.settings.key(WAKE_CHANNEL),
            *(event or ("", "")),
            lane,
        ],
    )
    return bool(done)


_last_us = 0  # the latest enqueue score this process gave, in microseconds


def _fifo_scores(n: int) -> list[float]:
    """``n`` queue scores (milliseconds, to the microsecond), each later than every score
    this process gave before: entries queued within one millisecond, or in one batch, are
    claimed in the order they were queued (a sorted set orders equal scores by member, a
    random id)."""
    global _last_us
    start = max(time.time_ns() // 1000, _last_us + 1)
    _last_us = start + n - 1
    return [(start + i) / 1000 for i in range(n)]


async def enqueue_many(
    services: Services,
    jobs: Sequence[tuple[str, str, tuple[Any, ...]]],
    metas: Sequence[dict[str, Any] | None] | None = None,
    events: Sequence[tuple[str, str] | None] | None = None,
) -> None:
    """Enqueue ``(arq id, function, args)`` for each item (``metas``: each one's lane
    metadata, as for :func:`enqueue`; ``events``: each one's live event, published with
    it) and wake idle workers, in one round trip."""
    redis = _redis(services)
    at = timestamp_ms()
    scores = _fifo_scores(len(jobs))
    queue = queue_name(services)
    script = _script(redis, _ENQUEUE_LUA)
    calls: list[list[Any]] = []
    for i, (job_id, function, args) in enumerate(jobs):
        payload, lane = _record(function, args, at, metas[i] if metas else None)
        calls.append(
            [
                job_key_prefix + job_id,
                result_key_prefix + job_id,
                queue,
                expires_extra_ms,
                payload,
                scores[i],
                job_id,
                "",
                *((events[i] if events else None) or ("", "")),
                lane,
            ]
        )
    # EVALSHA straight into the pipeline: a script registered on it would cost a SCRIPT
    # EXISTS round trip before every batch.
    for attempt in (1, 2):
        async with redis.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.evalsha(script.sha, 3, *call)
            pipe.publish(services.settings.key(WAKE_CHANNEL), "1")
            try:
                await pipe.execute()
                return
            except NoScriptError:
                if attempt == 2:
                    raise
        # The server lost its scripts (restart, SCRIPT FLUSH): load it and send the batch
        # again; an entry that did get in is skipped (its record exists).
        await redis.script_load(_ENQUEUE_LUA)


# --- inspecting and removing -------------------------------------------------------------


async def waiting(services: Services, job_ids: Sequence[str]) -> list[bool]:
    """For each arq id: its record exists and no worker has started it."""
    return [rec and not started for rec, started in await entry_states(services, job_ids)]


async def entry_states(services: Services, job_ids: Sequence[str]) -> list[tuple[bool, bool]]:
    """For each arq id: (its record exists, a worker has started it)."""
    redis = services.redis
    if redis is None or not job_ids:
        return [(False, False)] * len(job_ids)
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.exists(job_key_prefix + job_id)
            pipe.exists(in_progress_key_prefix + job_id)
        found = await pipe.execute()
    return [(bool(found[2 * i]), bool(found[2 * i + 1])) for i in range(len(job_ids))]


_REMOVE_LUA = (
    """
redis.call('ZREM', KEYS[1], ARGV[1])
local rec = redis.call('GET', '"""
    + job_key_prefix
    + """' .. ARGV[1])
if rec then
  local ok, d = pcall(cjson.decode, rec)
  if ok and type(d) == 'table' and type(d.sj) == 'table' and type(d.sj.l) == 'string' then
    redis.call('ZREM', KEYS[1] .. ':lane:' .. d.sj.l, ARGV[1])
  end
  if ok and type(d) == 'table' and type(d.sj) == 'table' and type(d.sj.s) == 'string' then
    redis.call('ZREM', KEYS[1] .. ':parked:' .. d.sj.s, ARGV[1])
  end
end
return 1
"""
)


async def remove(services: Services, job_id: str) -> None:
    """Take a not-yet-started entry off the queue and its lane (its record expires on its
    own)."""
    if services.redis is not None:
        await _script(services.redis, _REMOVE_LUA)(keys=[queue_name(services)], args=[job_id])


# --- skills paused by an operator ---------------------------------------------------------

_RESUME_LUA = (
    _LANE_LUA
    + """
local Q = KEYS[1]
redis.call('SREM', Q .. ':paused', ARGV[1])
local parked = Q .. ':parked:' .. ARGV[1]
local items = redis.call('ZRANGE', parked, 0, -1, 'WITHSCORES')
local back = 0
for i = 1, #items, 2 do
  local id, score = items[i], items[i + 1]
  local rec = redis.call('GET', '"""
    + job_key_prefix
    + """' .. id)
  if rec then
    local ok, d = pcall(cjson.decode, rec)
    if ok and type(d) == 'table' and type(d.sj) == 'table' and type(d.sj.l) == 'string' then
      redis.call('ZADD', Q, score, id)
      redis.call('ZADD', Q .. ':lane:' .. d.sj.l, score, id)
      add_lane(Q, d.sj.l)
      back = back + 1
    end
  end
end
redis.call('DEL', parked)
if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], '1') end
return back
"""
)


async def pause_skill(services: Services, skill: str) -> bool:
    """Claims stop taking ``skill``'s entries (they wait, parked, until resumed): True when
    it was not paused before."""
    added = _redis(services).sadd(queue_name(services) + ":paused", skill)
    return bool(await cast("Awaitable[int]", added))


async def resume_skill(services: Services, skill: str) -> int:
    """Claims take ``skill``'s entries again: its parked entries go back to their lanes in
    their order, and idle workers are woken. Returns how many went back."""
    script = _script(_redis(services), _RESUME_LUA)
    wake = services.settings.key(WAKE_CHANNEL)
    return int(await script(keys=[queue_name(services)], args=[skill, wake]))


async def paused_skills(services: Services) -> set[str]:
    members = _redis(services).smembers(queue_name(services) + ":paused")
    found = await cast("Awaitable[set[Any]]", members)
    return {v.decode() if isinstance(v, bytes) else str(v) for v in found}


async def limit_usage(services: Services, keys: Sequence[str]) -> list[int]:
    """Per limit key (``org:o1``), in order: how many entries hold one of its slots now
    (holdings of dead workers included until a claim frees them)."""
    redis = services.redis
    if redis is None or not keys:
        return [0] * len(keys)
    queue = queue_name(services)
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hlen(f"{queue}:limit:{key}")
        found = await pipe.execute()
    return [int(n) for n in found]


# --- start-rate buckets (jobs.queue.rates) -------------------------------------------------


async def buckets_to_rebuild(services: Services) -> list[str]:
    """The rate keys whose bucket a claim found missing (Redis lost it, or it is new)."""
    redis = services.redis
    if redis is None:
        return []
    found: set[Any] = await redis.smembers(f"{queue_name(services)}:rate:rebuild")  # type: ignore[misc]
    return sorted(k.decode() if isinstance(k, bytes) else str(k) for k in found)


_REBUILD_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 't', ARGV[1], 'ts', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], 86400000)
end
redis.call('SREM', KEYS[2], ARGV[3])
redis.call('PUBLISH', ARGV[4], '1')
return 1
"""


async def rebuild_bucket(services: Services, key: str, tokens: float, at_ms: int) -> None:
    """Write the bucket of ``key`` (unless a peer did meanwhile) and wake idle workers."""
    queue = queue_name(services)
    await _script(_redis(services), _REBUILD_LUA)(
        keys=[f"{queue}:rate:{key}", f"{queue}:rate:rebuild"],
        args=[repr(float(tokens)), at_ms, key, services.settings.key(WAKE_CHANNEL)],
    )


async def bucket_levels(services: Services, keys: Sequence[str]) -> list[tuple[float, int] | None]:
    """Per rate key: (tokens, as of epoch ms) stored, or None when Redis has no bucket."""
    redis = services.redis
    if redis is None or not keys:
        return [None] * len(keys)
    queue = queue_name(services)
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hmget(f"{queue}:rate:{key}", ["t", "ts"])
        found = await pipe.execute()
    return [None if t is None or ts is None else (float(t), int(float(ts))) for t, ts in found]


# --- live events -------------------------------------------------------------------------


def job_event(services: Services, job_id: str, status: str, skill: str) -> tuple[str, str]:
    """The (channel, message) live dashboards receive for a job status change."""
    return services.settings.key(JOB_EVENTS), jsontext.dumps(
        {"id": job_id, "status": status, "skill": skill, "at": time.time()}
    )


async def publish_job_event(services: Services, job_id: str, status: str, skill: str) -> None:
    """Tell live dashboards about a status change (best effort: the row is the record)."""
    if services.redis is None:
        return
    try:
        await publish_events(services, [(job_id, status, skill)])
    except Exception as exc:  # pragma: no cover - Redis hiccup
        log.debug("job event not published: %s", exc)


# events, then one HINCRBY of the jobs-total counters per job that ended (jobs.counters)
_EVENTS_LUA = """
local n = tonumber(ARGV[1])
for i = 2, 2 * n, 2 do redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end
for i = 2 * n + 2, #ARGV do redis.call('HINCRBY', KEYS[1], ARGV[i], 1) end
return n
"""


async def publish_events(services: Services, events: Sequence[tuple[str, str, str]]) -> None:
    """Many ``(job id, status, skill)`` events in one round trip; the jobs that ended are
    counted in the monotonic ``skilljobs_jobs_total`` counters."""
    if not events:
        return
    messages = [part for e in events for part in job_event(services, *e)]
    ended = [counters.field(skill, st) for _, st, skill in events if st in FINAL_STATUSES]
    await _script(_redis(services), _EVENTS_LUA)(
        keys=[services.settings.key(JOBS_TOTAL)], args=[len(events), *messages, *ended]
    )


# one command for many messages: a pipeline of PUBLISH costs the client a command each
_PUBLISH_LUA = """
for i = 1, #ARGV, 2 do redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end
return #ARGV / 2
"""


async def publish_many(redis: ArqRedis, messages: Sequence[tuple[str, str]]) -> None:
    """Publish ``(channel, message)`` pairs, in order, in one round trip."""
    if not messages:
        return
    args = [part for pair in messages for part in pair]
    await _script(redis, _PUBLISH_LUA)(keys=[], args=args)


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


async def heartbeats(services: Services, worker_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Per worker id, in order: what its last heartbeat key says ({} when it is gone)."""
    if not worker_ids or services.redis is None:
        return [{} for _ in worker_ids]
    keys = [services.settings.key(WORKER_HEARTBEAT, wid) for wid in worker_ids]
    out: list[dict[str, Any]] = []
    for raw in await services.redis.mget(keys):
        try:
            found = json.loads(raw) if raw else {}
        except ValueError:
            found = {}
        out.append(found if isinstance(found, dict) else {})
    return out


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

# Claims up to ARGV[3] due entries (arq's in-progress key, so arq's bookkeeping stays
# valid) and returns [number read, id, score, payload, id, score, payload, ...] of those it
# claimed (payload: the arq job record, false when it has expired). Lanes are served in
# index order: the lanes of one priority round-robin, one entry each per pass, until the
# claim is full or they have nothing claimable; then the next priority. An entry whose
# limit key is full is skipped (it stays first in its lane). Without any lane (entries
# written before lanes existed), arq's queue is read in order, as arq does.
# ARGV: now, in-progress ms, wanted, read limit, limits JSON ('' for none), worker id,
# heartbeat key prefix, entries read per lane, grace ms of a new holding.
_CLAIM_LUA = (
    """
local Q = KEYS[1]
local LANES = Q .. ':lanes'
local IP = '"""
    + in_progress_key_prefix
    + """'
local JK = '"""
    + job_key_prefix
    + """'
local now = tonumber(ARGV[1])
-- due: queued before the end of this millisecond (scores carry microseconds)
local due_by = '(' .. string.format('%.0f', now + 1)
local want = tonumber(ARGV[3])
local out = {0}
local function take(id, score, rec)
  out[#out + 1] = id
  out[#out + 1] = score
  out[#out + 1] = rec
  want = want - 1
end

if redis.call('EXISTS', LANES) == 0 then
  local due = redis.call('ZRANGEBYSCORE', Q, '-inf', due_by, 'WITHSCORES', 'LIMIT', 0, ARGV[4])
  out[1] = #due / 2
  for i = 1, #due, 2 do
    if want <= 0 then break end
    if redis.call('SET', IP .. due[i], '1', 'NX', 'PX', ARGV[2]) then
      take(due[i], due[i + 1], redis.call('GET', JK .. due[i]))
    end
  end
  return out
end

local limits = nil
if ARGV[5] ~= '' then limits = cjson.decode(ARGV[5]) end
local holding = now .. '|' .. string.format('%.0f', now + tonumber(ARGV[2])) .. '|' .. ARGV[6]
local grace = tonumber(ARGV[9])
local scan = tonumber(ARGV[8])
local read = 0
local is_full = {}
local tried = {}
local FIELDS = {skill = 's', org = 'o', role = 'r', actor = 'a'}

-- skills an operator paused: their entries leave the lanes for <queue>:parked:<skill>
-- as a claim meets them (so they never block a lane) until the skill is resumed
local PAUSED = Q .. ':paused'
local any_paused = redis.call('SCARD', PAUSED) > 0
local function paused_skill(rec)
  if not any_paused or not rec then return nil end
  local ok, d = pcall(cjson.decode, rec)
  if not ok or type(d) ~= 'table' or type(d.sj) ~= 'table' then return nil end
  local skill = d.sj.s
  if type(skill) == 'string' and redis.call('SISMEMBER', PAUSED, skill) == 1 then
    return skill
  end
  return nil
end

local function full(key, n)
  if is_full[key] then return true end
  local lk = Q .. ':limit:' .. key
  if redis.call('HLEN', lk) < n then return false end
  -- full: free the holdings of dead workers (heartbeat key gone) and expired ones
  local all = redis.call('HGETALL', lk)
  for i = 1, #all, 2 do
    local at, till, who = string.match(all[i + 1], '^(%d+)|(%d+)|(.*)$')
    if at == nil or tonumber(till) < now
       or (tonumber(at) + grace < now and redis.call('EXISTS', ARGV[7] .. who) == 0) then
      redis.call('HDEL', lk, all[i])
    end
  end
  if redis.call('HLEN', lk) < n then return false end
  is_full[key] = true
  -- an entry waits for this key: its next release wakes the workers
  redis.call('SET', Q .. ':waiting:' .. key, '1', 'PX', 60000)
  return true
end

-- start-rate token buckets (jobs.queue.rates): tokens left as of now, per key, in this call;
-- a bucket Redis lost (or never had) is rebuilt from the database first (-1 until then)
local buckets = {}
local function tokens(k, spec)
  if buckets[k] == nil then
    local b = redis.call('HMGET', Q .. ':rate:' .. k, 't', 'ts')
    if not b[1] then
      redis.call('SADD', Q .. ':rate:rebuild', k)
      buckets[k] = -1
    else
      local cap, per = tonumber(spec[1]), tonumber(spec[2])
      local t = tonumber(b[1]) + (now - tonumber(b[2])) * cap / per
      if t > cap then t = cap end
      buckets[k] = t
    end
  end
  return buckets[k]
end

-- the limit keys this record needs a slot of and the rate keys it takes a token of, or nil
-- when one of them is full or empty
local function slots(rec)
  local keys, rated = {}, {}
  if limits == nil or not rec then return keys, rated end
  local ok, d = pcall(cjson.decode, rec)
  if not ok or type(d) ~= 'table' or type(d.sj) ~= 'table' then return keys, rated end
  for kind, f in pairs(FIELDS) do
    local v = d.sj[f]
    if type(v) == 'string' and v ~= '' then
      local k = kind .. ':' .. v
      local n = limits.exact[k] or limits.any[kind]
      if n then
        if full(k, n) then return nil end
        keys[#keys + 1] = k
      end
      local r = limits.rate and (limits.rate[k] or limits.rate_any[kind])
      if r then
        if tokens(k, r) < 1 then return nil end
        rated[#rated + 1] = k
      end
    end
  end
  return keys, rated
end

-- up to quota entries from this lane: true when any was claimed
local function serve(lane, prio, quota)
  local lk = Q .. ':lane:' .. lane
  -- the head first; past entries waiting for a full limit only when some were
  local got, skipped, window = 0, 0, quota
  while true do
    local due = redis.call('ZRANGEBYSCORE', lk, '-inf', due_by, 'WITHSCORES', 'LIMIT', skipped, window)
    read = read + #due / 2
    if #due == 0 and skipped == 0 then
      if redis.call('EXISTS', lk) == 0 then redis.call('ZREM', LANES, lane) end
      return false
    end
    for i = 1, #due, 2 do
      if got >= quota then break end
      local id = due[i]
      local claimed = false
      if not tried[id] then
        tried[id] = true
        local rec = redis.call('GET', JK .. id)
        local parked = paused_skill(rec)
        local keys, rated = nil, nil
        if parked then
          redis.call('ZREM', lk, id)
          redis.call('ZREM', Q, id)
          redis.call('ZADD', Q .. ':parked:' .. parked, due[i + 1], id)
          claimed = true  -- (off the lane: not skipped)
        else
          keys, rated = slots(rec)
        end
        if keys then
          redis.call('ZREM', lk, id)
          claimed = true
          if redis.call('SET', IP .. id, '1', 'NX', 'PX', ARGV[2]) then
            for _, k in ipairs(keys) do redis.call('HSET', Q .. ':limit:' .. k, id, holding) end
            for _, k in ipairs(rated) do
              buckets[k] = buckets[k] - 1
              local rk = Q .. ':rate:' .. k
              redis.call('HSET', rk, 't', buckets[k], 'ts', now)
              redis.call('PEXPIRE', rk, 86400000)
            end
            if #keys > 0 then
              redis.call('SET', Q .. ':held:' .. id, table.concat(keys, '\\n'), 'PX', ARGV[2])
            end
            take(id, due[i + 1], rec)
            got = got + 1
          end
        end
      end
      if not claimed then skipped = skipped + 1 end
    end
    if got >= quota or #due < window * 2 or skipped >= scan then break end
    window = scan
  end
  if got == 0 then return false end
  local seq = redis.call('INCR', Q .. ':seq')
  redis.call('ZADD', LANES, string.format('%.0f', prio * 1e12 + seq), lane)
  return true
end

local lanes = redis.call('ZRANGE', LANES, 0, 999, 'WITHSCORES')
local i = 1
while i <= #lanes and want > 0 do
  local prio = math.floor(tonumber(lanes[i + 1]) / 1e12)
  local open = {}
  while i <= #lanes and math.floor(tonumber(lanes[i + 1]) / 1e12) == prio do
    open[#open + 1] = lanes[i]
    i = i + 2
  end
  while want > 0 and #open > 0 do
    local still = {}
    -- one entry per lane and pass; a lane alone in its priority fills the claim at once
    local quota = 1
    if #open == 1 then quota = want end
    for _, lane in ipairs(open) do
      if want > 0 and serve(lane, prio, quota) then still[#still + 1] = lane end
    end
    open = still
  end
end
out[1] = read
return out
"""
)

#: entries read per lane and claim pass (past entries waiting for a full limit)
LANE_SCAN = 32


async def claim(
    redis: ArqRedis,
    queue: str,
    *,
    free: int,
    in_progress_ms: int,
    read_limit: int,
    limits: str = "",
    holder: str = "",
    heartbeat_prefix: str = "",
    grace_ms: int = 10_000,
) -> tuple[int, list[tuple[str, int, bytes | None]]]:
    """Claim up to ``free`` due entries: (entries read, [(id, score, payload)]).

    ``limits``: ``jobs.queue.limits.for_claim`` of the settings ('' for none); slots are
    held for ``holder`` (a worker id whose heartbeat key is ``heartbeat_prefix + holder``)
    until :func:`release`, its heartbeat key is gone (after ``grace_ms``) or the
    in-progress time has passed.
    """
    raw = await _script(redis, _CLAIM_LUA)(
        keys=[queue],
        args=[
            timestamp_ms(),
            in_progress_ms,
            free,
            read_limit,
            limits,
            holder,
            heartbeat_prefix,
            LANE_SCAN,
            grace_ms,
        ],
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


_TIDY_LUA = (
    _LANE_LUA
    + """
local Q = KEYS[1]
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  redis.call('DEL', '"""
    + in_progress_key_prefix
    + """' .. id)
  if ARGV[i + 1] == '1' then
    redis.call('DEL', '"""
    + job_key_prefix
    + """' .. id, '"""
    + retry_key_prefix
    + """' .. id)
    redis.call('ZREM', Q, id)
    redis.call('ZREM', KEYS[2], id)
  else
    -- handed back: claimable again, first in its lane
    local score = redis.call('ZSCORE', Q, id)
    local rec = redis.call('GET', '"""
    + job_key_prefix
    + """' .. id)
    if score and rec then
      local ok, d = pcall(cjson.decode, rec)
      if ok and type(d) == 'table' and type(d.sj) == 'table' and type(d.sj.l) == 'string' then
        redis.call('ZADD', Q .. ':lane:' .. d.sj.l, score, id)
        add_lane(Q, d.sj.l)
      end
    end
  end
end
return 1
"""
)


async def tidy(redis: ArqRedis, queue: str, items: Sequence[tuple[str, bool]]) -> None:
    """Drop the in-progress mark of each ``(id, finished)``; finished entries leave the
    queue with their record and retry counter, unfinished ones go back to their lane."""
    args: list[str] = []
    for job_id, finished in items:
        args += [job_id, "1" if finished else "0"]
    await _script(redis, _TIDY_LUA)(keys=[queue, abort_jobs_ss], args=args)


_RELEASE_LUA = """
local freed, wake = 0, 0
for i = 2, #ARGV do
  local held = KEYS[1] .. ':held:' .. ARGV[i]
  local keys = redis.call('GET', held)
  if keys then
    for k in string.gmatch(keys, '[^\\n]+') do
      freed = freed + redis.call('HDEL', KEYS[1] .. ':limit:' .. k, ARGV[i])
      wake = wake + redis.call('DEL', KEYS[1] .. ':waiting:' .. k)
    end
    redis.call('DEL', held)
  end
end
if wake > 0 then redis.call('PUBLISH', ARGV[1], '1') end
return freed
"""


async def release(services: Services, arq_ids: Sequence[str]) -> int:
    """Free the limit slots the entries ``arq_ids`` hold (their job left ``running``) and
    wake idle workers when an entry was found waiting for one of those keys."""
    if not arq_ids:
        return 0
    freed = await _script(_redis(services), _RELEASE_LUA)(
        keys=[queue_name(services)], args=[services.settings.key(WAKE_CHANNEL), *arq_ids]
    )
    return int(freed)


__all__ = [
    "SerializationError",
    "alive",
    "beat",
    "bucket_levels",
    "buckets_to_rebuild",
    "claim",
    "decode",
    "dumps",
    "enqueue",
    "enqueue_many",
    "job_event",
    "limit_usage",
    "load",
    "loads",
    "publish_cancel",
    "publish_events",
    "publish_job_event",
    "rebuild_bucket",
    "release",
    "remove",
    "tidy",
    "waiting",
]
