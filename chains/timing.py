"""When a schedule fires: its cron (moved by its ``jitter``) or its one ``at`` time.

The schedule file gives ``cron`` (five fields) or ``at`` (one-shot: an ISO 8601 time, read
in the schedule's timezone when it has no offset, or epoch seconds), and optionally
``jitter: 30s``. The jitter offset is derived from the schedule's name (a hash), so every
worker computes the same fire times and exactly-once firing holds; two schedules at
``0 9 * * *`` with a jitter fire at different seconds of 09:00–09:00:30. The scheduler reads
one expression of ``chains.cron`` for all of it (:func:`expr_of`).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any
from zoneinfo import ZoneInfo

from chains.cron import next_fire

MAX_JITTER_S = 3600.0


def jitter_offset(name: str, jitter_s: float) -> float:
    """The schedule's fixed offset in ``[0, jitter_s)`` seconds (whole seconds)."""
    if jitter_s < 1:
        return 0.0
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return float(digest % int(jitter_s))


def expr_of(cron: str, options: dict[str, Any] | None) -> str:
    """The ``chains.cron`` expression a stored schedule fires by."""
    opts = options or {}
    if opts.get("at_epoch") is not None:
        return f"at:{float(opts['at_epoch'])!r}"
    offset = float(opts.get("jitter_offset_s") or 0)
    return f"{cron} ~{offset:g}" if offset else cron


def next_time(cron: str, options: dict[str, Any] | None, tz: str, after: float) -> float | None:
    """The first fire time after ``after`` (None: a one-shot schedule that has fired)."""
    t = next_fire(expr_of(cron, options), ZoneInfo(tz), after)
    return t if math.isfinite(t) else None


__all__ = ["MAX_JITTER_S", "expr_of", "jitter_offset", "next_time"]
