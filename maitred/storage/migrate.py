"""Run the Alembic migrations shipped inside the package (``maitred db upgrade``).

Every upgrade is all-or-nothing and runs one process at a time: the whole chain of migrations
runs in a single transaction (transactional DDL on SQLite and PostgreSQL alike), behind a lock
(SQLite's write lock via ``BEGIN IMMEDIATE``; a PostgreSQL advisory lock per schema). A process
killed mid-migration therefore leaves the previous schema intact, and several processes opening
a new database at once create it exactly once, quietly.

Two states are refused or repaired before any migration runs: a version stamp this build does
not know (a newer maitred wrote the database: ``DatabaseTooNew``), and tables without a stamp,
left by earlier versions that created tables one statement at a time. Those are adopted when
they are exactly the first revision's, dropped and recreated when they hold no rows, and named
in a ``StoreError`` otherwise.
"""

from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, MetaData, create_engine, func, inspect, select, text

from maitred.storage.engine import IMMEDIATE
from maitred.storage.errors import DatabaseTooNew, StoreError, describe

MIGRATIONS = Path(__file__).with_name("migrations")
FIRST_REVISION = "0001"


def alembic_config(engine: Engine) -> Config:
    """A config that needs no alembic.ini: the engine's connection is handed to ``env.py``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


@cache
def scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS))


def head_revision() -> str:
    head = scripts().get_current_head()
    assert head is not None, "the package ships at least one migration"
    return head


def known_revision(revision: str) -> bool:
    return revision in {script.revision for script in scripts().walk_revisions()}


def current_revision(engine_or_conn: Engine | Connection) -> str | None:
    """The stamped revision; None for a database maitred never finished migrating."""
    if isinstance(engine_or_conn, Engine):
        with engine_or_conn.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    return MigrationContext.configure(engine_or_conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision``; a no-op (one query) when it is already there."""
    current = current_revision(engine)
    if current is not None and not known_revision(current):
        raise DatabaseTooNew(current)
    target = head_revision() if revision == "head" else revision
    if current == target:
        return
    command.upgrade(alembic_config(engine), revision)


def run_in_env(context: EnvironmentContext | ModuleType, metadata: MetaData) -> None:
    """The body of ``env.py`` (``context`` is Alembic's module-level proxy of the running
    ``EnvironmentContext``): lock, check what is there, migrate, all in one transaction."""
    engine: Engine = context.config.attributes["engine"]
    with engine.connect() as plain:
        conn = plain.execution_options(**{IMMEDIATE: True})
        with conn.begin():
            _lock(conn)
            current = current_revision(conn)
            if current is not None and not known_revision(current):
                raise DatabaseTooNew(current)
            context.configure(connection=conn, target_metadata=metadata, render_as_batch=True, transactional_ddl=True)
            if current is None:
                adopt_unstamped(conn, context.get_context(), where=describe(engine.url.render_as_string(hide_password=False)))
            with context.begin_transaction():
                context.run_migrations()


def _lock(conn: Connection) -> None:
    """SQLite holds its write lock since ``BEGIN IMMEDIATE``; PostgreSQL needs an advisory
    lock, per schema, released with the transaction."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('maitred.migrate:' || current_schema()))"))


@cache
def first_revision_shape() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Table -> (column names, index names) as the first migration creates them, built by
    running it on an in-memory SQLite: the migration itself is the reference, not a copy."""
    module = scripts().get_revision(FIRST_REVISION).module
    engine = create_engine("sqlite://")
    with engine.begin() as conn:
        with Operations.context(MigrationContext.configure(conn)):
            module.upgrade()
        return _shape(conn, inspect(conn).get_table_names())


def _shape(conn: Connection, tables: Any) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    inspector = inspect(conn)
    return {
        table: (
            frozenset(c["name"] for c in inspector.get_columns(table)),
            # Unique constraints show up as indexes on PostgreSQL only; they are compared as columns.
            frozenset(str(i["name"]) for i in inspector.get_indexes(table) if not i.get("duplicates_constraint")),
        )
        for table in tables
    }


def adopt_unstamped(conn: Connection, migration: MigrationContext, *, where: str) -> None:
    """Repair a schema that has maitred's tables but no version stamp (see the module doc)."""
    present = set(inspect(conn).get_table_names()) - {"alembic_version"}
    if not present:
        return  # a new database: the common case, decided without building the reference
    reference = first_revision_shape()
    found = sorted(present & set(reference))
    if not found:
        return
    shape = _shape(conn, found)
    if shape == reference:
        migration.stamp(scripts(), FIRST_REVISION)
        return
    with_rows = [t for t in found if conn.scalar(select(func.count()).select_from(text(f'"{t}"')))]
    if with_rows:
        differences = _differences(shape, reference)
        raise StoreError(
            f"{where}: maitred tables without a version stamp that do not match its first schema revision "
            f"({differences}) and hold rows ({', '.join(with_rows)}); move the database aside or repair it by hand"
        )
    for table in found:  # empty leftovers of an interrupted first run: start over
        conn.execute(text(f'DROP TABLE "{table}"'))


def _differences(
    shape: dict[str, tuple[frozenset[str], frozenset[str]]], reference: dict[str, tuple[frozenset[str], frozenset[str]]]
) -> str:
    parts: list[str] = []
    missing = sorted(set(reference) - set(shape))
    if missing:
        parts.append("missing tables " + ", ".join(missing))
    for table in sorted(shape):
        columns, indexes = shape[table]
        want_columns, want_indexes = reference[table]
        if columns != want_columns:
            parts.append(f"{table} columns differ: {', '.join(sorted(columns ^ want_columns))}")
        if indexes != want_indexes:
            parts.append(f"{table} indexes differ: {', '.join(sorted(indexes ^ want_indexes))}")
    return "; ".join(parts)
