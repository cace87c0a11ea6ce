"""What the store raises, and how a database error is sorted into one of three kinds.

The sorting decides what happens to a batch: a *content* error (the database refuses a value:
out of range, a NUL byte, a broken constraint) isolates the offending events and stores the
rest; an *outage* (refused or lost connection, timeout, lock, full disk, read-only file) is
raised so the caller keeps the batch and retries; a corrupt file is raised as such because
retrying cannot help. Every error the store raises is a ``StoreError`` with a one-line message
that names the database, never a driver traceback or an SQL dump.
"""

import re
import sqlite3
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url


class StoreError(Exception):
    """The base of every error the store raises; the message is one line, fit for a terminal."""


class NoSuchDatabase(StoreError):
    """Opening with ``create=False`` found nothing to open."""


class DatabaseTooNew(StoreError):
    """The schema carries an Alembic revision this maitred does not know: a newer one wrote it."""

    def __init__(self, revision: str) -> None:
        super().__init__(f"this database was written by a newer maitred (revision {revision})")
        self.revision = revision


class DatabaseCorrupt(StoreError):
    """The database file is damaged (SQLite reported it malformed or not a database)."""


class StoreUnavailable(StoreError):
    """The database cannot take the request now (down, unreachable, locked, full, read-only);
    the same request may succeed later, so a writer keeps its batch and retries."""


#: SQLite result codes (``sqlite3.Error.sqlite_errorname``) that mean the file is damaged.
_CORRUPT = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
#: ... and those that mean the database refused what it was given.
_SQLITE_CONTENT = {"SQLITE_TOOBIG", "SQLITE_CONSTRAINT", "SQLITE_MISMATCH", "SQLITE_RANGE"}
#: PostgreSQL SQLSTATE classes for refused content: data exception, integrity constraint
#: violation, program limit exceeded (an index row too big).
_PG_CONTENT_CLASSES = ("22", "23", "54")
#: How PostgreSQL refuses a connection to a database that is not there.
_PG_NO_DATABASE = re.compile(r'FATAL:\s+database ".*" does not exist')


def describe(url: str) -> str:
    """The database as a person would name it: the file path, or the URL without its password."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.database or ":memory:"
    return parsed.render_as_string(hide_password=True)


def _sqlite_code(error: BaseException) -> str | None:
    """The primary result code (``SQLITE_CONSTRAINT`` for ``SQLITE_CONSTRAINT_NOTNULL``)."""
    orig = getattr(error, "orig", error)
    name = getattr(orig, "sqlite_errorname", None) if isinstance(orig, sqlite3.Error) else None
    return "_".join(name.split("_")[:2]) if name else None


def is_content_error(error: BaseException) -> bool:
    """True when the database refused the batch for what it holds (so splitting it helps)."""
    if isinstance(error, (OverflowError, ValueError, TypeError)):
        return True  # the driver could not convert a value (an int beyond 64 bits for sqlite3)
    if isinstance(error, sa_exc.StatementError) and not isinstance(error, sa_exc.DBAPIError):
        return True  # a bind parameter failed to process
    if not isinstance(error, sa_exc.DBAPIError) or error.connection_invalidated:
        return False
    code = _sqlite_code(error)
    if code is not None:
        return code in _SQLITE_CONTENT
    sqlstate = getattr(error.orig, "sqlstate", None)
    if sqlstate:
        return str(sqlstate)[:2] in _PG_CONTENT_CLASSES
    # No verdict from the server: the driver refused a value before sending it (a type it
    # cannot bind, like a list where a name belongs).
    return isinstance(error, (sa_exc.DataError, sa_exc.IntegrityError, sa_exc.ProgrammingError))


def first_line(error: BaseException) -> str:
    """The driver's own message without SQLAlchemy's SQL, parameters and link."""
    orig: Any = getattr(error, "orig", None) or error
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


def translate(error: BaseException, url: str) -> StoreError:
    """A one-line ``StoreError`` naming the database, for any failure that is not the content's."""
    if isinstance(error, StoreError):
        return error
    where = describe(url)
    message = first_line(error)
    code = _sqlite_code(error)
    if code in _CORRUPT:
        return DatabaseCorrupt(f"database is corrupt: {where} ({message})")
    if code == "SQLITE_READONLY":
        return StoreUnavailable(f"database is read-only: {where} ({message})")
    if code == "SQLITE_CANTOPEN":
        return StoreUnavailable(f"cannot open database: {where} ({message})")
    if code == "SQLITE_FULL":
        return StoreUnavailable(f"database or disk is full: {where}")
    if _PG_NO_DATABASE.search(message):
        return NoSuchDatabase(f"no such database: {where}")
    if isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError)) or code is not None:
        return StoreUnavailable(f"database unavailable: {where} ({message})")
    return StoreError(f"{where}: {message}")
