"""lost runs of a chain run

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 12:10:00.000000

How many times a chain run's lease was taken from an attempt that stopped holding it (its
worker died or stalled): like a job's lost runs, they count toward the 3 runs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("chain_runs") as batch:
        batch.add_column(sa.Column("lost_runs", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("chain_runs") as batch:
        batch.drop_column("lost_runs")
