"""Delayed and one-shot jobs: ``run_at`` / ``delay_s`` at dispatch, and the promoter.

A job dispatched for later is recorded ``scheduled`` with its ``run_at`` and is not
enqueued: the database is the record, so it is listed and cancellable like any job and it
survives restarts and the loss of Redis. The promoter of every worker moves the jobs whose
time has come to ``queued`` (one UPDATE that checks the status, so each is moved once
whichever workers promote at once) and enqueues them. It sleeps until the earliest
``run_at`` it knows of, at most ``SKILLJOBS_DELAYED_POLL_SEC`` (a dispatch on another
process is seen within that), so a job starts within a fraction of a second of its time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jobs.constants import FN_RUN_JOB
from jobs.models import QUEUED
from jobs.queue import broker, limits, store
from jobs.services import Services

log = logging.getLogger("skilljobs.delayed")

#: the furthest ahead a job may be dispatched
MAX_DELAY_S = 366 * 86400.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?", re.IGNORECASE)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")


class WhenError(ValueError):
    """A ``run_at`` / ``delay_s`` / ``--at`` / ``--in`` that cannot be read."""


def parse_duration(text: str | float | int) -> float:
    """Seconds of ``"10m"``, ``"1h30m"``, ``"90s"``, ``"2d"``, ``"250ms"`` or a number."""
    if isinstance(text, bool):
        raise WhenError("a duration must be a number of seconds or like 10m, 1h30m, 45s")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        raw = text.strip().replace(" ", "")
        pos, seconds = 0, 0.0
        for m in _DURATION.finditer(raw):
            if m.start() != pos or (m.group(2) is None and m.end() != len(raw)):
                break
            seconds += float(m.group(1)) * _UNITS[(m.group(2) or "s").lower()]
            pos = m.end()
        if not raw or pos != len(raw):
            raise WhenError(
                f"{text!r} is not a duration: use seconds or units, e.g. 45s, 10m, 1h30m, 2d"
            )
    if not math.isfinite(seconds) or seconds < 0:
        raise WhenError(f"{text!r}: a duration must be a finite number of seconds, 0 or more")
    return seconds


def parse_instant(value: object, tz: str | None = None) -> float:
    """Epoch seconds of ``value``: a number (epoch seconds), a numeric string, or an ISO
    8601 date-time (``2026-12-06T18:00:00+08:00``; without an offset it is read in ``tz``,
    UTC when none is given)."""
    if isinstance(value, bool):
        raise WhenError("run_at must be an ISO 8601 time or epoch seconds, not a boolean")
    if isinstance(value, int | float):
        ts = float(value)
    elif isinstance(value, str):
        raw = value.strip()
        try:
            ts = float(raw)
        except ValueError:
            try:
                dt = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
            except ValueError:
                raise WhenError(
                    f"run_at {value!r} is neither an ISO 8601 time "
                    "(2026-12-06T18:00:00+08:00) nor epoch seconds"
                ) from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=zone(tz) if tz else UTC)
            ts = dt.timestamp()
    else:
        raise WhenError("run_at must be an ISO 8601 time (string) or epoch seconds (number)")
    if not math.isfinite(ts) or ts <= 0:
        raise WhenError(f"run_at {value!r} is not a valid time")
    return ts


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise WhenError(f"{name!r} is not a known IANA time zone (e.g. Asia/Shanghai)") from None


def clock_time(text: str, tz: str | None, now: float) -> float:
    """``--at``: ``18:00`` (the next 18:00 in ``tz``, today or tomorrow), an ISO time, or
    epoch seconds."""
    m = _CLOCK.match(text.strip())
    if m is None:
        return parse_instant(text, tz)
    hour, minute, second = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise WhenError(f"{text!r} is not a time of day (HH:MM or HH:MM:SS)")
    where = zone(tz) if tz else datetime.now().astimezone().tzinfo
    local = datetime.fromtimestamp(now, where)
    at = local.replace(hour=hour, minute=minute, second=second, microsecond=0)
    if at.timestamp() <= now:
        at = (local + timedelta(days=1)).replace(
            hour=hour, minute=minute, second=second, microsecond=0
        )
    return at.timestamp()


def due_time(
    run_at: object, delay_s: str | float | None, now: float, tz: str | None = None
) -> tuple[float | None, str | None]:
    """(when the job is due, or None for now; a problem to refuse the dispatch with)."""
    if run_at is None and delay_s is None:
        return None, None
    if run_at is not None and delay_s is not None:
        return None, "give run_at or delay_s, not both"
    try:
        at = now + parse_duration(delay_s) if delay_s is not None else parse_instant(run_at, tz)
    except WhenError as exc:
        return None, str(exc)
    if at - now > MAX_DELAY_S:
        return None, f"run_at is more than {MAX_DELAY_S / 86400:.0f} days ahead"
    return at, None


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


# --- the promoter -----------------------------------------------------------------------


async def promote_once(services: Services, now: float | None = None) -> int:
    """Queue every scheduled job that is due; returns how many were promoted."""
    now = time.time() if now is None else now
    n = 0
    while True:
        jobs = await store.promote_due(services.sessionmaker, now)
        if not jobs:
            return n
        try:
            await broker.enqueue_many(
                services,
                [
                    (
                        j.arq_job_id or store.arq_id(j.id, j.lease_token),
                        FN_RUN_JOB,
                        (j.id, j.lease_token),
                    )
                    for j in jobs
                ],
                metas=[limits.job_meta(j) for j in jobs],
                events=[broker.job_event(services, j.id, QUEUED, j.skill) for j in jobs],
            )
        except Exception as exc:  # queued in the record: the reconciler enqueues them
            log.warning("enqueue of %d due job(s) failed: %s", len(jobs), exc)
        n += len(jobs)
        if len(jobs) < 500:
            return n


async def run_forever(services: Services, stop: asyncio.Event) -> None:
    """Promote due jobs until ``stop``: wakes at the earliest known ``run_at`` or after the
    poll interval, whichever comes first."""
    poll = services.settings.delayed_poll_sec
    while not stop.is_set():
        wait = poll
        try:
            await promote_once(services)
            nxt = await store.next_run_at(services.sessionmaker)
            if nxt is not None:
                wait = min(poll, max(0.0, nxt - time.time()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("promoting delayed jobs failed: %s: %s", exc.__class__.__name__, exc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(wait, 0.01)):
                await stop.wait()


__all__ = [
    "MAX_DELAY_S",
    "WhenError",
    "clock_time",
    "due_time",
    "iso",
    "parse_duration",
    "parse_instant",
    "promote_once",
    "run_forever",
]
