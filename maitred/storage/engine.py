"""Engines for the two supported databases, tuned for an append-heavy event log."""

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url


def make_engine(url: str, *, connect_timeout_s: float | None = None, echo: bool = False) -> Engine:
    """SQLite gets WAL (readers never block the writer) and a busy timeout; PostgreSQL goes
    through psycopg 3 (a bare ``postgresql://`` URL is taken to mean that driver)."""
    parsed = make_url(url)
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        if connect_timeout_s is not None:
            connect_args["connect_timeout"] = max(1, int(connect_timeout_s))
    elif parsed.get_backend_name() == "sqlite":
        connect_args["timeout"] = 30.0
    else:
        raise ValueError(f"unsupported database {parsed.get_backend_name()!r} in {url!r}: use sqlite:/// or postgresql://")
    engine = create_engine(parsed, connect_args=connect_args, echo=echo, pool_pre_ping=True)
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
