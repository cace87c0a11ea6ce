"""Where batches of events go: the session store, or a running maitred runtime over HTTP.

A sink's ``send`` raises on failure (the emitter owns retries, backoff and drop accounting) and
returns how many events it refused for their content, which the emitter counts as dropped and
rejected; the sink logs why (rate-limited). ``PermanentSinkError`` marks a whole batch that can
never succeed, so the emitter drops it instead of retrying forever.
"""

import logging
import time
from collections.abc import Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import httpx

from maitred.events import Event, EventError, check_event, dumps_batch
from maitred.identity import program_header

if TYPE_CHECKING:
    from maitred.storage import SessionStore

log = logging.getLogger("maitred")


class PermanentSinkError(Exception):
    """The batch was refused for what it contains, or the sink can never take it; retrying
    cannot help."""


class Sink(Protocol):
    def send(self, events: Sequence[Event]) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class ForkAware(Protocol):
    """A sink that holds something a forked child must not share with its parent (a pooled
    connection): the emitter calls ``after_fork`` in the child, before the child's first send.
    Optional, so a sink of your own needs only ``send`` and ``close``."""

    def after_fork(self) -> None: ...


class Throttled:
    """Warnings limited to ``burst`` per ``interval_s``; the first one after a pause says how
    many were held back, so a flood of bad events costs a few lines, not one per event."""

    def __init__(self, interval_s: float = 10.0, burst: int = 5) -> None:
        self.interval_s = interval_s
        self.burst = burst
        self._window_end = 0.0
        self._sent = 0
        self._held = 0

    def warning(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now >= self._window_end:
            self._window_end, self._sent = now + self.interval_s, 0
        if self._sent >= self.burst:
            self._held += 1
            return
        self._sent += 1
        if self._held:
            message += f" ({self._held} more held back before this)"
            self._held = 0
        log.warning(message, *args)


def valid_events(events: Sequence[Event], refusals: Throttled) -> list[Event]:
    """Events built in-process skip validation on the agent's hot path; check them here, on the
    emitter's thread, so one bad value (a 10 KB program id, a NUL byte, attrs nested 300 deep)
    is refused alone instead of failing every retry of the whole batch against the database."""
    valid: list[Event] = []
    for event in events:
        try:
            check_event(event)
        except EventError as exc:
            refusals.warning("maitred: refused a %s event: %s", event.TYPE, exc)
        else:
            valid.append(event)
    return valid


class StoreSink:
    """Writes through ``SessionStore``; the store (and its migrations) open on the first batch,
    in the emitter's thread, so configuring never touches the database in the caller's thread.

    Events the database refuses are isolated by the store and counted here as refused. A
    database this maitred cannot write — written by a newer maitred, or corrupt — is reported
    once at ERROR and every batch for it is dropped (counted), never retried as an outage.
    A PostgreSQL server that stops answering holds a batch at most ``write_timeout_s``: the
    write fails as an outage, and the emitter keeps the batch and retries it."""

    def __init__(self, db_url: str, *, connect_timeout_s: float = 3.0, write_timeout_s: float = 30.0) -> None:
        self.db_url = db_url
        self.connect_timeout_s = connect_timeout_s
        self.write_timeout_s = write_timeout_s
        self._store: SessionStore | None = None
        self._unusable: str | None = None
        self._refusals = Throttled()

    def _open(self) -> "SessionStore":
        from maitred.storage import DatabaseCorrupt, DatabaseTooNew, SessionStore

        if self._unusable is not None:
            raise PermanentSinkError(self._unusable)
        if self._store is None:
            try:
                self._store = SessionStore(
                    self.db_url,
                    connect_timeout_s=self.connect_timeout_s,
                    write_timeout_s=self.write_timeout_s,
                )
            except (DatabaseTooNew, DatabaseCorrupt) as exc:
                raise self._unusable_now(exc) from None
        return self._store

    def _unusable_now(self, exc: Exception) -> PermanentSinkError:
        """Said once at ERROR; from now on every batch is refused without touching the database."""
        self._unusable = str(exc)
        log.error("maitred: %s", exc)
        return PermanentSinkError(self._unusable)

    def send(self, events: Sequence[Event]) -> int:
        from maitred.storage import DatabaseCorrupt

        store = self._open()
        valid = valid_events(events, self._refusals)
        try:
            result = store.write(valid)
        except DatabaseCorrupt as exc:
            raise self._unusable_now(exc) from None
        for rejected in result.rejected:
            self._refusals.warning("maitred: the store refused a %s event: %s", rejected.type, rejected.reason)
        return len(events) - len(valid) + len(result.rejected)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def trace_injector() -> Callable[[MutableMapping[str, str]], None] | None:
    """What writes the active W3C trace context (``traceparent``, ``tracestate``) into a request's
    headers, when ``opentelemetry-api`` is installed; None otherwise (it is no dependency of
    maitred's). W3C's propagator alone, not the application's global one: a request to maitred
    carries the trace context and nothing else the application propagates (its baggage)."""
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    propagator = TraceContextTextMapPropagator()

    def inject(headers: MutableMapping[str, str]) -> None:
        propagator.inject(headers)

    return inject


def by_program(events: Sequence[Event]) -> dict[str, list[Event]]:
    """Events grouped by program, in the order each program first appears (and each group in
    its events' order)."""
    groups: dict[str, list[Event]] = {}
    for event in events:
        groups.setdefault(event.program_id, []).append(event)
    return groups


class HttpSink:
    """POSTs batches as JSON arrays to ``<runtime_url>/v1/events``: one request per program,
    each with that program's ``X-Program-Id`` so a balancer hashing on the header sends a
    program's events to the shard that runs its model calls, and at most
    ``max_events_per_request`` events per request so a deep queue never makes a body the
    runtime refuses as too large. A request the runtime refuses (400, 413, 422) counts its
    events as refused; the rest of the batch still goes.

    The client (and its keep-alive connections) is made on the first batch, in the emitter's
    thread: building one costs about 20 ms (its TLS context), which neither ``configure`` nor a
    forked child should pay on the caller's thread.

    A request sent while an OpenTelemetry span is active carries its ``traceparent`` (with
    ``opentelemetry-api`` installed): the one active where ``send`` runs, which for the
    emitter's own thread is a span only where the application's instrumentation puts one
    (events name their own traces: ``trace_id`` on model calls)."""

    def __init__(
        self,
        runtime_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 5.0,
        max_events_per_request: int = 1_000,
    ) -> None:
        self.url = runtime_url.rstrip("/") + "/v1/events"
        self.max_events_per_request = max_events_per_request
        self.timeout_s = timeout_s
        self.headers = {"content-type": "application/json", "user-agent": "maitred-middleware"}
        if token:
            self.headers["authorization"] = f"Bearer {token}"
        self._client: httpx.Client | None = None
        self._inject: Callable[[MutableMapping[str, str]], None] | None = None
        self._refusals = Throttled()

    def send(self, events: Sequence[Event]) -> int:
        """A retried batch may re-send requests that already went: the store keys every event,
        so nothing is stored twice."""
        valid = valid_events(events, self._refusals)
        step = self.max_events_per_request
        refused = len(events) - len(valid)
        for program_id, group in by_program(valid).items():
            refused += sum(self._post(program_id, group[i : i + step]) for i in range(0, len(group), step))
        return refused

    def _post(self, program_id: str, events: Sequence[Event]) -> int:
        if self._client is None:
            self._client = httpx.Client(headers=self.headers, timeout=self.timeout_s)
            self._inject = trace_injector()
        headers = program_header(program_id)
        if self._inject is not None:
            self._inject(headers)
        response = self._client.post(self.url, content=dumps_batch(events), headers=headers)
        if response.status_code in (400, 413, 422):
            self._refusals.warning(
                "maitred: %s refused %d events: %s %s", self.url, len(events), response.status_code, response.text[:300]
            )
            return len(events)
        response.raise_for_status()
        try:
            rejected = response.json().get("rejected") or []
        except (ValueError, AttributeError):
            return 0
        if rejected:
            self._refusals.warning("maitred: the runtime refused %d events, first: %s", len(rejected), rejected[0])
        return len(rejected)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def after_fork(self) -> None:
        """In a forked child the pooled keep-alive connections are the parent's TCP connections:
        sending on one interleaves two processes' requests on one stream, and either may read the
        other's response. The child forgets the inherited client and makes its own on its next
        batch.

        The inherited client is dropped, not closed: its pool lock may have been held by the
        parent's emitter thread at the moment of the fork, and no thread in the child would ever
        release it, so ``close()`` could hang the child for good. Its sockets are closed when
        collected, with ``socket.close()`` (what httpcore's own close does too), which only drops
        the child's descriptors; nothing calls ``shutdown()``, which would end the connection for
        the parent as well."""
        self._client = None
