"""delayed and one-shot jobs, run-time limits, schedule options

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 01:30:00.000000

* ``jobs.run_at``: when a ``scheduled`` job is due (dispatch ``run_at`` / ``delay_s``). The
  database is the record of delayed jobs: the promoter of every worker moves the due ones to
  the queue, so they survive restarts and the loss of Redis. A partial index holds only the
  rows still waiting for their time.
* ``job_limits``: start-rate and concurrency limits set at run time (``PUT
  /api/v1/limits/{key}``), over ``SKILLJOBS_LIMITS``.
* ``schedules.options``: the schedule-file fields ``at``, ``jitter``, ``quiet_when_empty``
  and ``empty_when``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

WHERE = "status = 'scheduled'"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("run_at", sa.Float(), nullable=True))
    op.create_index(
        "ix_jobs_scheduled_run_at",
        "jobs",
        ["run_at"],
        postgresql_where=sa.text(WHERE),
        sqlite_where=sa.text(WHERE),
    )
    op.create_table(
        "job_limits",
        sa.Column("key", sa.String(length=160), primary_key=True),
        sa.Column("rate", sa.String(length=32), nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False, server_default=""),
    )
    with op.batch_alter_table("schedules") as batch_op:
        batch_op.add_column(
            sa.Column(
                "options",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch_op:
        batch_op.drop_column("options")
    op.drop_table("job_limits")
    op.drop_index("ix_jobs_scheduled_run_at", table_name="jobs")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("run_at")
