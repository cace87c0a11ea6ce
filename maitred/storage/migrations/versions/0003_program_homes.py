"""Program homes: the owning shard, worker and KV tier of each program

Written by the shard that owns a program (not derived from events), so a restarted shard or its
standby resumes placements, and shards can tell which of them owns a program.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 08:45:00
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
        sa.Column("shard", sa.String(256), nullable=False),
        sa.Column("worker", sa.String(1024), nullable=True),
        sa.Column("tier", sa.String(16), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("program_id", name=op.f("pk_program_homes")),
    )
    op.create_index(op.f("ix_program_homes_shard"), "program_homes", ["shard"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_program_homes_shard"), table_name="program_homes")
    op.drop_table("program_homes")
