"""The session store: SQLAlchemy models, Alembic migrations, batched writes and history queries."""

from maitred.storage.queries import ALL_TOOLS, ProgramSummary, ProgramTimeline, Span, ToolStats, parse_since
from maitred.storage.store import SessionStore

__all__ = ["ALL_TOOLS", "ProgramSummary", "ProgramTimeline", "SessionStore", "Span", "ToolStats", "parse_since"]
