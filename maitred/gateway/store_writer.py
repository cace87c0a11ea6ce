"""Events reaching the runtime go to the session store in batches, from one background thread.

The gateway's event loop never waits on the database: ``submit`` only appends to a bounded
queue. The thread opens the store itself (a database that is down at start delays history, never
serving: it retries with backoff, and ``on_open`` runs once it is open), then writes what has
gathered (up to ``batch`` events at a time); while the store is unavailable it keeps the batch
and retries with backoff, and when the queue is full the newest events are dropped and counted
(the runtime's live state has them anyway; only history loses them). Events the database
refuses for their content are counted with the reason and do not hold back the rest of their
batch (``SessionStore.write`` isolates them). A store that can never work (a database written by
a newer maitred, a corrupt file) is reported once and its events are dropped and counted;
``maitred serve`` refuses to start on one (``serve.check_store``), so this is for a store that
turns so later. A thread that dies of anything unforeseen says so the same way: ``problem``
names it (``/healthz`` answers 503 with it, ``maitred_store_writer_up`` reads 0), and every
event queued or submitted after is counted dropped (``writer_stopped``), never silently lost.

``when_written(mark)`` is an asyncio future the thread resolves the moment every event queued
before ``mark()`` is written (or refused for its content), or that it never will be, and ``lost()`` counts the events dropped otherwise: a holder under
``--shard`` answers only once what it recorded is written (``LiveDriver.stored``), so the standby
that takes over after a crash finds in the store every event and model call the holder answered
for. The thread wakes the waiting loop itself (``call_soon_threadsafe``) rather than the loop
polling it: a poll adds half its interval to every answer.

At shutdown ``close(timeout)`` is a bounded drain (``maitred serve --drain-timeout``): what is
queued gets ``timeout`` seconds to reach the store, retried as usual while it is down; what is
left then — the store still down, or a write still hanging — is counted and logged in one
line with the count, because the in-process metric dies with the process.
"""

import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable

from maitred.events import Event
from maitred.storage import SessionStore
from maitred.storage.errors import StoreError, StoreUnavailable

log = logging.getLogger("maitred.service")


def _settle(future: "asyncio.Future[bool]", result: bool) -> None:
    """On the waiting loop: resolve ``future`` unless its waiter gave up already."""
    if not future.done():
        future.set_result(result)


