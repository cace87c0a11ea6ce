"""Messages between shards over PostgreSQL ``LISTEN``/``NOTIFY``: a moved program is dropped at once.

When the balancer sends a program to another shard (a shard added, removed, or down and back),
the new shard starts it afresh and the shard it left would hold its GPU-tier room until its TTL
(``--program-ttl``, an hour). So every ``maitred serve --shard NAME`` claims the programs it
sees in the store's ``program_homes`` table (``maitred.storage.homes``), and a claim that takes
a program from another shard sends ``{"kind": "moved", "program_id", "from", "to", "schema"}``
on channel ``maitred_shards`` in the claim's transaction; the shard named ``from`` hears it and
drops the program (``LiveDriver.moved_away``). PostgreSQL carries it because the shards of one
deployment already share one PostgreSQL (the store, the standby lease): no server to add.

One thread and one connection of its own do it all, in order: ``claim`` only queues a program
id (the request that saw it never waits on the database), and the thread writes the queued
claims, then listens for ``wait_s``, then again. A message names its schema
(``current_schema()``), so deployments sharing a database in different schemas ignore each
other's. NOTIFY delivers only to sessions listening at the time: after a lost connection the
thread reconnects with backoff and asks ``program_homes`` for the programs homed elsewhere
since shortly before it last heard the server (``moved_since``), and treats them as told
(the driver drops those it still serves). A program whose own claim is still queued here is
never dropped for an older move: the claim is newer news. Programs restored from the store at
start are looked up too (``check``): one another shard claimed while this one was down is
dropped, as if told. Payloads stay far below NOTIFY's
8,000 bytes: ids are at most 256 characters, shard names 32.
"""

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

from maitred.gateway.lease import ANSWER_TIMEOUT_S
from maitred.gateway.metrics import Metrics
from maitred.storage import homes
from maitred.storage.engine import AnswerDeadline, make_engine, normalize_db_url
from maitred.storage.errors import translate

log = logging.getLogger("maitred.service")

CHANNEL = "maitred_shards"
MOVED = "moved"
#: How far before the last time it heard the server a reconnected link looks for moves: covers
#: a claim whose time (its statement's) came before the last heartbeat and whose commit after.
CATCH_UP_MARGIN_S = 5.0
#: Claims written in one transaction at most: a burst of new programs (a shard added) is written
#: in bounded transactions, listening between them.
CLAIM_BATCH = 1_000


