"""Engines for the two supported databases, tuned for an append-heavy event log."""

import os
import re
import socket
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from maitred.storage.errors import StoreError

_URL_HINT = "give a file path, sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
#: ``name:`` or ``name://`` at the start: meant as a URL, never a file name.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
#: Connection option: open the next transaction with ``BEGIN IMMEDIATE`` (SQLite's write lock).
IMMEDIATE = "maitred_begin_immediate"
#: How long a SQLite connection waits for another process's lock before failing.
SQLITE_BUSY_TIMEOUT_S = 30.0
#: Every engine ``make_engine`` made that is still alive, for ``_after_fork``.
_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def normalize_db_url(text: str) -> str:
    """A database URL from what a person typed: a URL is checked and kept, a plain path
    (``x.db``, ``./data/x.db``, ``/abs/x.db``, ``~/x.db``) becomes ``sqlite:///<absolute path>``.

    ``postgresql://`` and ``postgres://`` mean psycopg 3, the driver maitred ships with."""
    text = text.strip()
    if not text:
        raise StoreError(f"empty database URL: {_URL_HINT}")
    if "://" not in text:
        if _SCHEME.match(text):
            raise StoreError(f"not a database URL or path: {text!r}; {_URL_HINT}")
        path = Path(text).expanduser()
        if path.is_dir():
            raise StoreError(f"database path is a directory: {path.resolve()}; {_URL_HINT}")
        return f"sqlite:///{path.resolve()}"
    try:
        parsed = make_url(text)
    except ArgumentError:
        raise StoreError(f"not a database URL: {text!r}; {_URL_HINT}") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(f"unsupported database {backend!r} in {parsed.render_as_string(hide_password=True)}; {_URL_HINT}")
    return parsed.render_as_string(hide_password=False)


