"""64-bit token and message counts

Validation accepts any count that fits a signed 64-bit integer; PostgreSQL's INTEGER stops at
2**31 - 1, so one large ``prompt_tokens`` made the database refuse its whole batch. SQLite's
INTEGER is already 64-bit, so only PostgreSQL changes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 13:45:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COUNTS = {
    "llm_calls": ("prompt_tokens", "cached_tokens", "completion_tokens"),
    "handoffs": ("context_tokens", "n_messages"),
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in COUNTS.items():
        for column in columns:
            op.alter_column(table, column, type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=True)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in COUNTS.items():
        for column in columns:
            op.alter_column(table, column, type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=True)
