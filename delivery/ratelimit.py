"""Outbound rate limits shared by every worker: token buckets in Redis per bot/app and per
chat, so many jobs finishing at once do not run into the platforms' 429s.

Each send to a platform first takes one token from every bucket it belongs to — the bot (or
app) bucket of the channel, the bucket of the chat it goes to, and for group chats the group
bucket — in one atomic script, so concurrent workers never overdraw a bucket. When a bucket
is empty the sender waits (waiting is not a failure). A 429 with ``retry_after`` pauses the
chat's bucket for every worker until then.

Defaults are the platforms' published limits (``docs/channels.md`` cites them);
``SKILLJOBS_RATE_LIMITS`` overrides them, e.g.
``{"telegram": {"bot": "30/s", "chat": "1/s", "group": "20/min"}, "feishu": {"chat": "5/s"}}``
(a rate is ``N/s``, ``N/min`` or ``N/h``; ``0`` or ``null`` turns that bucket off).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from arq.connections import ArqRedis

from delivery.channels.limits import Target, credit, spend_credit
from jobs.constants import RATELIMIT_PARKED, RATELIMIT_WAITED, RATELIMIT_WAITS
from jobs.settings import Settings

log = logging.getLogger(__name__)

#: the longest single wait before the buckets are asked again (a pause may be longer)
MAX_STEP = 5.0

#: ``(tokens, seconds)`` per bucket kind, from the platforms' documentation
DEFAULTS: dict[str, dict[str, tuple[float, float] | None]] = {
    # Bot FAQ: ~30 messages/s in all, 1/s in one chat, 20/min in one group
    "telegram": {"bot": (30, 1), "chat": (1, 1), "group": (20, 60)},
    # 发送消息: 1000/min and 50/s per app; 5 QPS to one user, 5 QPS per group (all bots)
    "feishu": {"bot": (50, 1), "chat": (5, 1), "group": (5, 1)},
    # 发送应用消息: one member at most 30 messages/min from one app
    "wecom": {"bot": (20, 1), "chat": (30, 60), "group": (20, 60)},
    # the organisation's API QPS (20 on the standard edition) shared by the app
    "dingtalk": {"bot": (20, 1), "chat": (20, 60), "group": (20, 60)},
}

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|min|minute|h|hour)\s*$", re.I)
_UNITS = {"s": 1, "sec": 1, "second": 1, "min": 60, "minute": 60, "h": 3600, "hour": 3600}

# KEYS: n bucket keys, then their n pause keys. ARGV: per bucket capacity, refill per ms.
# Answers 0 when a token was taken from every bucket, else the ms to wait.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS / 2
local wait = 0
for i = 1, n do
  local p = redis.call('PTTL', KEYS[n + i])
  if p > wait then wait = p end
end
if wait > 0 then return wait end
local level = {}
for i = 1, n do
  local cap = tonumber(ARGV[2 * i - 1])
  local rate = tonumber(ARGV[2 * i])
  local h = redis.call('HMGET', KEYS[i], 't', 'ts')
  local tokens = tonumber(h[1]) or cap
  local ts = tonumber(h[2]) or now
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  if tokens < 1 then
    local w = math.ceil((1 - tokens) / rate)
    if w > wait then wait = w end
  end
  level[i] = tokens
end
if wait > 0 then return wait end
for i = 1, n do
  local cap = tonumber(ARGV[2 * i - 1])
  local rate = tonumber(ARGV[2 * i])
  redis.call('HSET', KEYS[i], 't', level[i] - 1, 'ts', now)
  redis.call('PEXPIRE', KEYS[i], math.ceil(cap / rate) + 1000)
end
return 0
"""


# KEYS: the chat (or group) bucket. ARGV: its capacity, its idle expiry (ms), its refill
# per ms. The refill is counted from now on: the time the request that took the last token
# spent on the wire (or waiting to be handled) does not count toward the next one. A bucket
# that expired meanwhile comes back as if that token had just been taken from a full one.
# Answers the ms until the bucket's next token (0: it has one).
_SETTLE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tokens = tonumber(ARGV[1]) - 1
local h = redis.call('HMGET', KEYS[1], 't', 'ts')
if h[1] then
  tokens = tonumber(h[1])
  local ts = tonumber(h[2]) or now
  if now > ts then redis.call('HSET', KEYS[1], 'ts', now) end
