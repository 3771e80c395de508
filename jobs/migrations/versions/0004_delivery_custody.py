"""delivery custody: generations, receipts, stored content

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("generation", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("message_id", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("verified", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("note", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("sent_as", sa.String(length=16), nullable=True))
        batch_op.add_column(
            sa.Column(
                "content",
                sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        for name in ("content", "sent_as", "note", "verified", "message_id", "generation"):
            batch_op.drop_column(name)
