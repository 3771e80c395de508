"""Prometheus metrics computed from SQL at scrape time.

The database is the source of truth (workers come and go), so instead of counters kept
in one process, each scrape reads a snapshot with indexed queries (``queries.
metrics_live``: queue depth, active jobs, workers, incidents, limits) and turns it into
metric families. Windowed values cover the last ``METRICS_WINDOW_S`` seconds
(``queries.metrics_window`` and ``latency.snapshot``: jobs finished, run time, queue
wait, delivery latency, deliveries, schedule runs, retention totals); they are computed
and rendered once per ``WINDOW_REFRESH_S`` per process and shared by the scrapes of that
time (``dashboard.shared``: never older than 3 × ``WINDOW_REFRESH_S``). Take rates with
PromQL over the gauges.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dashboard import latency, limit_metrics, queries, shared
from jobs.queue import incidents

METRICS_WINDOW_S = 3600.0
WINDOW_REFRESH_S = 10.0  # the windowed families are shared this long (dashboard.shared)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Families:
    """What ``generate_latest`` renders: the families ``build`` yields from a snapshot."""

    def __init__(self, build: Callable[[dict[str, Any]], Iterator[Metric]], snap: Any) -> None:
        self._build = build
        self._snap = snap

    def collect(self) -> Iterator[Metric]:
        return self._build(self._snap)


def live_families(snap: dict[str, Any]) -> Iterator[Metric]:
    """Read at every scrape: queue depth, active jobs, workers, incidents, limits."""
    depth = snap["depth"]
    g = GaugeMetricFamily(
        "skilljobs_queue_depth", "Jobs waiting or running now.", labels=["status"]
    )
    g.add_metric(["queued"], depth["queued"])
    g.add_metric(["running"], depth["running"])
    g.add_metric(["scheduled"], depth.get("scheduled", 0))  # delayed jobs not yet due
    yield g
    yield GaugeMetricFamily(
        "skilljobs_oldest_queued_age_seconds",
        "Age of the oldest job still waiting (0 when none).",
        value=depth["oldest_queued_age_s"],
    )
    yield GaugeMetricFamily(
        "skilljobs_deliveries_pending_stale",
        "Deliveries still pending past SKILLJOBS_DELIVERY_PENDING_STALE_SEC.",
        value=depth.get("deliveries_pending_stale", 0),
    )
    yield GaugeMetricFamily(
        "skilljobs_oldest_pending_delivery_age_seconds",
        "Age of the oldest delivery pending past that bound (0 when none).",
        value=depth.get("oldest_pending_delivery_age_s", 0.0),
    )

    live = GaugeMetricFamily(
        "skilljobs_jobs_active", "Queued or running jobs per skill.", labels=["skill", "status"]
    )
    for skill, status, n in snap["live"]:
        live.add_metric([skill, status], n)
    yield live
    yield from latency.ratelimit_families(
        snap.get("ratelimit_waits", []), snap.get("ratelimit_parked", {})
    )

    up = GaugeMetricFamily(
        "skilljobs_worker_up",
        "1 when the worker's heartbeat is newer than 30 s.",
        labels=["worker"],
    )
    age = GaugeMetricFamily(
        "skilljobs_worker_heartbeat_age_seconds",
        "Seconds since the worker's last heartbeat.",
        labels=["worker"],
    )
    for wid, alive, hb_age in snap["workers"]:
        up.add_metric([wid], 1 if alive else 0)
        age.add_metric([wid], round(hb_age, 3))
    yield up
    yield age
    yield from _stall_metrics(snap.get("stalls", []))
    yield from _incident_metrics(snap.get("incidents", []))
    yield from counter_families(snap.get("totals", {}))
    if "limits" in snap:  # SKILLJOBS_LIMITS is set
        yield from limit_metrics.families(snap["limits"])
    yield GaugeMetricFamily(
        "skilljobs_workers_alive",
        "Workers with a heartbeat newer than 30 s.",
        value=sum(1 for _, alive, _ in snap["workers"] if alive),
    )


def window_families(snap: dict[str, Any]) -> Iterator[Metric]:
    """Over the last window (shared for a few seconds, ``dashboard.shared``): jobs
    finished and their run time, queue wait and delivery latency, deliveries, schedule
    runs, and the retention passes' totals."""
    window = f"{int(snap['window'])}s"
    fin = GaugeMetricFamily(
        "skilljobs_jobs_finished",
        f"Jobs finished in the last {window}, per skill and outcome.",
        labels=["skill", "outcome", "window"],
    )
    hist = HistogramMetricFamily(
        "skilljobs_job_duration_seconds",
        f"Run time of jobs finished in the last {window}.",
        labels=["skill", "window"],
    )
    per_skill: dict[str, list[float]] = defaultdict(
        lambda: [0.0, 0.0] + [0.0] * len(queries.DURATION_BUCKETS_MS)
    )
    for skill, status, n, n_dur, total_ms, *buckets in snap["finished"]:
        fin.add_metric([skill, status, window], n)
        acc = per_skill[skill]
        acc[0] += n_dur
        acc[1] += float(total_ms or 0.0)
        for i, b in enumerate(buckets):
            acc[2 + i] += b or 0
    for skill, acc in sorted(per_skill.items()):
        cumulative = [(_le(ms), acc[2 + i]) for i, ms in enumerate(queries.DURATION_BUCKETS_MS)]
        cumulative.append(("+Inf", acc[0]))
        hist.add_metric([skill, window], cumulative, sum_value=acc[1] / 1000.0)
    yield fin
    yield hist
    yield from latency.families(snap["latency"], window)

    dl = GaugeMetricFamily(
        "skilljobs_deliveries",
        f"Deliveries created in the last {window}, per channel and outcome.",
        labels=["channel", "status", "window"],
    )
    for channel, status, n in snap["deliveries"]:
        dl.add_metric([channel or "", status, window], n)
    yield dl

    cr = GaugeMetricFamily(
        "skilljobs_chain_runs",
        f"Schedule runs created in the last {window}, per status.",
        labels=["status", "window"],
    )
    for status, n in snap["chain_runs"]:
        cr.add_metric([status, window], n)
    yield cr
    pruned = CounterMetricFamily(
        "skilljobs_pruned",
        "Rows and files deleted by retention passes so far (recorded in the audit trail).",
        labels=["kind"],
    )
    for kind, n in sorted(snap.get("pruned", {}).items()):
        pruned.add_metric([kind], n)
    yield pruned


