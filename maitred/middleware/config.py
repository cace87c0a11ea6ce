"""Process-wide telemetry settings: which sinks events go to, and the emitters that carry them.

Nothing is built at import. The first event (or ``configure``) creates the emitters from the
arguments or the environment (``MAITRED_URL``, ``MAITRED_DB``, ``MAITRED_TOKEN``,
``MAITRED_OTLP_ENDPOINT``).

The OTLP export is turned on by ``otlp_endpoint`` or ``MAITRED_OTLP_ENDPOINT`` only, never by the
standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``: a program sets
those for its own tracing (an instrumented LangChain or OpenAI Agents app already exports its
framework's spans there), and maitred's spans of the same calls would arrive beside them
unasked. Naming the same URL in ``MAITRED_OTLP_ENDPOINT`` is the opt-in. The exporter's other
standard variables (``OTEL_EXPORTER_OTLP_HEADERS``, ``_TIMEOUT``, ``_CERTIFICATE``,
``_COMPRESSION``, their ``_TRACES_`` forms, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``)
apply as usual.
"""

import atexit
import dataclasses
import itertools
import logging
import os
import threading
import time
import uuid

from maitred.events import Event
from maitred.middleware.emitter import Emitter, EmitterSettings, EmitterStats, Overflow
from maitred.middleware.sinks import HttpSink, Sink, StoreSink

log = logging.getLogger("maitred")

DEFAULT_DB_URL = "sqlite:///maitred.db"

_emitters: list[Emitter] | None = None
_lock = threading.Lock()
_ids = itertools.count(1)
_id_prefix = uuid.uuid4().hex[:10]


def default_db_url() -> str:
    return os.environ.get("MAITRED_DB") or DEFAULT_DB_URL


def otlp_sinks(endpoint: str | None, what: str) -> list[Sink]:
    """The OTLP sink for ``endpoint``, if one is given; ``ValueError`` / ``ImportError`` naming
    ``what`` (the argument or variable) for a bad URL or a missing ``otel`` extra."""
    if not endpoint:
        return []
    from maitred.middleware.otlp import OtlpSink, require_otel

    require_otel(what)
    try:
        return [OtlpSink(endpoint)]
    except ValueError as exc:
        raise ValueError(str(exc).replace("otlp_endpoint", what, 1)) from None


def configure(
    runtime_url: str | None = None,
    db_url: str | None = None,
    *,
    token: str | None = None,
    settings: EmitterSettings | None = None,
    sinks: list[Sink] | None = None,
    overflow: Overflow | None = None,
    otlp_endpoint: str | None = None,
) -> None:
    """Choose where events go. Replaces (and flushes) any earlier configuration.

    With a ``runtime_url`` events go to the runtime, which persists them itself; with a
    ``db_url`` they are written to that store; with both, to both. With neither, the
    environment decides (``MAITRED_URL``, then ``MAITRED_DB``), else ``sqlite:///maitred.db``.
    ``sinks`` replaces all of that with sinks of your own.

    ``otlp_endpoint`` (else ``MAITRED_OTLP_ENDPOINT``, when ``sinks`` is not given) also exports
    the events as OpenTelemetry GenAI spans over OTLP/HTTP (``maitred.middleware.otlp``), beside
    the other sinks, with an emitter of its own: ``http://127.0.0.1:6006`` (Phoenix), a
    collector's ``http://host:4318``, or a full ``.../v1/traces`` URL. A URL that is not http(s)
    raises ``ValueError``, a missing ``otel`` extra ``ImportError``, each naming the argument.

    ``overflow="block"`` (for batch jobs that must keep every event) makes a call that finds
    the queue full wait for room, at most ``settings.block_timeout_s``, instead of dropping the
    oldest event; see ``EmitterSettings``. The earlier configuration gets at most its
    ``flush_timeout_s`` to deliver what it holds, and no wait at all while its sink is down.
    """
    global _emitters
    if overflow is not None:
        settings = dataclasses.replace(settings or EmitterSettings(), overflow=overflow)
    runtime_url = runtime_url or (None if db_url else os.environ.get("MAITRED_URL"))
    token = token or os.environ.get("MAITRED_TOKEN")
    if otlp_endpoint is not None:
        otlp = otlp_sinks(otlp_endpoint, "otlp_endpoint")
    else:
        otlp = otlp_sinks(os.environ.get("MAITRED_OTLP_ENDPOINT"), "MAITRED_OTLP_ENDPOINT") if sinks is None else []
    if sinks is None:
        sinks = []
        if runtime_url:
            sinks.append(HttpSink(runtime_url, token=token))
        if db_url or not runtime_url:
            sinks.append(StoreSink(db_url or default_db_url()))
    new = [Emitter(sink, settings) for sink in [*sinks, *otlp]]
    with _lock:
        old, _emitters = _emitters, new
    _shutdown_all(old or [], None)


