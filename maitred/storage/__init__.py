"""The session store: SQLAlchemy models, Alembic migrations, batched writes and history queries."""

from maitred.storage.engine import normalize_db_url
from maitred.storage.errors import DatabaseCorrupt, DatabaseTooNew, NoSuchDatabase, StoreError, StoreUnavailable
from maitred.storage.queries import ALL_TOOLS, ProgramSummary, ProgramTimeline, Span, ToolStats, parse_since
from maitred.storage.store import Rejected, SessionStore, WriteResult

__all__ = [
    "ALL_TOOLS",
    "DatabaseCorrupt",
    "DatabaseTooNew",
    "NoSuchDatabase",
    "ProgramSummary",
    "ProgramTimeline",
    "Rejected",
    "SessionStore",
    "Span",
    "StoreError",
    "StoreUnavailable",
    "ToolStats",
    "WriteResult",
    "normalize_db_url",
    "parse_since",
]
