"""the lease, finish-time and error-text indexes of jobs hold only rows where the column is set

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 08:30:00.000000

A job's row is written three times (recorded queued, claimed running, finished), and on
PostgreSQL each version is a new entry in every index of the table (its status changes,
so no update is HOT). ``lease_expires_at`` is set only while a lease is held,
``finished_at`` only once the job is done, ``error`` only when it failed: their indexes now
hold only those rows (partial indexes, ``… IS NOT NULL``). Every query on them is a range
(``lease_expires_at < t``: the reaper; ``finished_at >= t`` / ``< t``: the dashboard's
windows, the series, retention) or a text match (``error ILIKE …``), each of which implies
the column is not NULL, so the planner uses them as before. A job that succeeds writes 7
index entries fewer (the lease index once instead of three times, the finish index once
instead of three times, the error trigram index never instead of three times).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

BTREE = (("ix_jobs_lease_expires_at", "lease_expires_at"), ("ix_jobs_finished", "finished_at"))
TRGM = "ix_jobs_error_trgm"


def _has_index(name: str) -> bool:
    return name in {i["name"] for i in sa.inspect(op.get_bind()).get_indexes("jobs")}


def _rebuild(partial: bool) -> None:
    for name, column in BTREE:
        where = sa.text(f"{column} IS NOT NULL") if partial else None
        op.drop_index(name, table_name="jobs")
        op.create_index(name, "jobs", [column], postgresql_where=where, sqlite_where=where)
    # the trigram index exists only where pg_trgm was available (migration 0006)
    if op.get_bind().dialect.name == "postgresql" and _has_index(TRGM):
        op.execute(f"DROP INDEX {TRGM}")
        where = " WHERE error IS NOT NULL" if partial else ""
        op.execute(f"CREATE INDEX {TRGM} ON jobs USING gin (error gin_trgm_ops){where}")


def upgrade() -> None:
    _rebuild(partial=True)


def downgrade() -> None:
    _rebuild(partial=False)
