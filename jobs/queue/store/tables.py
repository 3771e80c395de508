"""The job tables as the store's hot paths use them: Core tables, statements built once."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import (
    ColumnElement,
    literal_column,
)
from sqlalchemy.ext.asyncio import AsyncEngine

from jobs import jsontext
from jobs.db import Sessions, autocommit, engine_of
from jobs.models import (
    QUEUED,
    RUNNING,
    Job,
    JobAttempt,
)
from jobs.queue.lease import Leases, table_of


def arq_id(job_id: str, token: int) -> str:
    """The arq job id of one enqueue of a job: never reused, so arq's "id already exists"
    refusal and a stale entry in ``arq:abort`` can never hit a later attempt."""
    return f"{job_id}:{token}"


job_table = table_of(Job)
attempt_table = table_of(JobAttempt)
#: the leases of jobs (``jobs.queue.lease``, as for chain runs)
LEASES = Leases(job_table, RUNNING)

# Constants are rendered into the SQL (no anonymous parameters), like the claim's status
# (``Leases.claim``).
RUNNING_SQL: ColumnElement[str] = literal_column(f"'{RUNNING}'")
QUEUED_SQL: ColumnElement[str] = literal_column(f"'{QUEUED}'")
NULL_SQL: ColumnElement[None] = literal_column("NULL")
MS_SQL: ColumnElement[float] = literal_column("1000.0")


class RowView:
    """Attribute access to a driver record, like a SQLAlchemy row (``row.skill``): its
    columns copied into the instance once (a claimed job's are read some fifty times on
    its way, each a plain attribute, not a ``__getattr__`` call)."""

    def __init__(self, record: Mapping[str, object]) -> None:
        self.__dict__.update(record.items())


def to_json(value: object) -> str | None:
    """``value`` as JSON text for a ``jsonb`` parameter (None stays NULL)."""
    return None if value is None else jsontext.dumps(value)


def pg_engine(sm: Sessions) -> AsyncEngine | None:
    """An autocommit view of the engine when it is PostgreSQL (same connection pool)."""
    return autocommit(engine_of(sm))