else
  redis.call('HSET', KEYS[1], 't', tokens, 'ts', now)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if tokens >= 1 then return 0 end
return math.ceil((1 - tokens) / tonumber(ARGV[3]))
"""


def parse_rate(value: object) -> tuple[float, float] | None:
    """``"30/s"`` → ``(30, 1)``; ``[20, 60]`` → ``(20, 60)``; ``0`` / ``None`` → None (off)."""
    if value in (None, 0, "0", ""):
        return None
    if isinstance(value, list | tuple) and len(value) == 2:
        n, per = float(value[0]), float(value[1])
    elif isinstance(value, int | float):
        n, per = float(value), 1.0
    elif isinstance(value, str) and (m := _RATE.match(value)):
        n, per = float(m.group(1)), float(_UNITS[m.group(2).lower()])
    else:
        raise ValueError(f"a rate is N/s, N/min or N/h (not {value!r})")
    if n <= 0 or per <= 0:
        return None
    return n, per


def load_limits(
    raw: str | dict[str, Any] | None,
) -> dict[str, dict[str, tuple[float, float] | None]]:
    """The defaults with ``SKILLJOBS_RATE_LIMITS`` (JSON) laid over them."""
    out = {ch: dict(kinds) for ch, kinds in DEFAULTS.items()}
    data = json.loads(raw) if isinstance(raw, str) and raw.strip() else raw or {}
    if not isinstance(data, dict):
        raise ValueError("SKILLJOBS_RATE_LIMITS must be a JSON object of channels")
    for channel, kinds in data.items():
        if not isinstance(kinds, dict):
            raise ValueError(f"SKILLJOBS_RATE_LIMITS[{channel!r}] must be an object")
        slot = out.setdefault(str(channel), {})
        for kind, rate in kinds.items():
            if kind not in ("bot", "chat", "group"):
                raise ValueError(f"SKILLJOBS_RATE_LIMITS: {kind!r} is not bot, chat or group")
            slot[kind] = parse_rate(rate)
    return out


def is_group(channel: str, target: Target) -> bool:
    if target.chat:
        return True
    return channel == "telegram" and target.id.startswith("-")


@dataclass
class RateLimiter:
    """Token buckets in Redis under this deployment's prefix (``Settings.key``)."""

    redis: ArqRedis
    settings: Settings
    limits: dict[str, dict[str, tuple[float, float] | None]]
    _script: Any = None
    _settle: Any = None
    _due: dict[tuple[str, str], float] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, redis: ArqRedis, settings: Settings) -> RateLimiter:
        """A malformed ``SKILLJOBS_RATE_LIMITS`` is logged and the defaults are used: a
        typo must not stop delivery (nor throttle it less than the platforms demand)."""
        try:
            limits = load_limits(getattr(settings, "rate_limits", "") or "")
        except ValueError as exc:  # json.JSONDecodeError is one
            log.error("SKILLJOBS_RATE_LIMITS ignored (%s): using the platforms' limits", exc)
            limits = load_limits(None)
        return cls(redis, settings, limits)

    def buckets(self, channel: str, target: Target) -> list[tuple[str, float, float]]:
        """``(key, capacity, tokens per ms)`` of each bucket a send belongs to."""
        kinds = self.limits.get(channel, {})
        wanted = [("bot", "")]
        wanted.append(("group" if is_group(channel, target) else "chat", target.id))
        if is_group(channel, target) and kinds.get("chat"):
            wanted.append(("chat", target.id))
        out = []
        for kind, ident in wanted:
            rate = kinds.get(kind)
            if rate is None:
                continue
            n, per = rate
            key = self.settings.key("ratelimit", channel, kind, *([ident] if ident else []))
            out.append((key, n, n / (per * 1000)))
        return out

    def _pause_key(self, bucket: str) -> str:
        return f"{bucket}:pause"

    async def wait_ms(self, channel: str, target: Target) -> int:
        """Take a token from every bucket (0), or the ms to wait before asking again."""
        buckets = self.buckets(channel, target)
        if not buckets:
            return 0
        if self._script is None:
            self._script = self.redis.register_script(_SCRIPT)
        keys = [b[0] for b in buckets] + [self._pause_key(b[0]) for b in buckets]
        args: list[float] = []
        for _, cap, rate in buckets:
            args += [cap, rate]
        return int(await self._script(keys=keys, args=args))

    async def try_take(self, channel: str, target: Target) -> int:
        """Take a token now (0) or say how many ms until one is due; Redis unreachable: 0
        (a limiter must not stop delivery), logged."""
        try:
            return await self.wait_ms(channel, target)
        except Exception as exc:
            log.warning("rate limiter unavailable (%s): sending unthrottled", exc)
            self._script = None
            return 0

    async def acquire(self, channel: str, target: Target) -> float:
        """Wait until the send may go; returns the seconds waited. Redis unreachable: the
        send goes (a limiter must not stop delivery), and that is logged."""
        waited = 0.0
        while True:
            try:
                ms = await self.wait_ms(channel, target)
            except Exception as exc:  # redis down, script flushed…: do not block sends
                log.warning("rate limiter unavailable (%s): sending unthrottled", exc)
                self._script = None
                return waited
            if ms <= 0:
                if waited:
                    await self.count_wait(channel, waited)
                return waited
            step = min(ms / 1000.0, MAX_STEP)
            waited += step
            await asyncio.sleep(step)

    async def count_wait(self, channel: str, waited: float, *, parked: bool = False) -> None:
        """Count a send that waited ``waited`` seconds for a token, or (``parked``) was
        parked in the outbox, for ``/metrics`` (every worker adds to the same counters);
        best effort, like the limiter itself."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                if parked:
                    pipe.hincrby(self.settings.key(RATELIMIT_PARKED), channel, 1)
                else:
                    pipe.hincrby(self.settings.key(RATELIMIT_WAITS), channel, 1)
                    pipe.hincrbyfloat(self.settings.key(RATELIMIT_WAITED), channel, waited)
                await pipe.execute()
        except Exception as exc:
            log.warning("rate limiter: wait not counted (%s)", exc)

    async def settle(self, channel: str, target: Target) -> None:
        """A message request to ``target`` has been answered: its chat's next token is
        counted from now, not from when this one was taken. Platforms measure the gap
        between the messages they *receive*; a slow request must not let the next one
        arrive too soon after it. The answer also says when that token is due; it is
        kept (:meth:`due_in`) so a chat's sender sleeps until then without asking."""
        buckets = self.buckets(channel, target)
        if len(buckets) < 2:
            return
        try:
            if self._settle is None:
                self._settle = self.redis.register_script(_SETTLE)
            key, cap, rate = buckets[1]
            ms = int(await self._settle(keys=[key], args=[cap, math.ceil(cap / rate) + 1000, rate]))
        except Exception as exc:  # best effort, like the limiter itself
            self._settle = None
            log.warning("rate limiter: cannot settle a send (%s)", exc)
            return
        if len(self._due) > 4096:  # chats seen long ago; the hint is only a hint
            self._due.clear()
        self._due[(channel, target.id)] = time.monotonic() + ms / 1000

    def due_in(self, channel: str, target: Target) -> int:
        """The ms until the chat's next token as the last :meth:`settle` here saw it (0 when
        due or not known). A hint: the buckets in Redis decide (:meth:`try_take`)."""
        due = self._due.get((channel, target.id))
        return max(0, math.ceil((due - time.monotonic()) * 1000)) if due is not None else 0

    async def pause(self, channel: str, target: Target, retry_after: float) -> None:
        """A 429: no worker sends to this chat (or, without a chat bucket, on this bot)
        until ``retry_after`` seconds have passed."""
        buckets = self.buckets(channel, target)
        if not buckets or retry_after <= 0:
            return
        bucket = buckets[1][0] if len(buckets) > 1 else buckets[0][0]
        try:
            await self.redis.set(self._pause_key(bucket), "1", px=max(1, int(retry_after * 1000)))
        except Exception as exc:
            log.warning("rate limiter: cannot record a pause (%s)", exc)


__all__ = [
    "DEFAULTS",
    "RateLimiter",
    "credit",
    "is_group",
    "load_limits",
    "parse_rate",
    "spend_credit",
]
