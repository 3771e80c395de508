"""configuration generation

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 19:00:00.000000

One counter that every change of ``skill_configs`` moves on (a trigger, so writes from any
process or by hand count too). The dispatch intake keeps the configurations it baked into
jobs together with the generation they were read at, and records a batch of jobs only if
that generation is still the current one (checked inside the batch's own statement), so a
cached configuration is never recorded after it changed.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_PG_FUNCTION = """
CREATE FUNCTION skilljobs_config_generation_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE config_generation SET generation = generation + 1 WHERE id = 1;
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "config_generation",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
    )
    op.execute("INSERT INTO config_generation (id, generation) VALUES (1, 0)")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        op.execute(
            "CREATE TRIGGER skill_configs_generation AFTER INSERT OR UPDATE OR DELETE "
            "ON skill_configs FOR EACH STATEMENT "
            "EXECUTE FUNCTION skilljobs_config_generation_bump()"
        )
        op.execute(
            "CREATE TRIGGER skill_configs_generation_truncate AFTER TRUNCATE "
            "ON skill_configs FOR EACH STATEMENT "
            "EXECUTE FUNCTION skilljobs_config_generation_bump()"
        )
        return
    for event in ("INSERT", "UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER skill_configs_generation_{event.lower()} AFTER {event} "
            "ON skill_configs BEGIN "
            "UPDATE config_generation SET generation = generation + 1 WHERE id = 1; END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS skill_configs_generation ON skill_configs")
        op.execute("DROP TRIGGER IF EXISTS skill_configs_generation_truncate ON skill_configs")
        op.execute("DROP FUNCTION IF EXISTS skilljobs_config_generation_bump()")
    else:
        for event in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS skill_configs_generation_{event}")
    op.drop_table("config_generation")
