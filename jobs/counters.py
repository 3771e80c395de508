"""Monotonic counters shared by every process (Redis hashes, ``jobs.constants``): jobs
that ended per skill and status, deliveries that ended per channel and status. Workers
add to them as outcomes are recorded; ``/metrics`` reads them as Prometheus counters, so
``rate()`` and ``increase()`` apply (the windowed gauges stay beside them)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from arq.connections import ArqRedis
from redis.asyncio.client import Pipeline

from jobs.constants import DELIVERIES_TOTAL, JOBS_TOTAL
from jobs.settings import Settings

log = logging.getLogger(__name__)

SEP = "\t"
#: the session ``info`` entry that carries a process's counters to the delivery ledger
SESSION_KEY = "skilljobs.counters"


def field(*labels: str) -> str:
    return SEP.join(label.replace(SEP, " ") for label in labels)


def add_to(pipe: Pipeline, key: str, counts: Counter[str]) -> None:
    for name, n in counts.items():
        pipe.hincrby(key, name, n)


class Counters:
    """The counters of one process (a Redis connection and the key names)."""

    def __init__(self, redis: ArqRedis, settings: Settings) -> None:
        self.redis = redis
        self.jobs_key = settings.key(JOBS_TOTAL)
        self.deliveries_key = settings.key(DELIVERIES_TOTAL)

    async def deliveries(self, outcomes: Iterable[tuple[str, str]]) -> None:
        """Count ``(channel, status)`` outcomes (best effort: the ledger is the record)."""
        counts = Counter(field(channel or "", status) for channel, status in outcomes)
        if not counts:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                add_to(pipe, self.deliveries_key, counts)
                await pipe.execute()
        except Exception as exc:  # a Redis hiccup loses a count, never a delivery
            log.debug("delivery counters not updated: %s", exc)


async def read(
    redis: ArqRedis | None, settings: Settings
) -> dict[str, list[tuple[list[str], int]]]:
    """``{"jobs": [([skill, status], n)], "deliveries": [([channel, status], n)]}``."""
    out: dict[str, list[tuple[list[str], int]]] = {"jobs": [], "deliveries": []}
    if redis is None:
        return out
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(settings.key(JOBS_TOTAL))
        pipe.hgetall(settings.key(DELIVERIES_TOTAL))
        jobs, deliveries = await pipe.execute()
    for name, raw in (("jobs", jobs), ("deliveries", deliveries)):
        for k, v in sorted((raw or {}).items()):
            text = k.decode() if isinstance(k, bytes) else str(k)
            labels = text.split(SEP, 1) + [""] * (1 - text.count(SEP))
            out[name].append((labels[:2], int(v)))
    return out
