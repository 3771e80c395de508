"""indexes for the dashboard's job search

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:40:00.000000

The search box matches an id prefix (primary key), a skill or error substring and an
origin session or actor exactly. On PostgreSQL the substrings are served by ``pg_trgm``
GIN indexes (when the extension can be created; without them the search still works, it
scans); the origin columns get plain indexes on every backend.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

log = logging.getLogger(__name__)

TRGM = (("ix_jobs_error_trgm", "error"), ("ix_jobs_skill_trgm", "skill"))


def _trgm_available() -> bool:
    bind = op.get_bind()
    row = bind.execute(
        sa.text("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
    ).first()
    if row is None:
        log.warning("pg_trgm is not installed: job text search will scan")
        return False
    bind.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_trgm"))
    return True


def upgrade() -> None:
    op.create_index("ix_jobs_session_created", "jobs", ["session_id", "created_at"])
    op.create_index("ix_jobs_actor_created", "jobs", ["actor_key", "created_at"])
    if op.get_bind().dialect.name == "postgresql" and _trgm_available():
        for name, column in TRGM:
            op.execute(
                f"CREATE INDEX IF NOT EXISTS {name} ON jobs USING gin ({column} gin_trgm_ops)"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name, _ in TRGM:
            op.execute(f"DROP INDEX IF EXISTS {name}")
    op.drop_index("ix_jobs_actor_created", table_name="jobs")
    op.drop_index("ix_jobs_session_created", table_name="jobs")
