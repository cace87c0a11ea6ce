"""Moves events off the agent's thread: a bounded queue drained by one background thread.

Shaped like OpenTelemetry's BatchSpanProcessor. What each emitter guarantees (the README's
"What is guaranteed" says the same; tests/test_emitter.py checks each point):

- ``emit`` never raises. It appends to a queue of at most ``max_queue`` events and returns; the
  worker thread sends them to the sink in batches (bigger batches, up to ``max_batch``, when it
  has fallen behind, so a slow store pays for fewer transactions).
- When the queue is full, ``overflow="drop"`` (the default) drops the *oldest* queued event;
  ``overflow="block"`` makes the caller wait for room instead, for at most ``block_timeout_s``:
  after a wait that long the emitter drops as above and does not block again until the sink
  delivers a batch, so a dead store costs a blocking caller that one timeout, not one per event.
- Every event not delivered is counted in ``dropped`` (queue overflow, refused for its content,
  refused by the sink for good, left over at shutdown) and a warning says how many and why, at
  most once per ``warn_interval_s``.
- ``flush`` returns True only if every event emitted before the call was delivered and nothing
  was dropped since the previous ``flush`` (so True really means "all of it is stored").
- A sink that fails is retried with exponential backoff, the batch kept; one warning per
  outage, one when it recovers, and ``last_error`` is cleared by the first batch delivered.
- ``shutdown`` (at exit, or when ``configure`` replaces the emitters) waits at most its timeout,
  and when the sink is down, only for one more attempt: a process never waits on telemetry
  longer than its flush timeout, and not at all for a store that refuses connections.
"""

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Literal

from maitred.events import Event
from maitred.middleware.sinks import ForkAware, PermanentSinkError, Sink

log = logging.getLogger("maitred")

Overflow = Literal["drop", "block"]


@dataclass(frozen=True, slots=True)
class EmitterSettings:
    """How one emitter queues and sends.

    ``max_queue`` bounds memory: a tool event takes about 165 bytes queued, so the default
    250,000 is about 40 MB, enough to absorb a burst of 100,000 back-to-back tool calls while a
    local SQLite store catches up. Events carrying ``messages`` or ``attrs`` hold references to
    the caller's objects, not copies.
    """

    max_queue: int = 250_000
    #: The worker wakes early once this many events are queued (else every ``interval_s``).
    batch_size: int = 1_000
    #: The most events handed to the sink in one call.
    max_batch: int = 20_000
    interval_s: float = 0.5
    max_backoff_s: float = 10.0
    #: The longest ``flush()`` and ``shutdown()`` wait when given no timeout (exit, ``configure``).
    flush_timeout_s: float = 5.0
    overflow: Overflow = "drop"
    #: With ``overflow="block"``: the longest one ``emit`` waits for room.
    block_timeout_s: float = 30.0
    #: Drops are reported at most once per this many seconds, with counts.
    warn_interval_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_queue", "batch_size", "max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        for name in ("interval_s", "max_backoff_s", "block_timeout_s", "warn_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive seconds, got {getattr(self, name)!r}")
        if not self.flush_timeout_s >= 0:
            raise ValueError(f"flush_timeout_s must be zero or positive seconds, got {self.flush_timeout_s!r}")
        if self.overflow not in ("drop", "block"):
            raise ValueError(f"overflow must be 'drop' or 'block', got {self.overflow!r}")


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """Counters for one sink: ``dropped`` events are gone for good (``rejected`` of them were
    refused for their content), ``queued`` may still go."""

    sink: str
    queued: int
    delivered: int
    dropped: int
    last_error: str | None
    rejected: int = 0


