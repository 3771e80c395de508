"""Start-rate and concurrency limits changed at run time (``/api/v1/limits``).

``SKILLJOBS_LIMITS`` gives concurrency limits at start; the ``job_limits`` table adds, per
key (``skill:<name>``, ``org:<id>``, ``role:<id>``, ``actor:<key>``, or ``KIND:*``), a start
rate (``"2/10s"``: a token bucket of 2 refilled at 2 per 10 s — runs start at that pace,
in bursts of at most 2) and/or a concurrency
limit that overrides the setting's. Every change is audited. Workers read the table every
``SKILLJOBS_LIMITS_REFRESH_SEC`` and hand it to the claim script (``jobs.queue.broker``),
which keeps one token bucket per key in Redis, shared by all workers: a job over the rate
stays queued until a token is there, never fails. A bucket Redis lost is rebuilt from the
database (the runs started within the last period) before any job of its key starts.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select

from jobs import audit
from jobs.db import Sessions
from jobs.models import QUEUED, Job, JobAttempt, JobLimit
from jobs.queue import broker
from jobs.services import Services

KINDS = ("skill", "org", "role", "actor")
_RATE = re.compile(
    r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|sec|second|m|min|minute|h|hour|d|day)?\s*$",
    re.IGNORECASE,
)
_UNIT_S = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
COLUMNS = {"skill": Job.skill, "org": Job.org_id, "role": Job.role_id, "actor": Job.actor_key}
MAX_CONCURRENCY = 100_000


class LimitError(ValueError):
    """A limit key or value that cannot be used (the message says why)."""


@dataclass(frozen=True)
class Rate:
    count: int
    per_s: float

    @property
    def text(self) -> str:
        return f"{self.count}/{self.per_s:g}s"


def parse_rate(text: str) -> Rate:
    """``"2/10s"``, ``"30/m"``, ``"100/h"``, ``"5/s"``, ``"1/2.5s"``."""
    m = _RATE.match(str(text))
    if m is None:
        raise LimitError(
            f"rate {text!r}: use COUNT/PERIOD, e.g. 2/10s, 30/m, 100/h (at most COUNT runs "
            "start in any PERIOD)"
        )
    count = int(m.group(1))
    per = float(m.group(2) or 1) * _UNIT_S[(m.group(3) or "s").lower()]
    if count < 1 or per <= 0:
        raise LimitError(f"rate {text!r}: the count and the period must be more than 0")
    return Rate(count, per)


def check_key(key: str) -> str:
    kind, _, value = key.partition(":")
    if kind not in KINDS or not value or len(key) > 160:
        raise LimitError(
            f"limit key {key!r}: use skill:NAME, org:ID, role:ID or actor:KEY (or KIND:* for "
            "each value), as in SKILLJOBS_LIMITS"
        )
    return key


def check_concurrency(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CONCURRENCY:
        raise LimitError(f"concurrency {n!r}: a whole number from 1 to {MAX_CONCURRENCY}")
    return n


# --- the record -------------------------------------------------------------------------


def row_dict(row: JobLimit) -> dict[str, Any]:
    return {
        "key": row.key,
        "rate": row.rate,
        "concurrency": row.concurrency,
        "updated_at": row.updated_at,
        "updated_by": row.updated_by,
    }


async def rows(sm: Sessions) -> list[JobLimit]:
    async with sm() as s:
        return list(await s.scalars(select(JobLimit).order_by(JobLimit.key)))


async def set_limit(
    sm: Sessions,
    key: str,
    *,
    rate: str | None = None,
    concurrency: int | None = None,
    actor: str = "",
) -> JobLimit:
    """Set the rate and/or concurrency of ``key`` (a field not given keeps its value)."""
    check_key(key)
    if rate is None and concurrency is None:
        raise LimitError("give a rate (e.g. 2/10s) and/or a concurrency (e.g. 3)")
    if rate is not None:
        rate = parse_rate(rate).text
    if concurrency is not None:
        check_concurrency(concurrency)
    now = time.time()
    async with sm() as s:
        row = await s.get(JobLimit, key)
        before = None if row is None else row_dict(row)
        if row is None:
            row = JobLimit(key=key, rate=rate, concurrency=concurrency)
            s.add(row)
        else:
            if rate is not None:
                row.rate = rate
            if concurrency is not None:
                row.concurrency = concurrency
        row.updated_at, row.updated_by = now, actor[:128]
        after = {"rate": row.rate, "concurrency": row.concurrency}
        audit.record(
            s,
            "limits.set",
            key,
            actor,
            {"before": before and {k: before[k] for k in after}, "after": after},
        )
        await s.commit()
        await s.refresh(row)
        return row


async def unset_limit(sm: Sessions, key: str, *, actor: str = "") -> bool:
    """Remove the run-time limit of ``key`` (``SKILLJOBS_LIMITS`` applies again)."""
    check_key(key)
    async with sm() as s:
        row = await s.get(JobLimit, key)
        if row is None:
            return False
        before = {"rate": row.rate, "concurrency": row.concurrency}
        await s.execute(delete(JobLimit).where(JobLimit.key == key))
        audit.record(s, "limits.unset", key, actor, {"before": before})
        await s.commit()
    return True


# --- what the claim script applies -------------------------------------------------------


@dataclass(frozen=True)
class Effective:
    concurrency: dict[str, int]
    rates: dict[str, Rate]
    source: dict[str, str]  # key -> "settings" | "runtime"


def effective(settings_limits: Mapping[str, int], found: list[JobLimit]) -> Effective:
    """``SKILLJOBS_LIMITS`` with the run-time rows over it."""
    concurrency = dict(settings_limits)
    source = dict.fromkeys(settings_limits, "settings")
    rates: dict[str, Rate] = {}
    for row in found:
        source[row.key] = "runtime"
        if row.concurrency is not None:
            concurrency[row.key] = row.concurrency
        if row.rate:
            try:
                rates[row.key] = parse_rate(row.rate)
            except LimitError:
                continue  # written by hand past the API: ignored, not a crash of every claim
    return Effective(concurrency, rates, source)


def for_claim(eff: Effective) -> str:
    """The limits as the claim script reads them ('' when there are none)."""
    if not eff.concurrency and not eff.rates:
        return ""
    out: dict[str, dict[str, Any]] = {"exact": {}, "any": {}, "rate": {}, "rate_any": {}}
    for key, n in eff.concurrency.items():
        kind, _, value = key.partition(":")
        if value == "*":
            out["any"][kind] = n
        else:
            out["exact"][key] = n
    for key, r in eff.rates.items():
        kind, _, value = key.partition(":")
        spec = [r.count, round(r.per_s * 1000)]
        if value == "*":
            out["rate_any"][kind] = spec
        else:
            out["rate"][key] = spec
    return json.dumps(out)


async def current(services: Services) -> Effective:
    return effective(services.settings.limits, await rows(services.sessionmaker))


def rate_for(eff: Effective, key: str) -> Rate | None:
    kind = key.partition(":")[0]
    return eff.rates.get(key) or eff.rates.get(f"{kind}:*")


async def started_since(sm: Sessions, key: str, since: float) -> int:
    """Runs of ``key``'s jobs started at or after ``since`` (the record of the bucket)."""
    kind, _, value = key.partition(":")
    async with sm() as s:
        n = await s.scalar(
            select(func.count())
            .select_from(JobAttempt)
            .join(Job, Job.id == JobAttempt.job_id)
            .where(JobAttempt.started_at >= since, COLUMNS[kind] == value)
        )
    return int(n or 0)


