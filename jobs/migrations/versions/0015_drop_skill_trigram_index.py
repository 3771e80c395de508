"""the skill-name search walks the distinct skill names instead of a trigram index

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 12:40:00.000000

``ix_jobs_skill_trgm`` (migration 0006, PostgreSQL with ``pg_trgm``) served one branch of
the job search: a substring of the skill name. It cost a GIN entry (and, with GIN's pending
list, a periodic merge inside whichever transaction overflowed it) for every version of
every job row — three per job — for a column with a few dozen distinct values. The search
now finds the matching names by a skip-scan of ``ix_jobs_skill_created`` (one probe per
distinct name) and looks the jobs up by those names through the same index
(``jobs.queue.filters.skills_containing``): same results, no entry per row version.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

INDEX = "ix_jobs_skill_trgm"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP INDEX IF EXISTS {INDEX}")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    # only where migration 0006 could create it: pg_trgm is installed in this database
    if bind.execute(sa.text("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")).first():
        op.execute(f"CREATE INDEX IF NOT EXISTS {INDEX} ON jobs USING gin (skill gin_trgm_ops)")
