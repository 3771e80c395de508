"""indexes for failed jobs by skill and for the audit trail by action

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 19:10:00.000000

``ix_jobs_failures_skill``: ``(skill, status, created_at)`` of failed and timed-out jobs
only (a partial index). It serves a bulk retry's dry-run count and the job list for one
skill's failures (``skill=x&status=failed``) without intersecting the ``skill`` and
``status`` indexes. Only rows that are failed or timed out have an entry, so a worker
claiming and finishing jobs successfully never writes to it.

``ix_ops_actions_action``: ``(action, id)``, for the retention totals on ``/metrics``
(the latest ``prune`` entries) and the audit page filtered by action.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

FAILURES = sa.text("status IN ('failed', 'timed_out')")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_failures_skill",
        "jobs",
        ["skill", "status", "created_at"],
        postgresql_where=FAILURES,
        sqlite_where=FAILURES,
    )
    op.create_index("ix_ops_actions_action", "ops_actions", ["action", "id"])


def downgrade() -> None:
    op.drop_index("ix_ops_actions_action", table_name="ops_actions")
    op.drop_index("ix_jobs_failures_skill", table_name="jobs")
