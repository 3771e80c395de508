"""Latency for ``/metrics``: queue wait per skill and delivery latency per channel
(histograms), and the sends that waited for the outbound rate limiter (counters).

Both come from timestamps every process records in the database (the dispatcher's
``created_at``, the claiming worker's ``started_at``, the ledger's ``created_at`` and
``sent_at``), so they are right however many dispatchers and workers there are and
whichever of them the scrape reaches. Like the run-time histogram they cover a window:

* queue wait: from dispatch to the first run's start, of jobs finished in the window;
* delivery latency: from a delivery being recorded as due (the job's result ready to
  send) to the channel accepting it — rate-limit waits, retries and the platform's own
  answer — of first sends made in the window (an operator's resend is not latency).

The rate limiter's waits are counted by the workers in two Redis hashes (per channel: sends
that waited, seconds waited), monotonic counters for ``rate()`` in PromQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from arq.connections import ArqRedis
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from jobs.constants import RATELIMIT_PARKED, RATELIMIT_WAITED, RATELIMIT_WAITS
from jobs.models import Delivery, DeliveryStatus, Job

QUEUE_WAIT_BUCKETS_S = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
DELIVERY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)

Rows = list[tuple[Any, ...]]


def _histogram_columns(value: Any, buckets: Sequence[float]) -> list[Any]:
    """count, sum and one cumulative count per bucket of ``value`` (a SQL expression)."""
    return [
        func.count(),
        func.coalesce(func.sum(value), 0.0),
        *(func.sum(case((value <= b, 1), else_=0)) for b in buckets),
    ]


def _not_negative(session: AsyncSession, value: Any) -> Any:
    """``value`` floored at 0: the clocks of two hosts may disagree by a little."""
    if session.get_bind().dialect.name == "postgresql":
        return func.greatest(value, 0.0)
    return func.max(value, 0.0)  # SQLite's two-argument max() is a scalar function


async def snapshot(session: AsyncSession, since: float) -> dict[str, Rows]:
    """``{"queue_wait": [(skill, count, sum, *buckets)], "delivery": [(channel, …)]}``."""
    wait = _not_negative(session, Job.started_at - Job.created_at)
    waits = await session.execute(
        select(Job.skill, *_histogram_columns(wait, QUEUE_WAIT_BUCKETS_S))
        .where(Job.finished_at >= since, Job.started_at.is_not(None))
        .group_by(Job.skill)
    )
    took = _not_negative(session, Delivery.sent_at - Delivery.created_at)
    sends = await session.execute(
        select(Delivery.channel, *_histogram_columns(took, DELIVERY_BUCKETS_S))
        .where(
            Delivery.status == DeliveryStatus.SENT,
            Delivery.created_at >= since,
            Delivery.generation == 0,
            Delivery.sent_at.is_not(None),
        )
        .group_by(Delivery.channel)
    )
    return {
        "queue_wait": [tuple(r) for r in waits.all()],
        "delivery": [tuple(r) for r in sends.all()],
    }


def _family(
    name: str, doc: str, label: str, rows: Rows, buckets: Sequence[float], window: str
) -> HistogramMetricFamily:
    hist = HistogramMetricFamily(name, doc, labels=[label, "window"])
    for key, count, total, *cumulative in sorted(rows, key=lambda r: str(r[0] or "")):
        points = [(repr(b), int(n or 0)) for b, n in zip(buckets, cumulative, strict=True)]
        points.append(("+Inf", int(count)))
        hist.add_metric([str(key or ""), window], points, sum_value=float(total or 0.0))
    return hist


def families(snap: dict[str, Rows], window: str) -> Iterator[Metric]:
    yield _family(
        "skilljobs_job_queue_wait_seconds",
        f"Dispatch to first run start of jobs finished in the last {window}, per skill.",
        "skill",
        snap["queue_wait"],
        QUEUE_WAIT_BUCKETS_S,
        window,
    )
    yield _family(
        "skilljobs_delivery_latency_seconds",
        f"Due to accepted by the channel, of first sends in the last {window}, per channel.",
        "channel",
        snap["delivery"],
        DELIVERY_BUCKETS_S,
        window,
    )


Waits = list[tuple[str, int, float]]


async def ratelimit_waits(redis: ArqRedis | None, key: Callable[[str], str]) -> Waits:
    """``(channel, sends that waited, seconds waited)`` from the workers' counters; empty
    when Redis cannot be read (the scrape still answers)."""
    counts, seconds = await _hashes(redis, key, RATELIMIT_WAITS, RATELIMIT_WAITED)
    return [(ch, int(n), float(seconds.get(ch, 0.0))) for ch, n in sorted(counts.items())]


async def ratelimit_parked(redis: ArqRedis | None, key: Callable[[str], str]) -> dict[str, int]:
    """Sends parked in the outbox for a rate limit, per channel (the workers' counters)."""
    (parked,) = await _hashes(redis, key, RATELIMIT_PARKED)
    return {ch: int(n) for ch, n in sorted(parked.items())}


async def _hashes(
    redis: ArqRedis | None, key: Callable[[str], str], *names: str
) -> list[dict[str, Any]]:
    if redis is None:
        return [{} for _ in names]
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(key(name))
            found = await pipe.execute()
    except Exception:
        return [{} for _ in names]
    return [{_str(k): v for k, v in h.items()} for h in found]


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def ratelimit_families(waits: Waits, parked_per_channel: dict[str, int]) -> Iterator[Metric]:
    sends = CounterMetricFamily(
        "skilljobs_ratelimit_waits",
        "Sends that waited for the outbound rate limiter, per channel (all workers).",
        labels=["channel"],
    )
    waited = CounterMetricFamily(
        "skilljobs_ratelimit_wait_seconds",
        "Seconds sends waited for the outbound rate limiter, per channel (all workers).",
        labels=["channel"],
    )
    parked = CounterMetricFamily(
        "skilljobs_ratelimit_parked",
        "Sends parked in the outbox for a rate limit, per channel (all workers).",
        labels=["channel"],
    )
    for channel, n, seconds in waits:
        sends.add_metric([channel], n)
        waited.add_metric([channel], seconds)
    for channel, n in parked_per_channel.items():
        parked.add_metric([channel], n)
    yield sends
    yield waited
    yield parked
