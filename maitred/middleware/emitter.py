"""Moves events off the agent's thread: a bounded queue drained by one background thread.

Shaped like OpenTelemetry's BatchSpanProcessor: ``emit`` never blocks and never raises; a full
queue drops the oldest event and counts it; the worker wakes on a full batch or a timer; a sink
that fails is retried with exponential backoff and reported once per outage, not once per batch;
``flush(timeout)`` honours its deadline even while the sink hangs.
"""

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from maitred.events import Event
from maitred.middleware.sinks import PermanentSinkError, Sink

log = logging.getLogger("maitred")


@dataclass(frozen=True, slots=True)
class EmitterSettings:
    max_queue: int = 100_000
    batch_size: int = 1_000
    interval_s: float = 0.5
    max_backoff_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_queue < 1 or self.batch_size < 1:
            raise ValueError("max_queue and batch_size must be at least 1")
        if self.interval_s <= 0 or self.max_backoff_s <= 0:
            raise ValueError("interval_s and max_backoff_s must be positive")


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """Counters for one sink: ``dropped`` events are gone for good, ``queued`` may still go."""

    sink: str
    queued: int
    delivered: int
    dropped: int
    last_error: str | None


class Emitter:
    def __init__(self, sink: Sink, settings: EmitterSettings | None = None, *, name: str = "") -> None:
        self.sink = sink
        self.settings = settings or EmitterSettings()
        self.name = name or type(sink).__name__
        self._queue: deque[Event] = deque()
        self._pending: list[Event] | None = None
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._sending = False
        self._down = False
        self.delivered = 0
        self.dropped = 0
        self.last_error: str | None = None

    def emit(self, event: Event) -> None:
        queue = self._queue
        if self._closed:
            self.dropped += 1
            return
        if len(queue) >= self.settings.max_queue:
            queue.popleft()
            self.dropped += 1
        queue.append(event)
        if self._thread is None:
            self._start()
        elif len(queue) >= self.settings.batch_size:
            self._wake.set()

    def _start(self) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"maitred-emitter-{self.name}", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        backoff = 0.0
        while True:
            self._wake.wait(backoff or self.settings.interval_s)
            self._wake.clear()
            ok = self._drain()
            backoff = 0.0 if ok else min(max(backoff * 2, 0.1), self.settings.max_backoff_s)
            with self._cond:
                self._cond.notify_all()
                if self._closed and (ok or not self._queue and self._pending is None):
                    return

    def _drain(self) -> bool:
        """Send everything queued; False when the sink failed (the batch stays pending)."""
        while True:
            with self._cond:
                if self._pending is None:
                    if not self._queue:
                        return True
                    size = min(len(self._queue), self.settings.batch_size)
                    self._pending = [self._queue.popleft() for _ in range(size)]
                batch = self._pending
                self._sending = True
            try:
                refused = self.sink.send(batch) or 0
            except PermanentSinkError as exc:
                self._give_up(batch, exc)
            except Exception as exc:  # any sink failure: keep the batch, back off, report once
                self.last_error = f"{type(exc).__name__}: {exc}"
                if not self._down:
                    self._down = True
                    log.warning("maitred: %s unavailable, buffering events and retrying (%s)", self.name, self.last_error)
                with self._cond:
                    self._sending = False
                return False
            else:
                self.delivered += len(batch) - refused
                self.dropped += refused
                if self._down:
                    self._down = False
                    log.warning("maitred: %s reachable again", self.name)
            with self._cond:
                self._pending = None
                self._sending = False

    def _give_up(self, batch: list[Event], exc: Exception) -> None:
        self.dropped += len(batch)
        self.last_error = str(exc)
        log.warning("maitred: dropped %d events: %s", len(batch), exc)

    def _idle(self) -> bool:
        return not self._queue and self._pending is None and not self._sending

    def flush(self, timeout: float | None = 5.0) -> bool:
        """Wait until everything emitted so far is delivered; False if the deadline passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wake.set()
        with self._cond:
            while not self._idle():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if self._thread is None or not self._thread.is_alive():
                    return False
                self._cond.wait(left if left is None else min(left, 0.05))
        return True

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Flush within ``timeout``, stop the thread, and count whatever could not go as dropped."""
        delivered = self.flush(timeout)
        self._closed = True
        self._wake.set()
        with self._cond:
            lost = len(self._queue) + (len(self._pending) if self._pending else 0)
            self._queue.clear()
            self._pending = None
        if lost:
            self.dropped += lost
            log.warning("maitred: %d events not delivered to %s at shutdown (%s)", lost, self.name, self.last_error)
        self.sink.close()
        return delivered

    def stats(self) -> EmitterStats:
        queued = len(self._queue) + (len(self._pending) if self._pending else 0)
        return EmitterStats(self.name, queued, self.delivered, self.dropped, self.last_error)

    def after_fork(self) -> None:
        """In a forked child the thread is gone and the parent owns what was queued."""
        self._queue = deque()
        self._pending = None
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._thread = None
        self._sending = False
