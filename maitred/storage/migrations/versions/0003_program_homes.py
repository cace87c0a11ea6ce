"""Program homes: which shard serves each program

Shards on one PostgreSQL claim the programs they serve, so the shard a program left learns it
moved (``maitred.gateway.shard_link``). The table exists on SQLite too, where nothing writes it,
so both databases keep one schema.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 14:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "program_homes",
        sa.Column("program_id", sa.String(256), nullable=False),
        sa.Column("shard", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("program_id", name=op.f("pk_program_homes")),
    )
    op.create_index(op.f("ix_program_homes_shard"), "program_homes", ["shard"])


def downgrade() -> None:
    op.drop_index(op.f("ix_program_homes_shard"), table_name="program_homes")
    op.drop_table("program_homes")