async def rebuild_once(services: Services, eff: Effective) -> list[str]:
    """Rebuild every bucket a claim found missing: its tokens are the rate's count less the
    runs of its key started within the last period (the database is the record)."""
    done = []
    for key in await broker.buckets_to_rebuild(services):
        rate = rate_for(eff, key)
        now = time.time()
        tokens = 0.0
        if rate is not None:
            used = await started_since(services.sessionmaker, key, now - rate.per_s)
            tokens = float(max(0, rate.count - used))
        await broker.rebuild_bucket(services, key, tokens, int(now * 1000))
        done.append(key)
    return done


async def levels(services: Services, eff: Effective) -> dict[str, float | None]:
    """Tokens left now per rated key that has a bucket (None: none yet)."""
    keys = sorted(eff.rates)
    found = await broker.bucket_levels(services, keys)
    now_ms = time.time() * 1000
    out: dict[str, float | None] = {}
    for key, level in zip(keys, found, strict=True):
        if level is None:
            out[key] = None
            continue
        r = eff.rates[key]
        tokens, at = level
        out[key] = min(float(r.count), tokens + (now_ms - at) * r.count / (r.per_s * 1000))
    return out


async def items(svc: Services) -> list[dict[str, Any]]:
    """Every key with a limit in force: its rate, concurrency, where it comes from, the
    tokens left in its bucket and the slots held now."""
    found = await rows(svc.sessionmaker)
    eff = effective(svc.settings.limits, found)
    by_key = {r.key: r for r in found}
    keys = sorted(set(eff.source))
    tokens_left = await levels(svc, eff)
    exact = [k for k in keys if not k.endswith(":*")]
    held = dict(zip(exact, await broker.limit_usage(svc, exact), strict=True))
    out = []
    for key in keys:
        row = by_key.get(key)
        rate = eff.rates.get(key)
        out.append(
            {
                "key": key,
                "rate": rate.text if rate else None,
                "rate_per_s": rate.count / rate.per_s if rate else None,
                "concurrency": eff.concurrency.get(key),
                "source": eff.source[key],
                "tokens": tokens_left.get(key),
                "running": held.get(key),
                "updated_at": row.updated_at if row else None,
                "updated_by": row.updated_by if row else None,
            }
        )
    return out


