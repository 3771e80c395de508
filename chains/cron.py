"""Five-field cron expressions (minute hour day-of-month month day-of-week) evaluated in an
IANA timezone, with well-defined behaviour across daylight-saving changes.

* Fields accept ``*``, lists ``a,b``, ranges ``a-b``, steps ``*/n`` / ``a-b/n`` / ``a/n``,
  month names ``jan``–``dec`` and weekday names ``sun``–``sat``; weekday ``7`` is Sunday.
* Vixie day rule: when both day-of-month and day-of-week are restricted (neither starts
  with ``*``), a day matches if *either* matches; otherwise both must.
* Spring forward: a local time inside the gap does not exist; it fires once, at the first
  valid instant after the gap (the transition itself).
* Fall back: a local time that occurs twice fires once, at its first occurrence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

__all__ = [
    "NEVER",
    "CronError",
    "CronExpr",
    "fires_between",
    "latest_fire",
    "next_fire",
    "parse",
]

_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# How far ahead a search may look before the expression is declared unsatisfiable
# (covers leap-day-only expressions such as "0 0 29 2 *").
_SEARCH_YEARS = 9


class CronError(ValueError):
    """A cron expression that cannot be parsed or can never fire."""


@dataclass(frozen=True)
class CronExpr:
    source: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday … 6 = Saturday
    dom_restricted: bool
    dow_restricted: bool
    #: seconds every fire time is moved by (a schedule's ``jitter``; ``"<cron> ~<s>"``)
    offset: float = 0.0
    #: a one-shot schedule's only fire time (``at:<epoch>``); the fields are then unused
    at: float | None = None

    def day_matches(self, day: datetime) -> bool:
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        if self.dom_restricted and self.dow_restricted:
            return dom or dow
        return dom and dow


def _value(text: str, pos: int, name: str, lo: int, hi: int) -> int:
    names = _MONTHS if pos == 4 else _DAYS if pos == 5 else {}
    low = text.lower()
    if low in names:
        return names[low]
    if not text.isdigit():
        raise CronError(f"cron field {pos} ({name}) value {text!r} is not a number")
    value = int(text)
    if not lo <= value <= hi:
        raise CronError(f"cron field {pos} ({name}) value {value} is out of range {lo}-{hi}")
    return value


def _field(text: str, pos: int) -> set[int]:
    name, lo, hi = _FIELDS[pos - 1]
    out: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"cron field {pos} ({name}) has an empty list item in {text!r}")
        base, _, step_text = part.partition("/")
        step = 1
        if _:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(
                    f"cron field {pos} ({name}) step {step_text!r} must be a positive number"
                )
            step = int(step_text)
        if base == "*":
            start, end = lo, hi
        elif "-" in base:
            a, _, b = base.partition("-")
            start, end = _value(a, pos, name, lo, hi), _value(b, pos, name, lo, hi)
            if start > end:
                raise CronError(f"cron field {pos} ({name}) range {base!r} runs backwards")
        else:
            start = _value(base, pos, name, lo, hi)
            end = hi if _ else start  # "a/n" means a, a+n, … up to the maximum
        out.update(range(start, end + 1, step))
    if pos == 5 and 7 in out:
        out.discard(7)
        out.add(0)
    return out


#: the fire time after a one-shot schedule's only one
NEVER = math.inf


@lru_cache(maxsize=4096)
def parse(expr: str) -> CronExpr:
    """Parse a five-field expression; raises :class:`CronError` naming the bad field.

    Two forms the schedule store writes (``chains.timing``) are read too: ``at:<epoch>``
    (one fire time) and ``"<five fields> ~<seconds>"`` (every fire time moved by the
    schedule's jitter offset)."""
    if not isinstance(expr, str):
        raise CronError("cron expression must be a string")
    if expr.startswith("at:"):
        try:
            at = float(expr[3:])
        except ValueError:
            raise CronError(f"one-shot time {expr!r} is not epoch seconds") from None
        empty: frozenset[int] = frozenset()
        return CronExpr(expr, empty, empty, empty, empty, empty, False, False, at=at)
    if "~" in expr:
        base, _, off = expr.rpartition("~")
        try:
            offset = float(off)
        except ValueError:
            raise CronError(f"cron offset in {expr!r} is not a number of seconds") from None
        return replace(parse(base.strip()), source=expr, offset=offset)
    parts = expr.split()
    if len(parts) != 5:
        raise CronError(
            f"cron expression {expr!r} has {len(parts)} fields; expected 5: "
            "minute hour day-of-month month day-of-week"
        )
    values = [_field(p, i) for i, p in enumerate(parts, 1)]
    cron = CronExpr(
        source=expr,
        minutes=frozenset(values[0]),
        hours=frozenset(values[1]),
        days=frozenset(values[2]),
        months=frozenset(values[3]),
        weekdays=frozenset(values[4]),
        dom_restricted=not parts[2].startswith("*"),
        dow_restricted=not parts[4].startswith("*"),
    )
    if not any(d <= _max_days(m) for m in cron.months for d in cron.days) and not (
        cron.dom_restricted and cron.dow_restricted
    ):
        raise CronError(f"cron expression {expr!r} can never fire (no such day in those months)")
    return cron


def _max_days(month: int) -> int:
    return 29 if month == 2 else 30 if month in (4, 6, 9, 11) else 31


def _next_local(cron: CronExpr, t: datetime) -> datetime:
    """First naive local wall-clock time >= ``t`` (minute resolution) matching ``cron``."""
    limit = t.year + _SEARCH_YEARS
    while t.year <= limit:
        if t.month not in cron.months:
            t = (t.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            continue
        if not cron.day_matches(t):
            t = t.replace(hour=0, minute=0) + timedelta(days=1)
            continue
        if t.hour not in cron.hours:
            later = [h for h in cron.hours if h > t.hour]
            if later:
                t = t.replace(hour=min(later), minute=0)
            else:
                t = t.replace(hour=0, minute=0) + timedelta(days=1)
            continue
        if t.minute not in cron.minutes:
            later = [m for m in cron.minutes if m > t.minute]
            if later:
                t = t.replace(minute=min(later))
            else:
                t = t.replace(minute=0) + timedelta(hours=1)
            continue
        return t
    raise CronError(f"cron expression {cron.source!r} does not fire within {_SEARCH_YEARS} years")


def _instant(local: datetime, tz: ZoneInfo) -> float:
    """The epoch time a naive local wall-clock time fires at (see the module rules)."""
    first = local.replace(tzinfo=tz, fold=0)
    ts = first.timestamp()
    if datetime.fromtimestamp(ts, tz).replace(tzinfo=None) == local:
        return ts  # exists; for an ambiguous time fold=0 is the first occurrence
    # Inside a gap: fold=1 reads it with the offset after the change (an instant before
    # the transition), fold=0 with the offset before (one after). Search between them.
    lo = local.replace(tzinfo=tz, fold=1).timestamp()
    hi = ts
    lo, hi = min(lo, hi), max(lo, hi)
    off_lo = datetime.fromtimestamp(lo, tz).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == off_lo:
            lo = mid
        else:
            hi = mid
    return float(hi)


def next_fire(expr: str | CronExpr, tz: ZoneInfo, after: float) -> float:
    """The first fire instant (epoch seconds) strictly later than ``after``."""
    cron = parse(expr) if isinstance(expr, str) else expr
    if cron.at is not None:
        return cron.at if cron.at > after else NEVER
    if cron.offset:
        base = replace(cron, offset=0.0)
        return next_fire(base, tz, after - cron.offset) + cron.offset
    local = datetime.fromtimestamp(after, tz).replace(tzinfo=None, second=0, microsecond=0)
    # If ``after`` is in the second pass of a repeated hour, the naive times around it
    # map to earlier instants (first occurrences) and are skipped by the check below.
    t = _next_local(cron, local)
    while True:
        ts = _instant(t, tz)
        if ts > after:
            return ts
        t = _next_local(cron, t + timedelta(minutes=1))


def fires_between(
    expr: str | CronExpr, tz: ZoneInfo, start: float, end: float, *, limit: int = 100_000
) -> list[float]:
    """Fire instants in ``(start, end]``, oldest first (at most ``limit``)."""
    out: list[float] = []
    t = start
    while len(out) < limit:
        t = next_fire(expr, tz, t)
        if t > end:
            break
        out.append(t)
    return out


def latest_fire(expr: str | CronExpr, tz: ZoneInfo, since: float, now: float) -> float | None:
    """The latest fire instant in ``[since, now]`` — used to coalesce missed fires after
    downtime into one run without walking every missed minute."""
    window = 3600.0
    while True:
        start = max(since - 1e-6, now - window)
        fires = fires_between(expr, tz, start, now, limit=10_000)
        if fires:
            return fires[-1]
        if start <= since:
            return None
        window *= 4


def to_utc_iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()
