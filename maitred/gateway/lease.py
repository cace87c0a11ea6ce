"""``ShardLease``: which of a shard's gateways serves, decided by a PostgreSQL advisory lock.

Two ``maitred serve --shard NAME`` processes share the same workers and the same store; only
one may act on the workers (schedule, poll, warm up, write history), or each would place the
same programs twice. Each holds a dedicated connection to the store's database and tries a
session-level ``pg_try_advisory_lock`` on a key drawn from the database, the schema the store
lives in and the shard's name, so two deployments in one database but different schemas never
contend for each other's shards. The lock lives as long as the session holding it: when that
process dies (``kill -9`` included) the server ends its session and frees the lock, and the
other process's next try wins.

The holder's ``application_name`` names it (``maitred shard=s1 pid=4242 10.0.0.7:8000``), so a
standby can say who serves (``holder``, from ``pg_locks`` and ``pg_stat_activity``), and so can
a DBA. Every call is synchronous and bounded (``connect_timeout`` to connect, then
``AnswerDeadline`` for each answer): the gateway runs them in a thread.
"""

import logging
import os

from sqlalchemy import Connection, TextClause, text
from sqlalchemy.exc import SQLAlchemyError

from maitred.storage.engine import AnswerDeadline, make_engine, normalize_db_url
from maitred.storage.errors import StoreError, translate

log = logging.getLogger("maitred.service")

#: How long each lease query waits for the server's answer before the connection counts as lost.
ANSWER_TIMEOUT_S = 5.0
#: TCP keepalives the server keeps on the lease's session (idle seconds, interval seconds, probes):
#: a holder whose host vanished without closing its connection (power lost, network cut) has
#: its session ended, and the lock freed, within about idle + interval x probes = 5 s instead
#: of the system default of two hours or more. Ignored on a Unix-domain socket.
SERVER_KEEPALIVES = (2, 1, 3)
#: The shard's key, from the database, the schema the store lives in (``current_schema()``,
#: the first existing schema of ``search_path``) and the shard name.
_KEY = text("SELECT hashtextextended(current_database() || '/' || current_schema() || '/' || :shard, 0)")
#: The ``application_name`` of the session holding advisory lock ``key`` in this database (a
#: bigint key is kept as classid = its high 32 bits, objid = its low 32 bits, objsubid = 1).
_TRY = text("SELECT pg_try_advisory_lock(CAST(:key AS bigint))")
_PING = text("SELECT 1")
_HOLDER = text(
    """
    SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::bigint = (CAST(:key AS bigint) >> 32) & 4294967295
      AND l.objid::bigint = CAST(:key AS bigint) & 4294967295
    """
)


class LeaseUnavailable(Exception):
    """The lease's database could not be asked (down, unreachable, silent): the message says why."""


class ShardLease:
    """One process's claim on shard ``shard`` of the store at ``url`` (a PostgreSQL URL).

    ``try_acquire`` takes the lease when nobody holds it (True), ``check`` tells the holder
    whether it still does, ``holder`` names whoever holds it, ``close`` gives it up. A
    connection that fails loses the lease with it: ``check`` then answers False for good,
    and a standby's next ``try_acquire`` connects again."""

    def __init__(self, url: str, shard: str, *, label: str, connect_timeout_s: float = ANSWER_TIMEOUT_S) -> None:
        self.url, self.shard = normalize_db_url(url), shard
        #: this process's ``application_name``, which ``holder`` reports on the other side
        self.label = label
        self._engine = make_engine(self.url, connect_timeout_s=connect_timeout_s)
        if self._engine.dialect.name != "postgresql":
            self._engine.dispose()
            raise StoreError(f"a shard lease needs PostgreSQL, not {self._engine.dialect.name}")
        self._deadline = AnswerDeadline(self._engine)
        self._conn: Connection | None = None
        self._key: int | None = None
        self.held = False
        #: the server process of the lease's session (``pg_terminate_backend`` ends it), once connected
        self.backend_pid: int | None = None

    def _connection(self) -> Connection:
        if self._conn is None:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                conn.execute(text("SELECT set_config('application_name', :label, false)"), {"label": self.label})
                idle, interval, probes = SERVER_KEEPALIVES
                conn.execute(
                    text(
                        "SELECT set_config('tcp_keepalives_idle', :idle, false), "
                        "set_config('tcp_keepalives_interval', :interval, false), "
                        "set_config('tcp_keepalives_count', :probes, false)"
                    ),
                    {"idle": str(idle), "interval": str(interval), "probes": str(probes)},
                )
                self.backend_pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
                key = conn.execute(_KEY, {"shard": self.shard}).scalar_one_or_none()
            except BaseException:
                conn.close()
                raise
            if key is None:
                conn.close()
                raise StoreError("the store's search_path names no schema that exists, so the shard has no key")
            self._conn, self._key = conn, key
        return self._conn

    def _ask(self, statement: TextClause, *, keyed: bool = True) -> object:
        """One query on the lease's connection (``keyed``: given the shard's key as ``:key``),
        each answer awaited at most ``ANSWER_TIMEOUT_S``. Any failure closes the connection
        (and with it the lease) and is raised as ``LeaseUnavailable``."""
        try:
            with self._deadline.watch(ANSWER_TIMEOUT_S):
                conn = self._connection()
                return conn.execute(statement, {"key": self._key} if keyed else {}).scalar()
        except (SQLAlchemyError, StoreError) as exc:
            self._drop()
            raise LeaseUnavailable(str(translate(exc, self.url))) from None

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; True once held (again True while still held)."""
        if not self.held:
            self.held = bool(self._ask(_TRY))
        return self.held

    def check(self) -> bool:
        """Whether the lease is still held: a session that answers still holds its lock (only
        the session's end or an explicit unlock frees it, and this process does neither while
        holding it). False once the connection failed."""
        if not self.held:
            return False
        try:
            self._ask(_PING, keyed=False)
        except LeaseUnavailable as exc:
            log.error("maitred: shard %s: the lease's connection failed (%s): the lease is lost", self.shard, exc)
            return False
        return True

    def holder(self) -> str | None:
        """The ``application_name`` of the session holding the lease (None: nobody, or it set none)."""
        name = self._ask(_HOLDER)
        return str(name) if name else None

    def _drop(self) -> None:
        conn, self._conn, self.held = self._conn, None, False
        if conn is not None:
            try:
                conn.invalidate()  # never back to the pool: its session may hold the lock
            except SQLAlchemyError:
                pass

    def close(self) -> None:
        """Give the lease up (ending the session frees its lock) and let go of the engine."""
        self._drop()
        self._engine.dispose()


def lease_label(shard: str, host: str, port: int) -> str:
    """The ``application_name`` a holder is known by: shard, process and the address it serves
    on (PostgreSQL keeps 63 bytes of it)."""
    return f"maitred shard={shard} pid={os.getpid()} {host}:{port}"
