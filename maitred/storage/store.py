"""``SessionStore``: batched, idempotent writes of events and the history queries built on them."""

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, Table, bindparam, func, inspect, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from maitred.events import Event, EventError, decode_event
from maitred.storage.engine import IMMEDIATE, AnswerDeadline, make_engine, normalize_db_url, sqlite_path
from maitred.storage.errors import (
    DatabaseTooNew,
    NoSuchDatabase,
    StoreError,
    StoreUnavailable,
    describe,
    is_content_error,
    translate,
)
from maitred.storage.fold import Folded, column_refusal, fold, key_floor, refusal_reason
from maitred.storage.migrate import current_revision, head_revision, known_revision, upgrade
from maitred.storage.models import Base, EventRow, ProgramRow
from maitred.storage.queries import (
    ProgramSummary,
    ProgramTimeline,
    Since,
    ToolStats,
    program_family,
    program_summaries,
    program_timeline,
    to_epoch,
    tool_stats_all,
    tool_stats_one,
)
from maitred.storage.trace import write_trace

_TABLES = Base.metadata.tables


@dataclass(frozen=True, slots=True)
class Rejected:
    """An event the database refused, by position in the batch given to ``write``; ``reason``
    starts with the field, e.g. ``prompt_tokens: out of range for the database``."""

    index: int
    type: str
    reason: str


@dataclass(slots=True)
class WriteResult:
    """``stored``: distinct events of the batch now in the store (those already there count:
    writes are idempotent); ``rejected``: the events refused for their content, in input order."""

    stored: int
    rejected: list[Rejected] = field(default_factory=list)


