"""Fairness, concurrency limits and priorities of queued jobs (SPEC §10 ``SKILLJOBS_LIMITS``,
dispatch ``priority``).

Each enqueue carries a job's lane metadata (priority, organisation, and the skill, role and
actor its limits are counted by); ``jobs.queue.broker`` keeps the lanes and slot holdings
in Redis and its claim script applies them. Everything here is derived from the job row,
so the reconciler rebuilds it with every re-enqueue.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jobs.constants import PRIORITY_INTERACTIVE
from jobs.models import QUEUED, Job
from jobs.queue import broker
from jobs.services import Services

#: limit kinds and the metadata field each reads
KINDS = {"skill": "s", "org": "o", "role": "r", "actor": "a"}
MIN_PRIORITY, MAX_PRIORITY = 0, 9


def priority_problem(priority: object) -> str | None:
    """Why ``priority`` is not a valid dispatch priority (None when it is)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        return "priority must be an integer from 0 (first) to 9 (last)"
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        return f"priority {priority} is outside 0 (first) to 9 (last)"
    return None


def meta(
    *, skill: str, org: str = "", actor: str = "", role: str = "", priority: int | None = None
) -> dict[str, Any]:
    """The lane metadata of one enqueue (``sj`` in the arq record)."""
    prio = PRIORITY_INTERACTIVE if priority is None else priority
    return {"l": f"{prio}|{org}", "s": skill, "o": org, "a": actor, "r": role}


def job_meta(job: Any) -> dict[str, Any]:
    """:func:`meta` of a job row."""
    return meta(
        skill=job.skill,
        org=job.org_id or "",
        actor=job.actor_key or "",
        role=job.role_id or "",
        priority=job.priority,
    )


def for_claim(limits: Mapping[str, int]) -> str:
    """The limits as the claim script reads them ('' when there are none)."""
    if not limits:
        return ""
    exact: dict[str, int] = {}
    any_value: dict[str, int] = {}
    for key, n in limits.items():
        kind, _, value = key.partition(":")
        if value == "*":
            any_value[kind] = n
        else:
            exact[key] = n
    # cjson decodes {} as an empty table, which the script indexes safely
    return json.dumps({"exact": exact or {}, "any": any_value or {}})


def keys_for(limits: Mapping[str, int], data: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The ``(limit key, N)`` pairs a job with lane metadata ``data`` needs a slot of (an
    exact key wins over ``KIND:*``)."""
    out = []
    for kind, field in KINDS.items():
        value = data.get(field)
        if not isinstance(value, str) or not value:
            continue
        key = f"{kind}:{value}"
        n = limits.get(key, limits.get(f"{kind}:*"))
        if n is not None:
            out.append((key, n))
    return out


async def waiting_for(services: Services, job: Job) -> str | None:
    """For a queued job: the first full limit it waits for (``"limit org:o1"``), else None."""
    limits = services.settings.limits
    if job.status != QUEUED or not limits or services.redis is None:
        return None
    keys = keys_for(limits, job_meta(job))
    if not keys or not (await broker.waiting(services, [job.arq_job_id or ""]))[0]:
        return None  # not limited, or its entry is claimed (starting now) or lost
    used = await broker.limit_usage(services, [k for k, _ in keys])
    for (key, n), held in zip(keys, used, strict=True):
        if held >= n:
            return f"limit {key}"
    return None


__all__ = [
    "KINDS",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "PRIORITY_INTERACTIVE",
    "for_claim",
    "job_meta",
    "keys_for",
    "meta",
    "priority_problem",
    "waiting_for",
]
