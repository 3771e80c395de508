"""event-loop stalls of each worker

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 11:55:00.000000

The stall detector's figures, written with the worker's heartbeat so /metrics can show
them (and keep them after the worker is gone): how many times its event loop was blocked
past the threshold, and the longest block seen.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("stalls", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(
            sa.Column("longest_stall_s", sa.Float(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("longest_stall_s")
        batch.drop_column("stalls")
