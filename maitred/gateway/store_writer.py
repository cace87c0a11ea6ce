"""Events reaching the runtime go to the session store in batches, from one background thread.

The gateway's event loop never waits on the database: ``submit`` only appends to a bounded
queue. The thread opens the store itself (a database that is down at start delays history, never
serving: it retries with backoff, and ``on_open`` runs once it is open), then writes what has
gathered (up to ``batch`` events at a time); while the store is unavailable it keeps the batch
and retries with backoff, and when the queue is full the newest events are dropped and counted
(the runtime's live state has them anyway; only history loses them). Events the database
refuses for their content are counted with the reason and do not hold back the rest of their
batch (``SessionStore.write`` isolates them). A store that can never work (a database written by
a newer maitred, a corrupt file) is reported once and its events are dropped and counted.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from maitred.events import Event
from maitred.storage import SessionStore
from maitred.storage.errors import StoreError, StoreUnavailable

log = logging.getLogger("maitred.service")


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
        self._queue: deque[Event] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._closed_for_good = False  # the store cannot be opened: nothing will be written
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="maitred-store-writer", daemon=True)
        self._thread.start()

    def submit(self, events: Iterable[Event]) -> None:
        """Queue events for the store; never blocks on I/O."""
        with self._cond:
            events = list(events)
            if self._closed_for_good:
                self._drop("store_error", len(events))
                return
            room = self.capacity - len(self._queue)
            if len(events) > room:
                self._drop("queue_full", len(events) - max(room, 0))
                events = events[: max(room, 0)]
            self._queue.extend(events)
            if len(self._queue) >= self.batch:
                self._cond.notify()

    def _drop(self, reason: str, n: int) -> None:
        if n > 0:
            self.dropped += n
            self.on_drop(reason, n)

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

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (within ``timeout``), then stop the thread and close the store."""
        if self.store is not None:
            self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        if self.store is not None:
            self.store.close()

    def _open(self) -> bool:
        """Open the store, retrying while it is unavailable; False when stopping or hopeless."""
        backoff = 0.2
        while True:
            try:
                store = self.open_store()
            except StoreUnavailable as exc:
                log.warning("maitred: store unavailable (%s); history waits, retrying in %.1f s", exc, backoff)
            except (StoreError, ValueError) as exc:
                self.broken = str(exc)
                log.error("maitred: cannot use the store: %s; events are kept in the live state only", exc)
                return False
            else:
                self.store = store
                if self.on_open is not None:
                    try:
                        self.on_open(store)
                    except StoreUnavailable as exc:  # a server gone silent: say so, no traceback
                        log.warning(
                            "maitred: reading tool statistics from the store failed (%s); readiness starts without history", exc
                        )
                    except Exception:
                        log.exception("maitred: reading tool statistics from the store failed")
                return True
            with self._cond:
                if self._closing:
                    return False
                self._cond.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _run(self) -> None:
        if not self._open():
            with self._cond:
                self._drop("store_error" if self.broken else "store_unavailable", len(self._queue))
                self._queue.clear()
                self._closed_for_good = True
                self._cond.notify_all()
            return
        assert self.store is not None
        store = self.store
        backoff = 0.1
        while True:
            with self._cond:
                if not self._queue and not self._closing:
                    self._cond.wait(self.interval_s)
                if self._closing and not self._queue:
                    return
                if self._closing and backoff > 0.1:  # the store is down and we are shutting down
                    self._drop("store_unavailable", len(self._queue))
                    self._queue.clear()
                    self._cond.notify_all()
                    return
                batch = [self._queue.popleft() for _ in range(min(self.batch, len(self._queue)))]
                self._busy = bool(batch)
            if not batch:
                continue
            try:
                result = store.write(batch)
            except StoreUnavailable as exc:
                log.warning("maitred: store unavailable (%s); retrying in %.1f s", exc, backoff)
                with self._cond:
                    self._queue.extendleft(reversed(batch))
                    self._busy = False
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception:
                log.exception("maitred: store write failed; %d events dropped", len(batch))
                self._drop("store_error", len(batch))
            else:
                backoff = 0.1
                self.stored += result.stored
                self._drop("rejected", len(result.rejected))
                for r in result.rejected[:5]:
                    log.warning("maitred: store refused a %s event: %s", r.type, r.reason)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
