"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 04:03:43.965343
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("event_key", sa.String(length=40), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("program_id", sa.String(length=256), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sa.UniqueConstraint("event_key", name=op.f("uq_events_event_key")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_program_id"), ["program_id"], unique=False)

    op.create_table(
        "handoffs",
        sa.Column("event_key", sa.String(length=40), nullable=False),
        sa.Column("program_id", sa.String(length=256), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("agent", sa.String(length=256), nullable=True),
        sa.Column("from_agent", sa.String(length=256), nullable=False),
        sa.Column("to_agent", sa.String(length=256), nullable=False),
        sa.Column("child_program_id", sa.String(length=256), nullable=True),
        sa.Column("context_tokens", sa.Integer(), nullable=True),
        sa.Column("context_hash", sa.String(length=256), nullable=True),
        sa.Column("n_messages", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("event_key", name=op.f("pk_handoffs")),
    )
    with op.batch_alter_table("handoffs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_handoffs_program_id"), ["program_id"], unique=False)

    op.create_table(
        "llm_calls",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("program_id", sa.String(length=256), nullable=False),
        sa.Column("request_id", sa.String(length=256), nullable=False),
        sa.Column("agent", sa.String(length=256), nullable=True),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("worker", sa.String(length=1024), nullable=True),
        sa.Column("ttft_s", sa.Double(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_llm_calls")),
        sa.UniqueConstraint("program_id", "request_id", name=op.f("uq_llm_calls_program_id_request_id")),
    )
    op.create_table(
        "programs",
        sa.Column("program_id", sa.String(length=256), nullable=False),
        sa.Column("parent_program_id", sa.String(length=256), nullable=True),
        sa.Column("agent", sa.String(length=256), nullable=True),
        sa.Column("framework", sa.String(length=256), nullable=True),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("attrs", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("program_id", name=op.f("pk_programs")),
    )
    with op.batch_alter_table("programs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_programs_started_at"), ["started_at"], unique=False)

    op.create_table(
        "tool_calls",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("program_id", sa.String(length=256), nullable=False),
        sa.Column("call_id", sa.String(length=256), nullable=False),
        sa.Column("agent", sa.String(length=256), nullable=True),
        sa.Column("tool", sa.String(length=256), nullable=True),
        sa.Column("signature", sa.String(length=256), nullable=True),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.Column("deadline_s", sa.Double(), nullable=True),
        sa.Column("background", sa.Boolean(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.Column("progress_fraction", sa.Double(), nullable=True),
        sa.Column("progress_eta_s", sa.Double(), nullable=True),
        sa.Column("progress_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_calls")),
        sa.UniqueConstraint("program_id", "call_id", name=op.f("uq_tool_calls_program_id_call_id")),
    )
    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tool_calls_tool_ended_at"), ["tool", "ended_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tool_calls_tool_ended_at"))

    op.drop_table("tool_calls")
    with op.batch_alter_table("programs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_programs_started_at"))

    op.drop_table("programs")
    op.drop_table("llm_calls")
    with op.batch_alter_table("handoffs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_handoffs_program_id"))

    op.drop_table("handoffs")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_program_id"))

    op.drop_table("events")