async def waiting_for(services: Services, job: Job) -> str | None:
    """For a queued job: the first limit it waits for — a full concurrency limit (``"limit
    org:o1"``) or an empty start-rate bucket (``"rate skill:img"``) — else None."""
    if job.status != QUEUED or services.redis is None:
        return None
    eff = await current(services)
    if not eff.concurrency and not eff.rates:
        return None
    if not (await broker.waiting(services, [job.arq_job_id or ""]))[0]:
        return None  # its entry is claimed (starting now) or lost
    values = {
        "skill": job.skill,
        "org": job.org_id or "",
        "role": job.role_id or "",
        "actor": job.actor_key or "",
    }
    keys = [f"{kind}:{v}" for kind, v in values.items() if v]
    limited = [
        (k, n)
        for k in keys
        if (n := eff.concurrency.get(k, eff.concurrency.get(k.split(":")[0] + ":*")))
    ]
    if limited:
        used = await broker.limit_usage(services, [k for k, _ in limited])
        for (key, n), held in zip(limited, used, strict=True):
            if held >= n:
                return f"limit {key}"
    rated = [k for k in keys if rate_for(eff, k) is not None]
    if rated:
        found = await broker.bucket_levels(services, rated)
        now_ms = time.time() * 1000
        for key, level in zip(rated, found, strict=True):
            r = rate_for(eff, key)
            assert r is not None
            if level is None:
                return f"rate {key}"  # being rebuilt from the database
            tokens, at = level
            if tokens + (now_ms - at) * r.count / (r.per_s * 1000) < 1:
                return f"rate {key}"
    return None


__all__ = [
    "Effective",
    "LimitError",
    "Rate",
    "check_key",
    "current",
    "effective",
    "for_claim",
    "items",
    "levels",
    "parse_rate",
    "rebuild_once",
    "rows",
    "set_limit",
    "unset_limit",
    "waiting_for",
]
