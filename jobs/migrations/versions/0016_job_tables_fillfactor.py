"""jobs and job_attempts leave room on each page for the next versions of their rows

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 13:00:00.000000

A job's row is written three times (recorded, claimed, finished) and its attempt's twice;
on PostgreSQL each update writes a new version of the row. With full pages (fill factor
100) the new version goes to another page: the old one is marked by a separate lock record
in the WAL, and the update touches two heap pages. At fill factor 70 the next versions of
a freshly inserted row find room on its own page (measured on the no-op drain: lock
records 2.8 → 1.2 per job, WAL −5 %; the front door's rate and tail under load did not
change beyond the run-to-run spread). Applies to pages filled from now on; existing
pages are not rewritten (``VACUUM FULL`` would, under an exclusive lock: not done here).
PostgreSQL only.
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

TABLES = ("jobs", "job_attempts")
FILLFACTOR = 70  # jobs.models.UPDATED_ROWS_FILLFACTOR when this revision was written


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