class StoreWriter:
    def __init__(
        self,
        open_store: Callable[[], SessionStore],
        *,
        capacity: int = 200_000,
        batch: int = 2_000,
        interval_s: float = 0.2,
        on_drop: Callable[[str, int], None] | None = None,
        on_open: Callable[[SessionStore], None] | None = None,
    ) -> None:
        self.open_store = open_store
        self.on_open = on_open
        self.store: SessionStore | None = None
        self.broken: str | None = None  # why the store can never be written, once known
        self.capacity = capacity
        self.batch = batch
        self.interval_s = interval_s
        self.on_drop = on_drop or (lambda reason, n: None)
        self.stored = 0
        self.dropped = 0
        self.dropped_by_reason: Counter[str] = Counter()
        self.died: str | None = None  # why the thread stopped on an unforeseen error, once it did
        self.unavailable: str | None = None  # the last outage, while the store is not taking writes
        #: set once the first attempt to open the store is over (opened, hopeless or unavailable)
        self.first_attempt = threading.Event()
        self._in_flight = 0  # events of the batch being written
        self._queued = 0  # events ever queued, in order: ``mark``
        self._finished = 0  # of those, how many were written, refused, or dropped on a store error
        self._queue: deque[Event] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._closed_for_good = False  # the store cannot be opened: nothing will be written
        self._busy = False
        #: ``when_written``'s futures, by mark: (mark, tie-break, loop, future)
        self._waiters: list[tuple[int, int, asyncio.AbstractEventLoop, asyncio.Future[bool]]] = []
        self._waiter_ids = itertools.count()
        self._prune_at = 1024
        self._thread = threading.Thread(target=self._run, name="maitred-store-writer", daemon=True)
        self._thread.start()

    def submit(self, events: Iterable[Event]) -> None:
        """Queue events for the store; never blocks on I/O."""
        with self._cond:
            events = list(events)
            if self._closed_for_good:
                self._drop("writer_stopped" if self.died else "shutdown" if self._closing else "store_error", len(events))
                return
            room = self.capacity - len(self._queue)
            if len(events) > room:
                self._drop("queue_full", len(events) - max(room, 0))
                events = events[: max(room, 0)]
            self._queue.extend(events)
            self._queued += len(events)
            if len(self._queue) >= self.batch:
                self._cond.notify()

    def _drop(self, reason: str, n: int) -> None:
        if n > 0:
            self.dropped += n
            self.dropped_by_reason[reason] += n
            self.on_drop(reason, n)

    def problem(self) -> str | None:
        """Why no event reaches the store any more (None while it does, or will once it is up):
        the store can never be used, or the thread stopped."""
        if self.died is not None:
            return f"store writer stopped: {self.died}"
        if self.broken is not None:
            return f"cannot use the store: {self.broken}"
        return None

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far was written (or refused); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._cond.notify()
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def mark(self) -> int:
        """How many events were ever queued: ``when_written``'s argument for all of them."""
        with self._cond:
            return self._queued

    def lost(self) -> int:
        """Events dropped without reaching the store (all drops but those it refused for their content)."""
        with self._cond:
            return self.dropped - self.dropped_by_reason["rejected"]

    def when_written(self, mark: int) -> "asyncio.Future[bool]":
        """A future of the running loop that becomes True once the first ``mark`` events queued
        are written (or refused for their content, or dropped and counted on a store error), or False
        once nothing more will be written (``stopped``); the writer is asked to write at once.
        Cancelling it (a timeout) is safe: the thread skips futures already done."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        with self._cond:
            if self._finished >= mark:
                future.set_result(True)
            elif self._closed_for_good:
                future.set_result(False)
            else:
                if len(self._waiters) >= self._prune_at:  # waiters that gave up while the store was down
                    self._waiters = [w for w in self._waiters if not w[3].done()]
                    heapq.heapify(self._waiters)
                    self._prune_at = max(1024, 2 * len(self._waiters))
                heapq.heappush(self._waiters, (mark, next(self._waiter_ids), loop, future))
                self._cond.notify()
        return future

    def _wake(self, everyone: bool = False) -> None:
        """Resolve the waiters whose events are written (all of them, False, when ``everyone``:
        nothing more will be). Called by the thread with ``_cond`` held."""
        while self._waiters and (everyone or self._waiters[0][0] <= self._finished):
            mark, _, loop, future = heapq.heappop(self._waiters)
            result = mark <= self._finished
            try:
                loop.call_soon_threadsafe(_settle, future, result)
            except RuntimeError:  # that loop is closed: nobody waits any more
                pass

    @property
    def stopped(self) -> bool:
        """Nothing queued will be written any more (closed, stopped, or the store is unusable)."""
        return self._closed_for_good

    def close(self, timeout: float = 10.0) -> int:
        """Drain: write what is queued within ``timeout`` (retrying while the store is down),
        then stop the thread and close the store. What could not be written is counted dropped
        (``shutdown``) and logged with its count. Returns that count."""
        self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        with self._cond:  # left over: the store stayed down, or a write still hangs
            left = len(self._queue) + self._in_flight
            self._queue.clear()
            self._in_flight = 0
            self._closed_for_good = True
            self._wake(everyone=True)
        self._drop("shutdown", left)
        lost = self.dropped_by_reason["shutdown"]
        if lost:
            why = self.unavailable or self.problem() or "writes did not finish"
            log.error(
                "maitred: %d events not stored at shutdown: the store did not take them within the drain timeout "
                "(%g s, --drain-timeout): %s",
                lost,
                timeout,
                why,
            )
        if self.dropped:
            log.warning(
                "maitred: store writer closed: %d events stored, %d not stored (%s)",
                self.stored,
                self.dropped,
                ", ".join(f"{reason}: {n}" for reason, n in sorted(self.dropped_by_reason.items())),
            )
        if self.store is not None and not self._thread.is_alive():
            self.store.close()
        return lost

    def _open(self) -> bool:
        """Open the store, retrying while it is unavailable; False when stopping or hopeless."""
        backoff = 0.2
        while True:
            try:
                store = self.open_store()
            except StoreUnavailable as exc:
                self.unavailable = str(exc)
                self.first_attempt.set()
                log.warning("maitred: store unavailable (%s); history waits, retrying in %.1f s", exc, backoff)
            except (StoreError, ValueError) as exc:
                self.broken = str(exc)
                log.error("maitred: cannot use the store: %s; events are kept in the live state only", exc)
                return False
            else:
                self.store, self.unavailable = store, None
                if self.on_open is not None:
                    try:
                        self.on_open(store)
                    except StoreUnavailable as exc:  # a server gone silent: say so, no traceback
                        log.warning(
                            "maitred: reading tool statistics from the store failed (%s); readiness starts without history", exc
                        )
                    except Exception:
                        log.exception("maitred: reading tool statistics from the store failed")
                self.first_attempt.set()
                return True
            with self._cond:
                if self._closing:
                    return False
                self._cond.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _run(self) -> None:
        """The thread: ``_write_all``, and whatever kills it said in ``problem``, the log and the
        drop counter, with everything still queued (and everything submitted later) counted."""
        try:
            self._write_all()
        except BaseException as exc:
            self.died = f"{type(exc).__name__}: {exc}"
            log.exception("maitred: the store writer stopped; events are no longer stored")
            with self._cond:
                self._drop("writer_stopped", len(self._queue) + self._in_flight)
                self._queue.clear()
                self._in_flight = 0
                self._closed_for_good = True
                self._wake(everyone=True)
                self._busy = False
                self._cond.notify_all()
        finally:
            self.first_attempt.set()

    def _write_all(self) -> None:
        if not self._open():
            with self._cond:
                reason = "store_error" if self.broken else "shutdown"
                self._drop(reason, len(self._queue))
                self._queue.clear()
                self._closed_for_good = True
                self._wake(everyone=True)
                self._cond.notify_all()
            return
        assert self.store is not None
        store = self.store
        backoff = 0.1
        while True:
            with self._cond:
                if not self._queue and not self._closing:
                    self._cond.wait(self.interval_s)
                if self._closing:
                    return  # the drain is over (``close`` counts what is left)
                batch = [self._queue.popleft() for _ in range(min(self.batch, len(self._queue)))]
                self._busy = bool(batch)
                self._in_flight = len(batch)
            if not batch:
                continue
            try:
                result = store.write(batch)
            except StoreUnavailable as exc:
                self.unavailable = str(exc)
                log.warning("maitred: store unavailable (%s); retrying in %.1f s", exc, backoff)
                with self._cond:
                    self._queue.extendleft(reversed(batch))
                    self._busy = False
                    self._in_flight = 0
                    self._cond.notify_all()
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception:
                log.exception("maitred: store write failed; %d events dropped", len(batch))
                self._drop("store_error", len(batch))
            else:
                if self.unavailable is not None:
                    log.info("maitred: the store takes writes again")
                backoff, self.unavailable = 0.1, None
                self.stored += result.stored
                self._drop("rejected", len(result.rejected))
                for r in result.rejected[:5]:
                    log.warning("maitred: store refused a %s event: %s", r.type, r.reason)
            with self._cond:
                self._finished += len(batch)
                self._busy = False
                self._in_flight = 0
                self._wake()
                self._cond.notify_all()