def counter_families(totals: Mapping[str, list[tuple[list[str], int]]]) -> Iterator[Metric]:
    """The monotonic counters workers keep in Redis (``jobs.counters``)."""
    jobs = CounterMetricFamily(
        "skilljobs_jobs",
        "Background jobs that ended, per skill and final status (since Redis was created).",
        labels=["skill", "status"],
    )
    for labels, n in totals.get("jobs", []):
        jobs.add_metric(labels, n)
    yield jobs
    deliveries = CounterMetricFamily(
        "skilljobs_deliveries",
        "Deliveries that ended, per channel and outcome (sent, failed, unknown).",
        labels=["channel", "status"],
    )
    for labels, n in totals.get("deliveries", []):
        deliveries.add_metric(labels, n)
    yield deliveries


def _stall_metrics(stalls: list[tuple[str, int, float]]) -> Iterator[Metric]:
    """The stall detector's figures per worker (jobs.queue.stall), from its heartbeats."""
    count = CounterMetricFamily(
        "skilljobs_worker_stalls",
        "Times the worker's event loop was blocked past SKILLJOBS_WORKER_STALL_SEC.",
        labels=["worker"],
    )
    longest = GaugeMetricFamily(
        "skilljobs_worker_longest_stall_seconds",
        "The longest event-loop block the worker's stall detector has seen.",
        labels=["worker"],
    )
    for wid, n, seconds in stalls:
        count.add_metric([wid], n)
        longest.add_metric([wid], seconds)
    yield count
    yield longest


def _incident_metrics(open_incidents: list[tuple[str, str, str, int]]) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "skilljobs_incidents_open", "Open (unacknowledged) incidents.", value=len(open_incidents)
    )
    per = GaugeMetricFamily(
        "skilljobs_incident_failures",
        "Failures counted so far in each open incident.",
        labels=["incident", "skill", "error_type"],
    )
    for incident_id, skill, error_type, n in open_incidents:
        per.add_metric([incident_id, skill, error_type], n)
    yield per


def _le(ms: float) -> str:
    return repr(ms / 1000.0)


class Metrics:
    """``render`` reads the live figures and the shared windowed ones and returns the text."""

    async def render(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        aggregates: shared.Shared,
        window: float = METRICS_WINDOW_S,
        *,
        limits: Mapping[str, int] | None = None,
        ratelimit_waits: latency.Waits | None = None,
        ratelimit_parked: dict[str, int] | None = None,
        totals: Mapping[str, list[tuple[list[str], int]]] | None = None,
        pending_stale_after: float = queries.PENDING_STALE_S,
    ) -> bytes:
        async def windowed() -> bytes:
            async with sessionmaker() as session:
                now = time.time()
                snap = await queries.metrics_window(session, now, window)
                snap["latency"] = await latency.snapshot(session, now - window)
            return generate_latest(Families(window_families, snap))

        async def live() -> dict[str, Any]:
            async with sessionmaker() as session:
                snap = await queries.metrics_live(session, time.time(), pending_stale_after)
                if limits:
                    snap["limits"] = await limit_metrics.snapshot(session, limits)
            return snap

        # each on its own connection, side by side
        snap, open_incidents, window_part = await asyncio.gather(
            live(),
            incidents.open_incidents(sessionmaker),
            aggregates.get(("metrics", window), WINDOW_REFRESH_S, windowed),
        )
        snap["incidents"] = open_incidents
        snap["ratelimit_waits"] = ratelimit_waits or []
        snap["ratelimit_parked"] = ratelimit_parked or {}
        snap["totals"] = totals or {}
        now_part = generate_latest(Families(live_families, snap))
        window_text: bytes = window_part.value
        return now_part + window_text
