"""Incidents: failed jobs grouped by signature, so 300 failures read as one problem.

The signature is the skill, the error type and the error text with what varies between
occurrences normalised away (paths, URLs, ids, hex digests, numbers). A failure of a known
signature adds to its count and samples and re-opens it if it was acknowledged.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from jobs import audit
from jobs.db import Sessions, engine_of, rowcount
from jobs.models import Incident, IncidentStatus, new_id

log = logging.getLogger("skilljobs.incidents")

OPEN, ACKED = IncidentStatus.OPEN, IncidentStatus.ACKED
SAMPLES = 10  # newest job ids kept per incident
PATTERN_CHARS = 500

# Order matters: wider shapes first, so a path's digits are not numbers of their own.
_NORMALISERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[a-z][a-z0-9+.\-]*://\S+", re.I), "<url>"),
    (re.compile(r"(?:[A-Za-z]:\\|~?/)[^\s'\"(),;:]+"), "<path>"),
    (
        re.compile(r"\b[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}\b", re.I),
        "<id>",
    ),
    (re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b", re.I), "<id>"),
    (re.compile(r"\b[A-Za-z]+_[A-Za-z0-9]*\d[A-Za-z0-9]*\b"), "<id>"),  # ou_123, job_9f
    (re.compile(r"[-+]?\d+(?:[.,:]\d+)*"), "<n>"),
)
_SPACES = re.compile(r"\s+")


def normalise(text: str | None) -> str:
    """The error text with numbers, ids, URLs and paths replaced by placeholders."""
    out = text or ""
    for pattern, placeholder in _NORMALISERS:
        out = pattern.sub(placeholder, out)
    return _SPACES.sub(" ", out).strip()[:PATTERN_CHARS]


def signature(skill: str, error_type: str | None, error: str | None) -> str:
    key = "\x00".join((skill, error_type or "", normalise(error)))
    return hashlib.sha256(key.encode()).hexdigest()


def _insert(sm: Sessions) -> Any:
    return pg_insert if engine_of(sm).dialect.name == "postgresql" else sqlite_insert


async def record_failure(
    sm: Sessions,
    job_id: str,
    skill: str,
    error_type: str | None,
    error: str | None,
    *,
    now: float | None = None,
) -> str:
    """Count one failed job under its incident (created or re-opened); the incident id."""
    now = time.time() if now is None else now
    sig = signature(skill, error_type, error)
    bump = (
        update(Incident)
        .where(Incident.signature == sig)
        .values(
            count=Incident.count + 1,
            # concurrent failures commit in any order: first/last seen stay the min/max
            first_seen=case((Incident.first_seen > now, now), else_=Incident.first_seen),
            last_seen=case((Incident.last_seen < now, now), else_=Incident.last_seen),
            status=OPEN,
        )
        .returning(Incident.id, Incident.sample_job_ids)
    )
    for _ in range(2):
        async with sm() as s:
            # The UPDATE locks the row (PostgreSQL) or the database (SQLite) until the
            # commit, so the samples' read-modify-write below cannot lose an update.
            row = (await s.execute(bump)).first()
            if row is not None:
                # a job that fails again (a retry) is one sample, moved to the newest place
                kept = [j for j in (row.sample_job_ids or []) if j != job_id]
                samples = [*kept, job_id][-SAMPLES:]
                await s.execute(
                    update(Incident).where(Incident.id == row.id).values(sample_job_ids=samples)
                )
                await s.commit()
                return str(row.id)
            values = {
                "id": new_id(),
                "signature": sig,
                "skill": skill,
                "error_type": error_type or "",
                "pattern": normalise(error),
                "sample_error": (error or "")[:2000],
                "count": 1,
                "sample_job_ids": [job_id],
                "status": OPEN,
                "first_seen": now,
                "last_seen": now,
                "acked_by": "",
            }
            ins = _insert(sm)(Incident).values(values).on_conflict_do_nothing()
            inserted = rowcount(await s.execute(ins))
            await s.commit()
            if inserted == 1:
                return str(values["id"])
        # another worker created it meanwhile: count this failure on it
    raise RuntimeError(f"incident {sig[:12]} could not be recorded")


async def note_failure(
    sm: Sessions, job_id: str, skill: str, error_type: str | None, error: str | None
) -> None:
    """:func:`record_failure` for the place that finishes jobs: never raises (the job's
    own record is what matters; a lost incident count is only logged)."""
    try:
        await record_failure(sm, job_id, skill, error_type, error)
    except Exception as exc:
        log.warning("job %s: failure not counted in its incident: %s", job_id, exc)


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def to_dict(row: Incident) -> dict[str, Any]:
    return {
        "id": row.id,
        "skill": row.skill,
        "error_type": row.error_type,
        "pattern": row.pattern,
        "sample_error": row.sample_error,
        "count": row.count,
        "status": row.status,
        "first_seen": row.first_seen,
        "last_seen": row.last_seen,
        "first_seen_iso": _iso(row.first_seen),
        "last_seen_iso": _iso(row.last_seen),
        # newest first, each job once (rows written before samples were de-duplicated)
        "sample_job_ids": list(dict.fromkeys(reversed(row.sample_job_ids or []))),
        "acked_at": row.acked_at,
        "acked_by": row.acked_by,
    }


async def list_incidents(
    sm: Sessions, *, status: str | None = None, skill: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Incidents, most recently seen first."""
    q = select(Incident).order_by(Incident.last_seen.desc()).limit(limit)
    if status:
        q = q.where(Incident.status == status)
    if skill:
        q = q.where(Incident.skill == skill)
    async with sm() as s:
        return [to_dict(r) for r in (await s.execute(q)).scalars()]


async def get_incident(sm: Sessions, incident_id: str) -> Incident | None:
    async with sm() as s:
        return await s.get(Incident, incident_id)


async def ack(
    sm: Sessions, incident_id: str, *, actor: str = "", now: float | None = None
) -> dict[str, Any]:
    """Acknowledge an incident (a later failure of its signature re-opens it)."""
    now = time.time() if now is None else now
    async with sm() as s:
        res = await s.execute(
            update(Incident)
            .where(Incident.id == incident_id)
            .values(status=ACKED, acked_at=now, acked_by=actor[:128])
        )
        if rowcount(res) != 1:
            raise LookupError(f"no incident {incident_id!r}")
        audit.record(s, action="incident.ack", target=incident_id, actor=actor)
        await s.commit()
        row = await s.get(Incident, incident_id)
    assert row is not None
    return to_dict(row)


async def open_incidents(sm: Sessions) -> list[tuple[str, str, str, int]]:
    """(id, skill, error_type, count) of every open incident — for the metrics."""
    async with sm() as s:
        q = (
            select(Incident.id, Incident.skill, Incident.error_type, Incident.count)
            .where(Incident.status == OPEN)
            .order_by(Incident.last_seen.desc())
            .limit(500)
        )
        rows = (await s.execute(q)).all()
    return [(str(i), str(sk), str(et), int(n)) for i, sk, et, n in rows]


async def count_open(sm: Sessions) -> int:
    async with sm() as s:
        q = select(func.count()).select_from(Incident).where(Incident.status == OPEN)
        return int((await s.execute(q)).scalar_one())
