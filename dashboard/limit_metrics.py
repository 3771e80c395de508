"""Concurrency-limit usage for ``/metrics`` (``SKILLJOBS_LIMITS``), read from the jobs table.

Running jobs are few (bounded by the workers' slots), so grouping them is cheap; queued
jobs may be a backlog of millions, so they are counted only for keys that are full, and
each count stops at ``WAITING_CAP``. Label cardinality stays bounded: ``KIND:*`` limits
report at most ``MAX_KEYS`` busiest values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from jobs.models import Job, JobStatus

#: limit kind -> the jobs column its values come from
COLUMNS = {"skill": Job.skill, "org": Job.org_id, "role": Job.role_id, "actor": Job.actor_key}
MAX_KEYS = 100
WAITING_CAP = 10_000
MAX_WAITING_QUERIES = 20


@dataclass(frozen=True)
class KeyUsage:
    key: str  # "org:o1"
    slots: int  # N of the limit that applies to it
    running: int
    waiting: int | None = None  # queued behind the full limit (None: not full, not counted)


async def snapshot(session: AsyncSession, limits: Mapping[str, int]) -> list[KeyUsage]:
    """The usage of every limited key that has running jobs, and of every exact key."""
    out: list[KeyUsage] = []
    for kind, column in COLUMNS.items():
        exact = {k.partition(":")[2]: n for k, n in limits.items() if k.startswith(f"{kind}:")}
        if not exact:
            continue
        star = exact.pop("*", None)
        rows = (
            await session.execute(
                select(column, func.count())
                .where(Job.status == JobStatus.RUNNING)
                .group_by(column)
                .order_by(func.count().desc())
            )
        ).all()
        running = {str(v): int(n) for v, n in rows if v}
        values = list(exact)
        if star is not None:
            values += [v for v in running if v not in exact][:MAX_KEYS]
        for value in values:
            slots = exact.get(value, star)
            if slots is not None:
                out.append(KeyUsage(f"{kind}:{value}", slots, running.get(value, 0)))
    return await _count_waiting(session, out)


async def _count_waiting(session: AsyncSession, usage: list[KeyUsage]) -> list[KeyUsage]:
    full = [u for u in usage if u.running >= u.slots][:MAX_WAITING_QUERIES]
    counted: dict[str, int] = {}
    for u in full:
        kind, _, value = u.key.partition(":")
        inner = (
            select(Job.id)
            .where(Job.status == JobStatus.QUEUED, COLUMNS[kind] == value)
            .limit(WAITING_CAP)
            .subquery()
        )
        counted[u.key] = int(
            (await session.execute(select(func.count()).select_from(inner))).scalar_one()
        )
    return [
        KeyUsage(u.key, u.slots, u.running, counted.get(u.key)) if u.key in counted else u
        for u in usage
    ]


def families(usage: list[KeyUsage]) -> Iterator[Metric]:
    slots = GaugeMetricFamily(
        "skilljobs_limit_slots", "Jobs allowed to run at once for the key.", labels=["limit"]
    )
    running = GaugeMetricFamily(
        "skilljobs_limit_running", "Jobs of the key running now.", labels=["limit"]
    )
    waiting = GaugeMetricFamily(
        "skilljobs_limit_waiting",
        f"Queued jobs of a full key, waiting for one of its slots (counted up to {WAITING_CAP}).",
        labels=["limit"],
    )
    for u in usage:
        slots.add_metric([u.key], u.slots)
        running.add_metric([u.key], u.running)
        if u.waiting is not None:
            waiting.add_metric([u.key], u.waiting)
    yield slots
    yield running
    yield waiting
    yield GaugeMetricFamily(
        "skilljobs_limits_full",
        "Limited keys whose slots are all taken.",
        value=sum(1 for u in usage if u.running >= u.slots),
    )


def rate_families(snap: dict[str, Any]) -> Iterator[Metric]:
    """Start-rate limits (``/api/v1/limits``, ``snap["items"]``): the rate allowed and
    the tokens left."""
    items: list[dict[str, Any]] = snap["items"]
    rate = GaugeMetricFamily(
        "skilljobs_limit_rate_per_second",
        "Runs of the key allowed to start per second (a start-rate limit).",
        labels=["limit"],
    )
    tokens = GaugeMetricFamily(
        "skilljobs_limit_rate_tokens",
        "Starts the key's token bucket allows right now.",
        labels=["limit"],
    )
    for item in items:
        if item["rate_per_s"] is None:
            continue
        rate.add_metric([item["key"]], item["rate_per_s"])
        if item["tokens"] is not None:
            tokens.add_metric([item["key"]], item["tokens"])
    yield rate
    yield tokens