class ShardLink:
    """Shard ``shard``'s claims and messages on the PostgreSQL at ``url``; ``on_moved_away`` is
    called in the link's thread with each program that moved from this shard to another."""

    def __init__(
        self,
        url: str,
        shard: str,
        *,
        on_moved_away: Callable[[str], object],
        metrics: Metrics,
        wait_s: float = 0.1,
        heartbeat_s: float = 2.0,
        retry_s: float = 0.2,
        capacity: int = 100_000,
    ) -> None:
        self.url, self.shard = normalize_db_url(url), shard
        self.on_moved_away, self.metrics = on_moved_away, metrics
        self.wait_s, self.heartbeat_s, self.retry_s, self.capacity = wait_s, heartbeat_s, retry_s, capacity
        #: the session's ``application_name``, by which a DBA (and a test) finds it
        self.label = f"maitred shard={shard} pid={os.getpid()} messages"
        self._engine = make_engine(self.url, connect_timeout_s=ANSWER_TIMEOUT_S)
        self._deadline = AnswerDeadline(self._engine)
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        self._pending: set[str] = set()  # queued or being written: claims not yet in the table
        self._checks: deque[str] = deque()  # restored programs whose home is to be looked up
        self._overflowed = 0
        self._stop = threading.Event()
        self._schema: str | None = None
        self._beaten = False  # the session now served answered a heartbeat
        #: the database's clock when the link last heard the server (None: never connected)
        self.last_seen: float | None = None
        for direction in ("sent", "received"):  # at 0 from the start, so ``rate()`` sees the first
            metrics.shard_messages.labels(direction, MOVED)
        self._thread = threading.Thread(target=self._run, name="maitred-shard-link", daemon=True)
        self._thread.start()

    def claim(self, program_id: str) -> None:
        """This shard serves ``program_id`` from now on (it just saw it first); never blocks."""
        with self._cond:
            if program_id in self._pending:
                return
            if len(self._queue) >= self.capacity:
                self._overflowed += 1
                return
            self._queue.append(program_id)
            self._pending.add(program_id)

    def check(self, program_ids: Iterable[str]) -> None:
        """``program_ids`` were restored from the store at start, without a claim: those another
        shard claimed meanwhile (while this one was down) are reported moved away."""
        with self._cond:
            self._checks.extend(program_ids)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (claims still queued are not written: the next shard to see those
        programs claims them) and let go of the connection."""
        self._stop.set()
        self._thread.join(timeout)
        self._engine.dispose()

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        """Connect and serve; after a failure, retry ``retry_s`` later, doubling up to 10 s
        while sessions keep failing before their first heartbeat (a claim that always fails
        does not retry in a tight loop)."""
        backoff = self.retry_s
        while not self._stop.is_set():
            conn: Connection | None = None
            self._beaten = False
            try:
                conn = self._connect()
                self._serve(conn)
            except Exception as exc:  # psycopg's own errors too (``notifies``): any failure reconnects
                if self._stop.is_set():
                    break
                backoff = self.retry_s if self._beaten else backoff
                why = translate(exc, self.url) if isinstance(exc, SQLAlchemyError) else exc
                log.warning(
                    "maitred: shard %s: cross-shard messages interrupted (%s); reconnecting in %.1f s", self.shard, why, backoff
                )
            finally:
                if conn is not None:
                    try:
                        conn.invalidate()  # never back to the pool: a fresh session LISTENs again
                    except SQLAlchemyError:
                        pass
            self._stop.wait(backoff)
            backoff = min(backoff * 2, max(10.0, self.retry_s))

    def _connect(self) -> Connection:
        """A session listening on ``CHANNEL``; after a lost one, the moves it may have missed."""
        with self._deadline.watch(ANSWER_TIMEOUT_S):
            conn = self._engine.connect()
            try:
                with conn.begin():  # listening from its commit on: what comes later is told
                    conn.execute(text("SELECT set_config('application_name', :label, false)"), {"label": self.label})
                    conn.execute(text(f"LISTEN {CHANNEL}"))
                    self._schema = conn.execute(text("SELECT current_schema()")).scalar_one()
                with conn.begin():  # ... and what came before is in the table
                    now = homes.db_now(conn)
                    since, self.last_seen = self.last_seen, now
                    missed = [] if since is None else homes.moved_since(conn, self.shard, since - CATCH_UP_MARGIN_S)
            except BaseException:
                conn.invalidate()
                raise
        if since is not None:
            log.info("maitred: shard %s: cross-shard messages back; %d moves to check since the break", self.shard, len(missed))
        for program_id in missed:
            self._moved_away(program_id)
        return conn

    def _serve(self, conn: Connection) -> None:
        """Until stopped or the connection fails: write the queued claims, listen, beat."""
        raw: Any = conn.connection.driver_connection
        beat = time.monotonic()
        while not self._stop.is_set():
            self._write_claims(conn)
            self._check_restored(conn)
            for notify in raw.notifies(timeout=self.wait_s):
                self._receive(notify.payload)
            if time.monotonic() - beat >= self.heartbeat_s:
                with self._deadline.watch(ANSWER_TIMEOUT_S), conn.begin():
                    self.last_seen = homes.db_now(conn)
                beat, self._beaten = time.monotonic(), True

    def _write_claims(self, conn: Connection) -> None:
        with self._cond:
            batch = [self._queue.popleft() for _ in range(min(CLAIM_BATCH, len(self._queue)))]
            overflowed, self._overflowed = self._overflowed, 0
        if overflowed:
            log.warning("maitred: shard %s: %d program claims not queued (the queue is full)", self.shard, overflowed)
        if not batch:
            return
        try:
            with self._deadline.watch(ANSWER_TIMEOUT_S), conn.begin():
                moves = homes.claim(conn, self.shard, batch)
                for move in moves:
                    payload = {
                        "kind": MOVED,
                        "program_id": move.program_id,
                        "from": move.src,
                        "to": move.dst,
                        "schema": self._schema,
                    }
                    conn.execute(
                        text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": json.dumps(payload)}
                    )
        except BaseException:
            with self._cond:  # kept for the next connection, in front of what came since
                self._queue.extendleft(reversed(batch))
            raise
        with self._cond:
            self._pending.difference_update(batch)
        self.metrics.shard_messages.labels("sent", MOVED).inc(len(moves))

    def _check_restored(self, conn: Connection) -> None:
        with self._cond:
            batch = list(self._checks)
            self._checks.clear()
        if not batch:
            return
        try:
            with self._deadline.watch(ANSWER_TIMEOUT_S), conn.begin():
                elsewhere = homes.homed_elsewhere(conn, self.shard, batch)
        except BaseException:
            with self._cond:
                self._checks.extendleft(reversed(batch))
            raise
        for program_id in elsewhere:
            self._moved_away(program_id)

    def _receive(self, payload: str) -> None:
        """One message: a move away from this shard, in this schema, is acted on; others are not ours."""
        try:
            message = json.loads(payload)
        except ValueError:
            log.warning("maitred: shard %s: a message on %s that is not JSON: %.200r", self.shard, CHANNEL, payload)
            return
        if not isinstance(message, dict) or message.get("schema") != self._schema:
            return
        if message.get("kind") == MOVED and message.get("from") == self.shard and isinstance(message.get("program_id"), str):
            self.metrics.shard_messages.labels("received", MOVED).inc()
            self._moved_away(message["program_id"])

    def _moved_away(self, program_id: str) -> None:
        with self._cond:
            if program_id in self._pending:  # this shard claimed it again since: it stays
                return
        self.on_moved_away(program_id)