def _active() -> list[Emitter]:
    emitters = _emitters
    if emitters is None:
        with _lock:
            if _emitters is None:
                _configure_from_env()
        emitters = _emitters
    return emitters or []


def _configure_from_env() -> None:
    """On the first event, with no ``configure``: a bad ``MAITRED_OTLP_ENDPOINT`` is said once,
    at ERROR, and the other sinks still work (telemetry never raises into the agent)."""
    global _emitters
    url = os.environ.get("MAITRED_URL")
    sinks: list[Sink] = [HttpSink(url, token=os.environ.get("MAITRED_TOKEN"))] if url else [StoreSink(default_db_url())]
    try:
        sinks += otlp_sinks(os.environ.get("MAITRED_OTLP_ENDPOINT"), "MAITRED_OTLP_ENDPOINT")
    except (ValueError, ImportError) as exc:
        log.error("maitred: no OTLP export: %s", exc)
    _emitters = [Emitter(sink) for sink in sinks]


def emit(event: Event) -> None:
    """Queue one event for every sink; never blocks, never raises."""
    try:
        for emitter in _emitters if _emitters is not None else _active():
            emitter.emit(event)
    except Exception:  # telemetry must never break the agent
        log.debug("maitred: emit failed", exc_info=True)


def new_id() -> str:
    """A process-unique id, cheap enough for the hot path (no uuid per call)."""
    return f"{_id_prefix}-{next(_ids)}"


def flush(timeout: float | None = None) -> bool:
    """Wait until events emitted so far are persisted or sent, for at most ``timeout`` seconds
    (default: the configured ``flush_timeout_s``) in all.

    True only if every event emitted before the call was delivered to every sink and none was
    dropped since the previous ``flush`` — not by a full queue, not refused for its content, not
    refused by the store. Otherwise False, after a warning with the counts."""
    emitters = _emitters or []
    if not emitters:
        return True
    deadline = time.monotonic() + (emitters[0].settings.flush_timeout_s if timeout is None else timeout)
    for emitter in emitters:
        emitter.wake()
    ok = all([emitter.flush(max(0.0, deadline - time.monotonic())) for emitter in emitters])
    if not ok:
        for s in stats():
            if s.queued:
                log.warning("maitred: flush timed out for %s: %d still queued (%s)", s.sink, s.queued, s.last_error)
    return ok


def stats() -> list[EmitterStats]:
    """Delivery counters per sink: queued, delivered, dropped, last error."""
    return [emitter.stats() for emitter in _emitters or []]


def shutdown(timeout: float | None = None) -> bool:
    """Flush and stop all emitters (also run at interpreter exit), within ``timeout`` seconds in
    all (default: the configured ``flush_timeout_s``), and without waiting for a sink that is
    down beyond one more attempt. Events not delivered are counted as dropped, with a warning.
    Returns what ``flush`` would."""
    global _emitters
    with _lock:
        emitters, _emitters = _emitters or [], None
    return _shutdown_all(emitters, timeout)


def _shutdown_all(emitters: list[Emitter], timeout: float | None) -> bool:
    """One deadline for all: each emitter's thread delivers at the same time as the others."""
    if not emitters:
        return True
    deadline = time.monotonic() + (emitters[0].settings.flush_timeout_s if timeout is None else timeout)
    for emitter in emitters:
        emitter.wake()
    return all([emitter.shutdown(max(0.0, deadline - time.monotonic())) for emitter in emitters])


def _after_fork() -> None:
    global _id_prefix, _ids
    _id_prefix, _ids = uuid.uuid4().hex[:10], itertools.count(1)
    for emitter in _emitters or []:
        emitter.after_fork()


os.register_at_fork(after_in_child=_after_fork)
atexit.register(shutdown)
