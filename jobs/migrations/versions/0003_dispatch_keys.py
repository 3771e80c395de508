"""idempotency keys of background dispatches

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 09:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dispatch_keys",
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_index("ix_dispatch_keys_created_at", "dispatch_keys", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_dispatch_keys_created_at", table_name="dispatch_keys")
    op.drop_table("dispatch_keys")