class SessionStore:
    """The session history in SQLite (WAL) or PostgreSQL.

    Opening a store brings its schema to the newest migration (``migrate=False`` to skip, e.g.
    when a DBA runs ``maitred db upgrade`` separately, or to read a database a newer maitred
    wrote); ``create=False`` refuses to create a database that is not there. ``url`` may be a
    plain file path. ``write`` is safe to call with a batch that was already written: every row
    is keyed, so nothing is counted twice. Every failure is a ``StoreError`` (see ``errors``).

    On PostgreSQL no call waits for ever on a server that accepted the connection and then
    went silent (see ``AnswerDeadline``): connecting is bounded by ``connect_timeout_s`` (when
    None, by psycopg's default of 130 s), then a ``write`` waits at most ``write_timeout_s``
    for each answer, and opening the store (the schema check and migrations) and every query
    at most ``read_timeout_s``; past that they raise ``StoreUnavailable`` naming the server and
    the bound, and the same store works again once the server answers. SQLite's wait for a
    lock is bounded by its busy timeout.

    Reads get their own bound, not the writes': a writer is an emitter that keeps its batch and
    retries, a reader is a person at ``maitred programs`` or a gateway starting up, and a
    deployment may want them to wait differently. Both default to 30 s: the clock restarts at
    every statement, so it bounds one answer, and no answer of a healthy server to this
    store's statements comes near that — the largest, the durations of every completed tool
    call for ``tool_stats_all``, is one scan of one table returning three columns — while a
    person still learns within half a minute that the server is not answering.
    """

    def __init__(
        self,
        url: str,
        *,
        migrate: bool = True,
        create: bool = True,
        connect_timeout_s: float | None = 10.0,
        write_timeout_s: float = 30.0,
        read_timeout_s: float = 30.0,
        echo: bool = False,
    ) -> None:
        for name, seconds in (("write_timeout_s", write_timeout_s), ("read_timeout_s", read_timeout_s)):
            if not seconds > 0:
                raise ValueError(f"{name} must be positive seconds, got {seconds!r}")
        self.write_timeout_s = write_timeout_s
        self.read_timeout_s = read_timeout_s
        self.url = normalize_db_url(url)
        self.where = describe(self.url)
        path = sqlite_path(self.url)
        if path is not None and not create and not path.exists():
            raise NoSuchDatabase(f"no such database: {path}")
        self.engine: Engine = make_engine(self.url, connect_timeout_s=connect_timeout_s, echo=echo)
        self._writer = self.engine.execution_options(**{IMMEDIATE: True})
        self._postgres = self.engine.dialect.name == "postgresql"
        #: upsert statements by (table, key columns, columns): building one walks the table's
        #: columns and was 16% of a busy gateway's CPU when made for every write
        self._upserts: dict[tuple[str, tuple[str, ...], tuple[str, ...]], postgresql.Insert | sqlite.Insert] = {}
        self._deadline = AnswerDeadline(self.engine) if self._postgres else None
        try:
            with self._reading():
                if not create:
                    self._require_existing()
                if migrate:
                    upgrade(self.engine)
        except BaseException:
            self.engine.dispose()
            raise

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """Opening, queries and checks: bounded by ``read_timeout_s``, and database errors leave
        as one-line ``StoreError``s naming this database."""
        try:
            with self._bounded(self.read_timeout_s):
                yield
        except SQLAlchemyError as exc:
            raise translate(exc, self.url) from exc

    @contextmanager
    def _bounded(self, seconds: float) -> Iterator[None]:
        """On PostgreSQL, a wait of more than ``seconds`` for the server's answer is an outage."""
        if self._deadline is None:
            yield
            return
        with self._deadline.watch(seconds) as watch:
            try:
                yield
            except Exception as exc:
                if watch.expired:
                    raise StoreUnavailable(f"database unavailable: {self.where} (no answer within {seconds:g} s)") from exc
                raise

    def _require_existing(self) -> None:
        with self.engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
        if not tables & ({"alembic_version"} | set(_TABLES)):
            raise NoSuchDatabase(f"no such database: {self.where} (it holds no maitred tables)")

    # -- writes ---------------------------------------------------------------------------------

    def write(self, events: Iterable[Event]) -> WriteResult:
        """Store a batch in one transaction. When the database refuses it for what it holds,
        the events holding values no column can take are set aside, and what the database
        still refuses is split in halves until the refused events are alone: they are reported
        in ``rejected``, the rest is stored. An outage raises ``StoreUnavailable`` (keep the
        batch and retry: nothing is stored twice). A batch nobody refuses pays for none of this."""
        batch = list(events)
        folded = fold(batch)
        rejected = [Rejected(index, batch[index].TYPE, reason) for index, reason in folded.refused]
        if not folded.events:
            return WriteResult(0, rejected)
        try:
            self._write_rows(folded)
        except Exception as exc:
            if not is_content_error(exc):
                raise translate(exc, self.url) from exc
        else:
            return WriteResult(len(folded.events), rejected)
        refused = {index for index, _ in folded.refused}
        remaining: list[int] = []
        for index in range(len(batch)):
            if index in refused:
                continue
            reason = column_refusal(batch[index], nul_ok=not self._postgres)
            if reason is None:
                remaining.append(index)
            else:
                rejected.append(Rejected(index, batch[index].TYPE, reason))
        stored: set[str] = set()
        self._store_or_split(batch, remaining, stored, rejected)
        rejected.sort(key=lambda r: r.index)
        return WriteResult(len(stored), rejected)

    def _store_or_split(self, batch: list[Event], indices: list[int], stored: set[str], rejected: list[Rejected]) -> None:
        """Store the events at ``indices`` in one transaction; if the database refuses them for
        their content, bisect, down to single events, which are reported. Halves go in input
        order, so later events still win on the rows they share."""
        if not indices:
            return
        folded = fold(batch[i] for i in indices)
        try:
            self._write_rows(folded)
        except Exception as exc:
            if not is_content_error(exc):
                raise translate(exc, self.url) from exc
            if len(indices) == 1:
                event = batch[indices[0]]
                rejected.append(Rejected(indices[0], event.TYPE, refusal_reason(event, exc)))
                return
            middle = len(indices) // 2
            self._store_or_split(batch, indices[:middle], stored, rejected)
            self._store_or_split(batch, indices[middle:], stored, rejected)
        else:
            stored.update(row["event_key"] for row in folded.events)

    def _write_rows(self, folded: Folded) -> None:
        with self._bounded(self.write_timeout_s), self._writer.begin() as conn:
            conn.execute(self._insert(_TABLES["events"]).on_conflict_do_nothing(index_elements=["event_key"]), folded.events)
            self._upsert(conn, _TABLES["programs"], ["program_id"], list(folded.programs.values()))
            self._reopen(conn, folded)
            self._upsert(conn, _TABLES["tool_calls"], ["program_id", "call_id"], list(folded.tool_calls.values()))
            self._place_starts(conn, [k for k, row in folded.tool_calls.items() if row["ended_at"] or row["started_at"]])
            self._upsert(conn, _TABLES["llm_calls"], ["program_id", "request_id"], list(folded.llm_calls.values()))
            if folded.handoffs:
                conn.execute(
                    self._insert(_TABLES["handoffs"]).on_conflict_do_nothing(index_elements=["event_key"]), folded.handoffs
                )

    def _place_starts(self, conn: Connection, ended: list[tuple[str, str]]) -> None:
        """A tool call never ends before it starts. A start is stamped when its event was made,
        and hook processes race (Claude Code's: a fast call's end can be stamped first), while
        the end's ``duration_s`` is measured by the agent itself: a start later than the end less
        that duration moves back to it (to the end itself when no duration was given)."""
        if not ended:
            return
        t = _TABLES["tool_calls"]
        placed = t.c.ended_at - func.coalesce(t.c.duration_s, 0.0)
        for i in range(0, len(ended), 500):
            keys = tuple_(t.c.program_id, t.c.call_id).in_(ended[i : i + 500])
            conn.execute(update(t).where(keys, t.c.started_at > placed).values(started_at=placed))

    def _reopen(self, conn: Connection, folded: Folded) -> None:
        """Programs started again after an end stored earlier: the upsert keeps a stored value
        wherever the new one is NULL, so their stored end and status are cleared here."""
        started = [
            {"pid": row["program_id"], "started": row["started_at"]}
            for row in folded.programs.values()
            if row["started_at"] is not None and row["ended_at"] is None
        ]
        if started:
            table = _TABLES["programs"]
            conn.execute(
                update(table)
                .where(table.c.program_id == bindparam("pid"), table.c.ended_at <= bindparam("started"))
                .values(ended_at=None, status=None),
                started,
            )

    def _insert(self, table: Table) -> postgresql.Insert | sqlite.Insert:
        return postgresql.insert(table) if self._postgres else sqlite.insert(table)

    def _upsert(self, conn: Connection, table: Table, keys: list[str], rows: Sequence[dict[str, Any]]) -> None:
        """Insert rows; on a key clash keep the stored value wherever the new one is NULL."""
        if not rows:
            return
        columns = tuple(c for c in rows[0] if c not in keys)
        shape = (table.name, tuple(keys), columns)
        upsert = self._upserts.get(shape)
        if upsert is None:
            stmt = self._insert(table)
            upsert = self._upserts[shape] = stmt.on_conflict_do_update(
                index_elements=keys,
                set_={c: func.coalesce(stmt.excluded[c], table.c[c]) for c in columns},
            )
        conn.execute(upsert, rows)

    # -- health ---------------------------------------------------------------------------------

    def check_integrity(self) -> list[str]:
        """Problems found, one line each; empty when the database is sound. SQLite's file is
        checked page by page (``PRAGMA integrity_check``); on both backends the version stamp
        and the schema are compared with what this maitred expects."""
        problems: list[str] = []
        try:
            with self._reading(), self.engine.connect() as conn:
                if not self._postgres:
                    verdict = list(conn.exec_driver_sql("PRAGMA integrity_check").scalars())
                    if verdict != ["ok"]:
                        problems += [f"{self.where}: integrity check: {line}" for line in verdict]
                        return problems
                problems += self._schema_problems(conn)
        except StoreError as exc:
            problems.append(str(exc))
        return problems

    def revision(self) -> str | None:
        """The schema's stamped migration revision; None for a database never migrated."""
        with self._reading(), self.engine.connect() as conn:
            return current_revision(conn)

    def _schema_problems(self, conn: Connection) -> list[str]:
        revision = current_revision(conn)
        if revision is None:
            return [f"{self.where}: no maitred version stamp (run `maitred db upgrade`)"]
        if not known_revision(revision):
            return [f"{self.where}: {DatabaseTooNew(revision)}"]
        head = head_revision()
        if revision != head:
            return [f"{self.where}: schema at revision {revision}, this maitred writes {head} (run `maitred db upgrade`)"]
        missing = sorted(set(_TABLES) - set(inspect(conn).get_table_names()))
        if missing:
            return [f"{self.where}: missing tables: {', '.join(missing)}"]
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        return [f"{self.where}: schema differs from revision {revision}: {change}" for change in diff]

    # -- queries --------------------------------------------------------------------------------

    def tool_stats(
        self,
        tool: str | None = None,
        *,
        since: Since = None,
        agent: str | None = None,
        signature: str | None = None,
    ) -> ToolStats | None:
        """Duration statistics of completed calls of one tool (or of all tools when ``tool`` is
        None); None when there are no completed calls to describe."""
        with self._reading(), Session(self.engine) as session:
            return tool_stats_one(session, tool=tool, signature=signature, since=to_epoch(since), agent=agent)

    def tool_stats_all(self, *, since: Since = None, agent: str | None = None, by_signature: bool = False) -> list[ToolStats]:
        """One row per tool (or per tool signature), sorted by name, then the global row (``tool='*'``)."""
        with self._reading(), Session(self.engine) as session:
            return tool_stats_all(session, since=to_epoch(since), agent=agent, by_signature=by_signature)

    def programs(self, *, since: Since = None, limit: int = 100) -> list[ProgramSummary]:
        with self._reading(), Session(self.engine) as session:
            return program_summaries(session, since=to_epoch(since), limit=limit)

    def program(self, program_id: str) -> ProgramTimeline | None:
        """Everything recorded for one program, in time order; None for an unknown id."""
        with self._reading(), Session(self.engine) as session:
            return program_timeline(session, program_id)

    def program_family(self, program_id: str, *, limit: int = 1000) -> list[ProgramTimeline]:
        """The program's timeline, then its descendants' (at most ``limit`` programs in all);
        empty for an unknown id."""
        with self._reading(), Session(self.engine) as session:
            return program_family(session, program_id, limit=limit)

    def events(self, program_id: str | None = None) -> list[dict[str, Any]]:
        """The raw event log (wire form), oldest first: what the derived tables are rebuilt from."""
        query = select(EventRow.body).order_by(EventRow.ts, EventRow.id)
        if program_id is not None:
            query = query.where(EventRow.program_id == program_id)
        with self._reading(), Session(self.engine) as session:
            return [json.loads(body) for body in session.scalars(query)]

    def open_program_events(self, since: float) -> list[Event]:
        """The events stamped at or after ``since`` of programs not ended, oldest first: what a
        gateway replays at start to rebuild its live state (``RuntimeState.restore``). Found
        through the ``event_key`` index (keys lead with the time), so the cost follows the
        recent events, not the whole log. A stored body that no longer decodes is skipped."""
        open_programs = select(ProgramRow.program_id).where(ProgramRow.ended_at.is_(None))
        query = (
            select(EventRow.body)
            .where(EventRow.event_key >= key_floor(since), EventRow.program_id.in_(open_programs))
            .order_by(EventRow.ts, EventRow.id)
        )
        out = []
        with self._reading(), Session(self.engine) as session:
            for body in session.scalars(query):
                try:
                    out.append(decode_event(json.loads(body), now=math.inf))
                except (EventError, ValueError):
                    continue
        return out

    def export_trace(self, path: str | Path, *, since: Since = None) -> int:
        """Write the replayable trace (docs/trace-format.md); returns the number of programs."""
        with self._reading(), Session(self.engine) as session:
            return write_trace(session, Path(path), since=to_epoch(since))