class Emitter:
    def __init__(self, sink: Sink, settings: EmitterSettings | None = None, *, name: str = "") -> None:
        self.sink = sink
        self.settings = settings or EmitterSettings()
        self.name = name or type(sink).__name__
        self._max_queue = self.settings.max_queue
        self._batch_size = self.settings.batch_size
        self._init_state()

    def _init_state(self) -> None:
        self.delivered = 0
        self.dropped = 0
        self.rejected = 0
        self.last_error: str | None = None
        self._queue: deque[Event] = deque()
        self._pending: list[Event] | None = None
        # One lock for everything but the hot path's append: batch pops, evictions, counters.
        self._cond = threading.Condition(threading.Lock())
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker_id: int | None = None
        self._closed = False  # shutdown began: new events are dropped
        self._abandoned = False  # shutdown gave up: whatever is still in flight was counted dropped
        self._down = False  # the last send failed; retrying with backoff
        self._stalled = False  # overflow="block" gave up waiting; drops until the next delivery
        self._sending = False
        self._done = 0  # events of finished batches (delivered, refused or given up)
        self._evicted = 0  # events removed from the queue without a send (overflow, shutdown)
        self._failures = 0  # failed send attempts
        self._flushed_dropped = 0  # ``dropped`` when the last flush returned
        self._unreported: Counter[str] = Counter()
        self._next_warning = 0.0

    # -- the agent's side ------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        queue = self._queue
        if self._closed or len(queue) >= self._max_queue:
            self._overflow(event)
            return
        queue.append(event)
        if self._thread is None:
            self._start()
        elif len(queue) >= self._batch_size and not self._wake.is_set():
            self._wake.set()

    def _overflow(self, event: Event) -> None:
        if self._closed:
            self._count_dropped(1, "emitted after shutdown")
            return
        if self.settings.overflow == "block" and self._wait_for_room():
            self._queue.append(event)
            return
        with self._cond:
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self._evicted += 1
                self._drop_locked(1, f"queue full at {self._max_queue} events")
            self._queue.append(event)
        self._warn_drops()

    def _wait_for_room(self) -> bool:
        """Block until the worker takes a batch; False (drop instead) after ``block_timeout_s``,
        when stalled, or on the worker's own thread (a sink that emits must not wait on itself)."""
        if self._stalled or threading.get_ident() == self._worker_id:
            return False
        deadline = time.monotonic() + self.settings.block_timeout_s
        with self._cond:
            while len(self._queue) >= self._max_queue:
                left = deadline - time.monotonic()
                if self._closed or self._stalled:
                    return False
                if left <= 0:
                    self._stalled = True
                    break
                self._wake.set()
                self._cond.wait(left)
            else:
                return True
        log.warning(
            "maitred: %s took no events for %.0f s (%s); dropping instead of blocking until it delivers again",
            self.name,
            self.settings.block_timeout_s,
            self.last_error or "sink slow or hung",
        )
        return False

    def _start(self) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"maitred-emitter-{self.name}", daemon=True)
                self._thread.start()

    # -- the worker ------------------------------------------------------------------------------

    def _run(self) -> None:
        self._worker_id = threading.get_ident()
        backoff = 0.0
        try:
            while True:
                ok = self._drain()  # the first batch goes at once: opening the store takes time
                backoff = 0.0 if ok else min(max(backoff * 2, 0.1), self.settings.max_backoff_s)
                self._warn_drops()
                with self._cond:
                    self._cond.notify_all()
                    if self._abandoned or (self._closed and ok and not self._queue and self._pending is None):
                        return
                self._wake.wait(backoff or self.settings.interval_s)
                self._wake.clear()
        except BaseException:
            log.exception("maitred: the %s emitter stopped", self.name)
        finally:
            if self._closed:
                self.sink.close()
            with self._cond:
                self._cond.notify_all()

    def _drain(self) -> bool:
        """Send everything queued; False when the sink failed (the batch stays pending)."""
        while True:
            with self._cond:
                if self._abandoned:
                    return True
                if self._pending is None:
                    if not self._queue:
                        return True
                    popleft = self._queue.popleft
                    self._pending = [popleft() for _ in range(min(len(self._queue), self.settings.max_batch))]
                    self._cond.notify_all()  # room for callers blocked on a full queue
                batch = self._pending
                self._sending = True
            try:
                refused = self.sink.send(batch) or 0
            except PermanentSinkError as exc:
                self._finish(batch, delivered=0, refused=0, lost_because=str(exc))
            except Exception as exc:  # an outage: keep the batch, back off, report once
                self._failed(exc)
                return False
            else:
                self._finish(batch, delivered=len(batch) - refused, refused=refused, lost_because=None)

    def _finish(self, batch: list[Event], *, delivered: int, refused: int, lost_because: str | None) -> None:
        recovered = self._down
        with self._cond:
            self._pending = None
            self._sending = False
            if self._abandoned:  # shutdown already counted this batch as dropped
                return
            self._done += len(batch)
            self.delivered += delivered
            self._down = False
            if lost_because is None:
                self.last_error = None
                self._stalled = False
            else:
                self.last_error = lost_because
                self._drop_locked(len(batch), lost_because)
            if refused:
                self.rejected += refused
                self._drop_locked(refused, "refused for their content")
            self._cond.notify_all()
        if recovered:
            log.warning("maitred: %s reachable again", self.name)

    def _failed(self, exc: Exception) -> None:
        with self._cond:
            self._sending = False
            self._failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            first = not self._down
            self._down = True
            self._cond.notify_all()
        if first:
            log.warning("maitred: %s unavailable, buffering events and retrying (%s)", self.name, self.last_error)

    # -- drop accounting -------------------------------------------------------------------------

    def _count_dropped(self, n: int, why: str) -> None:
        with self._cond:
            self._drop_locked(n, why)
        self._warn_drops()

    def _drop_locked(self, n: int, why: str) -> None:
        self.dropped += n
        self._unreported[why] += n

    def _warn_drops(self, *, now: bool = False) -> None:
        """One warning per ``warn_interval_s`` at most, with the counts held back since."""
        if not self._unreported or (not now and time.monotonic() < self._next_warning):
            return
        with self._cond:
            counts, self._unreported = self._unreported, Counter()
            self._next_warning = time.monotonic() + self.settings.warn_interval_s
            total = self.dropped
        if counts:
            reasons = "; ".join(f"{n} {why}" for why, n in counts.most_common())
            log.warning(
                "maitred: %s dropped %d events (%s); %d dropped since start", self.name, sum(counts.values()), reasons, total
            )

    # -- flush and shutdown ----------------------------------------------------------------------

    def _wait_for_delivery(self, deadline: float, *, stop_on_failure: bool) -> bool:
        """Wait until every event queued before the call has left the queue and its batch has
        finished; with ``stop_on_failure``, also stop at the next failed attempt."""
        with self._cond:
            target = self._done + self._evicted + len(self._queue) + (len(self._pending) if self._pending else 0)
            failures = self._failures
            self._wake.set()
            while self._done + self._evicted < target:
                left = deadline - time.monotonic()
                alive = self._thread is not None and self._thread.is_alive()
                if left <= 0 or not alive or (stop_on_failure and self._failures > failures):
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def _close_window(self) -> bool:
        """True when nothing was dropped since the previous call (the last flush)."""
        with self._cond:
            clean = self.dropped == self._flushed_dropped
            self._flushed_dropped = self.dropped
        self._warn_drops(now=True)
        return clean

    def wake(self) -> None:
        self._wake.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (default ``flush_timeout_s``) for every event emitted
        so far to be delivered. True only if all were, and nothing was dropped since the
        previous ``flush``; False (after a warning with the counts) otherwise."""
        timeout = self.settings.flush_timeout_s if timeout is None else timeout
        delivered = self._wait_for_delivery(time.monotonic() + timeout, stop_on_failure=False)
        return self._close_window() and delivered

    def shutdown(self, timeout: float | None = None) -> bool:
        """Deliver what is queued within ``timeout`` (default ``flush_timeout_s``), stop the
        thread, and count whatever could not go as dropped. While the sink is down this waits
        for one more attempt only, not for the timeout. Returns what ``flush`` would."""
        timeout = self.settings.flush_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self._closed = True
        delivered = self._wait_for_delivery(deadline, stop_on_failure=True)
        with self._cond:
            lost = len(self._queue) + (len(self._pending) if self._pending is not None and not self._abandoned else 0)
            if not delivered:
                self._abandoned = True
                self._evicted += len(self._queue)
                self._queue.clear()
                if lost:
                    self._drop_locked(lost, f"not delivered at shutdown ({self.last_error or 'timed out'})")
            self._cond.notify_all()
        self._wake.set()
        thread = self._thread
        if thread is None or not thread.is_alive():
            self.sink.close()
        elif not self._sending:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self._close_window() and delivered

    def stats(self) -> EmitterStats:
        pending = self._pending
        queued = len(self._queue) + (len(pending) if pending and not self._abandoned else 0)
        return EmitterStats(self.name, queued, self.delivered, self.dropped, self.last_error, self.rejected)

    def after_fork(self) -> None:
        """In a forked child the thread is gone and the parent owns what was queued (and its
        counters): the child starts empty, and a sink holding connections makes its own."""
        self._init_state()
        if isinstance(self.sink, ForkAware):
            self.sink.after_fork()
