"""The session-history schema: one append-only event log and the tables derived from it.

``events`` is the source of truth (every accepted event, verbatim, keyed by a content hash so a
re-sent batch is stored once); ``programs``, ``tool_calls``, ``llm_calls`` and ``handoffs`` are
the query-friendly views of it, upserted in the same transaction. The Alembic migrations in
``migrations/`` create exactly this (a test compares them).
"""

from sqlalchemy import BigInteger, Boolean, ColumnElement, Double, Index, Integer, MetaData, String, Text, UniqueConstraint, func
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID = String(256)
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
#: 64-bit integers: every count validation accepts fits (``maitred.events`` bounds them to
#: signed 64 bits). SQLite's INTEGER is already 64-bit, and only ``INTEGER PRIMARY KEY``
#: auto-increments there, so SQLite keeps that name; PostgreSQL gets BIGINT.
Int64 = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class EventRow(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    event_key: Mapped[str] = mapped_column(String(40), unique=True)
    type: Mapped[str] = mapped_column(String(32))
    ts: Mapped[float] = mapped_column(Double)
    program_id: Mapped[str] = mapped_column(ID, index=True)
    body: Mapped[str] = mapped_column(Text)


class ProgramRow(Base):
    __tablename__ = "programs"

    program_id: Mapped[str] = mapped_column(ID, primary_key=True)
    parent_program_id: Mapped[str | None] = mapped_column(ID)
    agent: Mapped[str | None] = mapped_column(ID)
    framework: Mapped[str | None] = mapped_column(ID)
    started_at: Mapped[float | None] = mapped_column(Double, index=True)
    ended_at: Mapped[float | None] = mapped_column(Double)
    status: Mapped[str | None] = mapped_column(String(16))
    attrs: Mapped[str | None] = mapped_column(Text)


class ToolCallRow(Base):
    __tablename__ = "tool_calls"
    __table_args__ = (
        UniqueConstraint("program_id", "call_id"),
        Index(None, "tool", "ended_at"),
    )

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    program_id: Mapped[str] = mapped_column(ID)
    call_id: Mapped[str] = mapped_column(ID)
    agent: Mapped[str | None] = mapped_column(ID)
    tool: Mapped[str | None] = mapped_column(ID)
    signature: Mapped[str | None] = mapped_column(ID)
    started_at: Mapped[float | None] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double)
    deadline_s: Mapped[float | None] = mapped_column(Double)
    background: Mapped[bool | None] = mapped_column(Boolean)
    status: Mapped[str | None] = mapped_column(String(16))
    duration_s: Mapped[float | None] = mapped_column(Double)
    progress_fraction: Mapped[float | None] = mapped_column(Double)
    progress_eta_s: Mapped[float | None] = mapped_column(Double)
    progress_at: Mapped[float | None] = mapped_column(Double)

    @hybrid_property
    def elapsed_s(self) -> float | None:
        """The reported duration, else end minus start (None while the call is open)."""
        if self.duration_s is not None:
            return self.duration_s
        if self.ended_at is None or self.started_at is None:
            return None
        return self.ended_at - self.started_at

    @elapsed_s.inplace.expression
    @classmethod
    def _elapsed_s_expression(cls) -> ColumnElement[float]:
        return func.coalesce(cls.duration_s, cls.ended_at - cls.started_at)


class LLMCallRow(Base):
    __tablename__ = "llm_calls"
    __table_args__ = (UniqueConstraint("program_id", "request_id"),)

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    program_id: Mapped[str] = mapped_column(ID)
    request_id: Mapped[str] = mapped_column(ID)
    agent: Mapped[str | None] = mapped_column(ID)
    model: Mapped[str | None] = mapped_column(ID)
    started_at: Mapped[float | None] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double)
    prompt_tokens: Mapped[int | None] = mapped_column(Int64)
    cached_tokens: Mapped[int | None] = mapped_column(Int64)
    completion_tokens: Mapped[int | None] = mapped_column(Int64)
    worker: Mapped[str | None] = mapped_column(String(1024))
    ttft_s: Mapped[float | None] = mapped_column(Double)
    status: Mapped[str | None] = mapped_column(String(16))


class HandoffRow(Base):
    __tablename__ = "handoffs"

    event_key: Mapped[str] = mapped_column(String(40), primary_key=True)
    program_id: Mapped[str] = mapped_column(ID, index=True)
    ts: Mapped[float] = mapped_column(Double)
    agent: Mapped[str | None] = mapped_column(ID)
    from_agent: Mapped[str] = mapped_column(ID)
    to_agent: Mapped[str] = mapped_column(ID)
    child_program_id: Mapped[str | None] = mapped_column(ID)
    context_tokens: Mapped[int | None] = mapped_column(Int64)
    context_hash: Mapped[str | None] = mapped_column(ID)
    n_messages: Mapped[int | None] = mapped_column(Int64)


class ProgramHomeRow(Base):
    """Which shard serves each program now (``maitred serve --shard``): a shard that sees a
    program first claims it here, and learns which shard served it before (``homes``)."""

    __tablename__ = "program_homes"

    program_id: Mapped[str] = mapped_column(ID, primary_key=True)
    shard: Mapped[str] = mapped_column(String(32), index=True)
    updated_at: Mapped[float] = mapped_column(Double)  # seconds since the epoch, by the database's clock
