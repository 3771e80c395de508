"""The job search filter: one set of fields and one meaning for the job list (dashboard
API, ``skilljobs jobs list``) and for bulk actions (``POST /api/v1/jobs/bulk``,
``skilljobs jobs retry|cancel --skill …``), so a bulk action takes exactly the jobs the
list shows for the same filter.

Fields: ``status`` (one or a comma list), ``skill``, ``channel``, ``role`` (``role_id``),
``error_type``, ``since`` / ``until`` (when the job was created: ``2h``, ``30m``, an ISO
time or epoch seconds), ``q`` (text search) and, for bulk actions only, ``incident``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from jobs.models import JOB_STATUSES, Job

FIELDS = ("status", "skill", "channel", "role", "error_type", "since", "until", "q", "incident")
ALIASES = {"role_id": "role"}
MAX_TEXT = 200  # characters of a search text
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.I)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_HEX_ID = re.compile(r"^[0-9a-f]{6,32}$")


def parse_time(value: object, *, now: float | None = None) -> float | None:
    """``2h`` / ``30m`` / ``7d`` (that long ago), an ISO 8601 time, or epoch seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError("a time must be finite")
        return float(value)
    text = str(value)
    span = _SPAN.match(text)
    if span:
        now = time.time() if now is None else now
        return now - float(span.group(1)) * _UNIT[span.group(2).lower()]
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(number):
            return number
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: use 2h, 30m, 7d, an ISO time or epoch seconds"
        ) from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


class FilterError(ValueError):
    """A filter the caller sent cannot be used; ``field`` names the offending field."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def _time_of(data: dict[str, Any], name: str, now: float | None) -> float | None:
    try:
        return parse_time(data.get(name), now=now)
    except ValueError as exc:
        raise FilterError(f"{name}: {exc}", name) from None


@dataclass
class JobFilter:
    """Which jobs: every given field must match."""

    status: tuple[str, ...] = ()
    skill: str | None = None
    channel: str | None = None
    role: str | None = None
    error_type: str | None = None
    since: float | None = None
    until: float | None = None
    q: str | None = None
    incident: str | None = None

    @classmethod
    def parse(cls, data: dict[str, Any], *, now: float | None = None) -> JobFilter:
        """From query parameters, a JSON body or CLI options; ``FilterError`` names what is
        wrong (an unknown field or status, a time that is not one)."""
        data = {ALIASES.get(k, k): v for k, v in data.items()}
        unknown = set(data) - set(FIELDS)
        if unknown:
            raise FilterError(
                f"unknown filter field(s): {', '.join(sorted(unknown))} "
                f"(known: {', '.join(FIELDS)})"
            )
        status = data.get("status") or ()
        statuses = tuple(
            s.strip() for s in (status.split(",") if isinstance(status, str) else status)
        )
        bad = [s for s in statuses if s not in JOB_STATUSES]
        if bad:
            raise FilterError(
                f"unknown status {bad[0]!r}: status must be one of {', '.join(JOB_STATUSES)}",
                "status",
            )
        q = str(data.get("q") or "").strip() or None
        if q and len(q) > MAX_TEXT:
            raise FilterError(f"the search text is longer than {MAX_TEXT} characters", "q")

        def text(name: str) -> str | None:
            value = data.get(name)
            return str(value) if value not in (None, "") else None

        return cls(
            status=tuple(dict.fromkeys(statuses)),
            skill=text("skill"),
            channel=text("channel"),
            role=text("role"),
            error_type=text("error_type"),
            since=_time_of(data, "since", now),
            until=_time_of(data, "until", now),
            q=q,
            incident=text("incident"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, ())}

    async def conditions_in(self, session: AsyncSession) -> list[ColumnElement[bool]]:
        """``conditions()`` for a query in ``session``: the skill names a text search
        matches are looked up first (``skills_containing``), so every branch is indexed."""
        q = (self.q or "").strip()
        if q and not _is_id_prefix(q):
            return self.conditions(await skills_containing(session, like_pattern(q)))
        return self.conditions()

    def conditions(self, skills: Sequence[str] | None = None) -> list[ColumnElement[bool]]:
        """The SQL conditions on ``jobs`` (``incident`` is matched by its caller). Every
        field but ``error_type`` (which only narrows the others) has an index:
        ``(status|skill|channel|role_id, created_at)`` and the text search's (``skills``:
        the skill names the text matches, see ``conditions_in``)."""
        conds: list[ColumnElement[bool]] = []
        if len(self.status) == 1:
            conds.append(Job.status == self.status[0])
        elif self.status:
            conds.append(Job.status.in_(self.status))
        for column, value in (
            (Job.skill, self.skill),
            (Job.channel, self.channel),
            (Job.role_id, self.role),
            (Job.error_type, self.error_type),
        ):
            if value:
                conds.append(column == value)
        if self.since is not None:
            conds.append(Job.created_at >= self.since)
        if self.until is not None:
            conds.append(Job.created_at < self.until)
        if self.q:
            conds.append(text_match(self.q, skills))
        return conds


async def skills_containing(session: AsyncSession, pattern: str) -> list[str]:
    """The distinct skill names of ``jobs`` that match ``pattern`` (an escaped, case-
    insensitive ``LIKE`` pattern), found by a skip-scan of ``ix_jobs_skill_created``: one
    index probe per distinct name (a few dozen), whatever the number of jobs.

    The job search then looks the jobs up by those names through the same index. A trigram
    index on ``skill`` served this before; it cost a GIN entry on every version of every job
    row (three per job) for a column with few distinct values (migration 0015). The names
    are resolved first, in their own statement, so the planner sees them: an ``ANY`` of a
    sub-select would be estimated as matching most of the table."""
    lowest, later = Job.__table__.alias("lowest"), Job.__table__.alias("later")
    names = select(func.min(lowest.c.skill).label("name")).cte("skill_names", recursive=True)
    step = select(
        select(func.min(later.c.skill)).where(later.c.skill > names.c.name).scalar_subquery()
    ).where(names.c.name.is_not(None))
    names = names.union_all(step)
    found = await session.execute(
        select(names.c.name).where(names.c.name.ilike(pattern, escape="\\"))
    )
    return [name for (name,) in found]


def _is_id_prefix(q: str) -> bool:
    return bool(_HEX_ID.match(q.lower()))


def like_pattern(q: str) -> str:
    """``q`` as a ``LIKE … ESCAPE '\\'`` substring pattern (``%`` and ``_`` literal)."""
    return "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def text_match(q: str, skills: Sequence[str] | None = None) -> ColumnElement[bool]:
    """``q`` that looks like a job id (6–32 hex digits) is an id-prefix lookup on the
    primary key; anything else is a case-insensitive substring of skill or error, or
    exactly the job id, origin session or actor. ``skills``: the skill names that contain
    ``q`` (``skills_containing``), so that branch is an index lookup by name; without them
    it is a substring match of every row's skill. Every branch has an index (the skill
    names ``ix_jobs_skill_created``, the error ``pg_trgm`` on PostgreSQL, migration 0006)."""
    q = q.strip()
    if _is_id_prefix(q):
        prefix = q.lower()
        # Both bounds are hex-only strings, so every collation orders them alike.
        return and_(Job.id >= prefix.ljust(32, "0"), Job.id <= prefix.ljust(32, "f"))
    pattern = like_pattern(q)
    return or_(
        Job.id == q,
        Job.skill.ilike(pattern, escape="\\") if skills is None else Job.skill.in_(skills),
        Job.error.ilike(pattern, escape="\\"),
        Job.session_id == q,
        Job.actor_key == q,
    )
