"""schedule fire policies (misfire, overlap, alert, auto-pause) and incidents

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 09:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import Text
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("misfire", JSON, nullable=True))
        batch_op.add_column(sa.Column("overlap", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("alert", JSON, nullable=True))
        batch_op.add_column(sa.Column("paused_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("alerted_at", sa.Float(), nullable=True))
    op.create_table(
        "incidents",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("signature", sa.String(length=64), nullable=False),
        sa.Column("skill", sa.String(length=128), nullable=False),
        sa.Column("error_type", sa.String(length=32), nullable=False),
        sa.Column("pattern", sa.Text(), nullable=False),
        sa.Column("sample_error", sa.Text(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("sample_job_ids", JSON, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("acked_at", sa.Float(), nullable=True),
        sa.Column("acked_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("signature"),
    )
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.create_index("ix_incidents_status_last", ["status", "last_seen"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_index("ix_incidents_status_last")
    op.drop_table("incidents")
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_column("alerted_at")
        batch_op.drop_column("paused_reason")
        batch_op.drop_column("alert")
        batch_op.drop_column("overlap")
        batch_op.drop_column("misfire")