def sqlite_path(url: str | URL) -> Path | None:
    """The file behind a SQLite URL; None for PostgreSQL and in-memory SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.query.get("mode") == "memory":
        return None
    database = parsed.database
    if database.startswith("file:"):  # an SQLite URI filename (``?uri=true``)
        database = database[5:].split("?", 1)[0]
    return Path(database)


def make_engine(url: str, *, connect_timeout_s: float | None = None, echo: bool = False) -> Engine:
    """SQLite gets WAL (readers never block the writer), a busy timeout, and transactions that
    pysqlite leaves alone (see ``_sqlite_begin``); PostgreSQL goes through psycopg 3 with a
    connect timeout, so a port that accepts and never answers fails instead of hanging."""
    parsed = make_url(normalize_db_url(url))
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        if connect_timeout_s is not None:
            connect_args["connect_timeout"] = max(1, round(connect_timeout_s))
    else:
        connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
    try:
        engine = create_engine(parsed, connect_args=connect_args, echo=echo, pool_pre_ping=True)
    except ImportError as exc:  # a driver named in the URL that is not installed (psycopg2, asyncpg)
        raise StoreError(f"database driver {parsed.get_driver_name()!r} is not installed ({exc}); {_URL_HINT}") from None
    if engine.dialect.is_async:  # the store is synchronous: an asyncio driver fails at the first query
        engine.dispose()
        raise StoreError(
            f"database driver {parsed.get_driver_name()!r} is for asyncio, which the store does not use; {_URL_HINT}"
        )
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
    _engines.add(engine)
    return engine


def _after_fork() -> None:
    """A forked child gets a copy of every pool, holding the parent's connections: one socket
    (or SQLite handle) that two processes would then use at once — interleaved PostgreSQL
    messages, and a child whose exit closes the parent's session. The child forgets those
    connections without closing them (``dispose(close=False)``: closing would end the parent's
    session too) and opens its own on first use. SQLAlchemy's own advice ("Using Connection
    Pools with Multiprocessing or os.fork()"); done here so every store in the process is
    covered, whoever made it — the middleware's emitter restarts its thread after a fork, and
    writes through this engine again."""
    for engine in list(_engines):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_after_fork)


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite opens transactions itself, and only before DML: CREATE TABLE would autocommit
    # statement by statement, so a kill during migrations left half a schema. Taking over
    # (isolation_level=None plus our own BEGIN) makes DDL transactional like everything else.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    _enter_wal(cursor)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _enter_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode=WAL``, retried while another process holds the lock it needs.

    Switching a new database to WAL takes an exclusive lock, and SQLite answers "database is
    locked" at once instead of calling the busy handler when it judges that waiting could
    deadlock (sqlite3_busy_handler: "the presence of a busy handler does not guarantee that it
    will be invoked when there is lock contention"). Several processes opening a database that
    nobody has created yet hit exactly that, so this waits out the same bound as the busy
    timeout. A database already in WAL answers without any lock, so the loop costs nothing
    after the first switch."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    delay = 0.002
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _sqlite_begin(conn: Connection) -> None:
    # IMMEDIATE takes the write lock up front (waiting out the busy timeout), so two processes
    # migrating or writing never deadlock on a read lock each wants to upgrade.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(IMMEDIATE) else "BEGIN")


class AnswerDeadline:
    """A bound on how long an operation waits for PostgreSQL's answers: checking out a
    connection (connecting, the pool's pre-ping, the dialect's first queries), each statement,
    committing.

    ``connect_timeout`` only covers connecting. A server that accepted the connection and then
    stops answering — a hung backend or host, a stalled proxy or pooler in between, a lock that
    is never granted — leaves psycopg waiting on its socket forever, since libpq has no
    client-side query timeout. Neither do the usual settings bound it: TCP keepalives and
    ``tcp_user_timeout`` see only a peer whose kernel stopped acknowledging, not a process (or
    proxy) that is alive and silent, and ``statement_timeout`` is enforced by the very server
    that is not answering. So the bound is kept here, on the client: when an operation under
    ``watch(seconds)`` has heard nothing for ``seconds``, every socket this engine holds to the
    server is shut down. The waiting call then fails at once as a lost connection (which
    SQLAlchemy invalidates, and the store reports as an outage), and so would any other call
    waiting on the same silent server; the next attempt opens a fresh connection, bounded by
    ``connect_timeout``.

    The clock restarts whenever the operation sends a statement or gets one answered, so it
    bounds each wait, not the operation: an export that runs a query per program takes as long
    as it needs, and a server that goes silent is caught ``seconds`` later whatever came
    before. ``seconds`` must be well above the slowest healthy answer, or that operation would
    be cut and fail every time it is retried."""

    def __init__(self, engine: Engine) -> None:
        # Each connection with the process that opened it: a forked child must not shut down
        # the parent's sockets, which it still sees until the old pool is collected.
        self._connections: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        #: The operation running in this thread: statements are executed in the caller's thread.
        self._local = threading.local()
        # First of the connect listeners: SQLAlchemy's own runs the dialect's first queries on a
        # new connection, and a silent server must already find that connection here.
        event.listen(engine, "connect", self._opened, insert=True)
        event.listen(engine, "before_cursor_execute", self._heard)
        event.listen(engine, "after_cursor_execute", self._heard)

    def _opened(self, dbapi_connection: Any, _record: Any) -> None:
        with self._lock:
            self._connections[dbapi_connection] = os.getpid()

    def _heard(self, *_event: Any) -> None:
        watch: Watch | None = getattr(self._local, "watch", None)
        if watch is not None:
            watch.restart()

    @contextmanager
    def watch(self, seconds: float) -> Iterator["Watch"]:
        """Run the body under the deadline; ``Watch.expired`` says whether it was cut."""
        watch = Watch(seconds)
        outer = getattr(self._local, "watch", None)
        self._local.watch = watch
        threading.Thread(target=self._guard, args=(watch,), name="maitred-answer-deadline", daemon=True).start()
        try:
            yield watch
        finally:
            self._local.watch = outer
            watch.finish()

    def _guard(self, watch: "Watch") -> None:
        """Wait for the operation to finish, or to hear nothing for ``seconds``: then cut. The
        cut happens under the watch's lock, so none follows once the operation has finished."""
        with watch.changed:
            while not watch.finished:
                left = watch.due - time.monotonic()
                if left <= 0:
                    watch.expired = True
                    with self._lock:
                        mine = [c for c, pid in self._connections.items() if pid == os.getpid()]
                    for connection in mine:
                        _shut_down(connection)
                    return
                watch.changed.wait(left)


class Watch:
    """One operation under an ``AnswerDeadline``: cut when ``due`` passes before ``finished``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.changed = threading.Condition()
        self.due = time.monotonic() + seconds
        self.finished = False
        self.expired = False

    def restart(self) -> None:
        with self.changed:
            self.due = time.monotonic() + self.seconds

    def finish(self) -> None:
        with self.changed:
            self.finished = True
            self.changed.notify()


def _shut_down(connection: Any) -> None:
    """Shut the connection's socket down under psycopg: its wait wakes up to a closed
    connection. Through a duplicate of the descriptor, so psycopg's own stays valid."""
    try:
        fd = connection.pgconn.socket
    except Exception:  # closed already: nothing to cut
        return
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
