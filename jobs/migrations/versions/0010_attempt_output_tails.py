"""what each attempt printed

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 12:20:00.000000

The tails of each run's stdout and stderr (capped, scrubbed of the job's secret values),
so a job's detail shows what every attempt printed, not only the last one's error.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("stdout_tail", sa.Text(), nullable=True))
        batch.add_column(sa.Column("stderr_tail", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("stderr_tail")
        batch.drop_column("stdout_tail")
