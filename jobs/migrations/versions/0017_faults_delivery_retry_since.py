"""deliveries remember when an outage first stopped them (the retry window starts there)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 01:40:00.000000

A send that meets a 5xx, a connection error or a timeout before its request went out is
tried again from the outbox for a window (``SKILLJOBS_DELIVERY_RETRY_WINDOW_SEC``, per
channel ``…_WINDOWS``) counted from its first such failure: ``retry_since``. Null while the
row has met none (and again after a resend).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deliveries") as batch_op:
        batch_op.add_column(sa.Column("retry_since", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch_op:
        batch_op.drop_column("retry_since")
