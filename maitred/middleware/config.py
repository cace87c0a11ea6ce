"""Process-wide telemetry settings: which sinks events go to, and the emitters that carry them.

Nothing is built at import. The first event (or ``configure``) creates the emitters from the
arguments or the environment (``MAITRED_URL``, ``MAITRED_DB``, ``MAITRED_TOKEN``).
"""

import atexit
import itertools
import logging
import os
import threading
import uuid

from maitred.events import Event
from maitred.middleware.emitter import Emitter, EmitterSettings, EmitterStats
from maitred.middleware.sinks import HttpSink, Sink, StoreSink

log = logging.getLogger("maitred")

DEFAULT_DB_URL = "sqlite:///maitred.db"

_emitters: list[Emitter] | None = None
_lock = threading.Lock()
_ids = itertools.count(1)
_id_prefix = uuid.uuid4().hex[:10]


def default_db_url() -> str:
    return os.environ.get("MAITRED_DB") or DEFAULT_DB_URL


def configure(
    runtime_url: str | None = None,
    db_url: str | None = None,
    *,
    token: str | None = None,
    settings: EmitterSettings | None = None,
    sinks: list[Sink] | None = None,
) -> None:
    """Choose where events go. Replaces (and flushes) any earlier configuration.

    With a ``runtime_url`` events go to the runtime, which persists them itself; with a
    ``db_url`` they are written to that store; with both, to both. With neither, the
    environment decides (``MAITRED_URL``, then ``MAITRED_DB``), else ``sqlite:///maitred.db``.
    ``sinks`` replaces all of that with sinks of your own.
    """
    global _emitters
    runtime_url = runtime_url or (None if db_url else os.environ.get("MAITRED_URL"))
    token = token or os.environ.get("MAITRED_TOKEN")
    if sinks is None:
        sinks = []
        if runtime_url:
            sinks.append(HttpSink(runtime_url, token=token))
        if db_url or not runtime_url:
            sinks.append(StoreSink(db_url or default_db_url()))
    new = [Emitter(sink, settings) for sink in sinks]
    with _lock:
        old, _emitters = _emitters, new
    for emitter in old or ():
        emitter.shutdown(timeout=5.0)


def _active() -> list[Emitter]:
    emitters = _emitters
    if emitters is None:
        with _lock:
            if _emitters is None:
                _configure_from_env()
        emitters = _emitters
    return emitters or []


def _configure_from_env() -> None:
    global _emitters
    url = os.environ.get("MAITRED_URL")
    sinks: list[Sink] = [HttpSink(url, token=os.environ.get("MAITRED_TOKEN"))] if url else [StoreSink(default_db_url())]
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


def flush(timeout: float = 5.0) -> bool:
    """Wait until events emitted so far are persisted or sent. False (and a warning naming how
    many are still queued and dropped) if ``timeout`` passed first; it never waits much longer."""
    emitters = _emitters or []
    if not emitters:
        return True
    share = timeout / len(emitters)
    ok = all([emitter.flush(share) for emitter in emitters])
    if not ok:
        for s in stats():
            if s.queued or s.dropped:
                log.warning(
                    "maitred: flush timed out for %s: %d queued, %d dropped (%s)",
                    s.sink, s.queued, s.dropped, s.last_error,
                )
    return ok


def stats() -> list[EmitterStats]:
    """Delivery counters per sink: queued, delivered, dropped, last error."""
    return [emitter.stats() for emitter in _emitters or []]


def shutdown(timeout: float = 5.0) -> bool:
    """Flush and stop all emitters (also run at interpreter exit)."""
    global _emitters
    with _lock:
        emitters, _emitters = _emitters or [], None
    return all([emitter.shutdown(timeout) for emitter in emitters])


def _after_fork() -> None:
    global _id_prefix, _ids
    _id_prefix, _ids = uuid.uuid4().hex[:10], itertools.count(1)
    for emitter in _emitters or []:
        emitter.after_fork()


os.register_at_fork(after_in_child=_after_fork)
atexit.register(shutdown)
