"""``SessionStore``: batched, idempotent writes of events and the history queries built on them."""

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Table, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from maitred.events import Event
from maitred.storage.engine import make_engine
from maitred.storage.fold import fold
from maitred.storage.migrate import upgrade
from maitred.storage.models import EventRow, HandoffRow, LLMCallRow, ProgramRow, ToolCallRow
from maitred.storage.queries import (
    ProgramSummary,
    ProgramTimeline,
    Since,
    ToolStats,
    program_summaries,
    program_timeline,
    to_epoch,
    tool_stats_all,
    tool_stats_one,
)
from maitred.storage.trace import write_trace

_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


class SessionStore:
    """The session history in SQLite (WAL) or PostgreSQL.

    Opening a store brings its schema to the newest migration (``migrate=False`` to skip, e.g.
    when a DBA runs ``maitred db upgrade`` separately). ``write`` is safe to call with a batch
    that was already written: every row is keyed, so nothing is counted twice.
    """

    def __init__(self, url: str, *, migrate: bool = True, connect_timeout_s: float | None = 10.0, echo: bool = False) -> None:
        self.url = url
        self.engine: Engine = make_engine(url, connect_timeout_s=connect_timeout_s, echo=echo)
        self._insert = _INSERTS[self.engine.dialect.name]
        if migrate:
            upgrade(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ---------------------------------------------------------------------------------

    def write(self, events: Iterable[Event]) -> int:
        """Store a batch in one transaction; returns how many distinct events it held."""
        folded = fold(events)
        if not folded.events:
            return 0
        with self.engine.begin() as conn:
            conn.execute(self._insert(EventRow.__table__).on_conflict_do_nothing(index_elements=["event_key"]), folded.events)
            self._upsert(conn, ProgramRow.__table__, ["program_id"], list(folded.programs.values()))
            self._upsert(conn, ToolCallRow.__table__, ["program_id", "call_id"], list(folded.tool_calls.values()))
            self._upsert(conn, LLMCallRow.__table__, ["program_id", "request_id"], list(folded.llm_calls.values()))
            if folded.handoffs:
                conn.execute(self._insert(HandoffRow.__table__).on_conflict_do_nothing(index_elements=["event_key"]), folded.handoffs)
        return len(folded.events)

    def _upsert(self, conn: Any, table: Table, keys: list[str], rows: Sequence[dict[str, Any]]) -> None:
        """Insert rows; on a key clash keep the stored value wherever the new one is NULL."""
        if not rows:
            return
        stmt = self._insert(table)
        columns = [c for c in rows[0] if c not in keys]
        stmt = stmt.on_conflict_do_update(
            index_elements=keys,
            set_={c: func.coalesce(stmt.excluded[c], table.c[c]) for c in columns},
        )
        conn.execute(stmt, rows)

    # -- queries --------------------------------------------------------------------------------

    def tool_stats(
        self, tool: str | None = None, *, since: Since = None, agent: str | None = None, signature: str | None = None,
    ) -> ToolStats | None:
        """Duration statistics of completed calls of one tool (or of all tools when ``tool`` is
        None); None when there are no completed calls to describe."""
        with Session(self.engine) as session:
            return tool_stats_one(session, tool=tool, signature=signature, since=to_epoch(since), agent=agent)

    def tool_stats_all(self, *, since: Since = None, agent: str | None = None, by_signature: bool = False) -> list[ToolStats]:
        """One row per tool (or per tool signature), sorted by name, then the global row (``tool='*'``)."""
        with Session(self.engine) as session:
            return tool_stats_all(session, since=to_epoch(since), agent=agent, by_signature=by_signature)

    def programs(self, *, since: Since = None, limit: int = 100) -> list[ProgramSummary]:
        with Session(self.engine) as session:
            return program_summaries(session, since=to_epoch(since), limit=limit)

    def program(self, program_id: str) -> ProgramTimeline | None:
        """Everything recorded for one program, in time order; None for an unknown id."""
        with Session(self.engine) as session:
            return program_timeline(session, program_id)

    def events(self, program_id: str | None = None) -> list[dict[str, Any]]:
        """The raw event log (wire form), oldest first: what the derived tables are rebuilt from."""
        query = select(EventRow.body).order_by(EventRow.ts, EventRow.id)
        if program_id is not None:
            query = query.where(EventRow.program_id == program_id)
        with Session(self.engine) as session:
            return [json.loads(body) for body in session.scalars(query)]

    def export_trace(self, path: str | Path, *, since: Since = None) -> int:
        """Write the replayable trace (docs/trace-format.md); returns the number of programs."""
        with Session(self.engine) as session:
            return write_trace(session, Path(path), since=to_epoch(since))
