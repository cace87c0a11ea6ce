"""A PostgreSQL server that accepted the connection and then stops answering, mid-session: a
write fails as an outage after ``write_timeout_s`` instead of hanging for ever, the emitter
keeps the batch and retries it, and once the server answers again everything is stored once.

The silent server is a real PostgreSQL behind a proxy that, once frozen, keeps every
connection open and swallows what either side sends: no reset, no refusal, no answer. The
pytest timeouts are guards against the hang this file is about, not speed requirements.
"""

import logging
import threading
import time

import pytest
from sqlalchemy.engine import make_url

from maitred.events import Event, ToolStart
from maitred.middleware import Emitter, EmitterSettings, StoreSink
from maitred.storage import SessionStore, StoreUnavailable
from tests.conftest import POSTGRES_URL
from tests.faults.store_child import batch_events, event_keys
from tests.helpers import TcpProxy, throwaway_schemas, wait_until

#: How long a write may wait for the silent server here; the default is 30 s.
WRITE_TIMEOUT_S = 2.0


class FreezingProxy(TcpProxy):
    """A ``TcpProxy`` that can go silent: while ``frozen`` is set, connections stay open (new
    ones are accepted too) and every byte, either way, is read and dropped."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__(upstream_host, upstream_port)
        self.frozen = threading.Event()

    def passing(self) -> bool:
        return not self.frozen.is_set()


@pytest.fixture
def proxied():
    """(a fresh PostgreSQL schema's URL, the same database behind a ``FreezingProxy``, the
    proxy). SQLite has no server to go silent."""
    if not POSTGRES_URL:
        pytest.skip("MAITRED_TEST_POSTGRES_URL is not set (CI sets it)")
    with throwaway_schemas(POSTGRES_URL, "hang") as make:
        direct = make()
        parsed = make_url(direct)
        proxy = FreezingProxy(parsed.host or "127.0.0.1", parsed.port or 5432).up()
        try:
            yield direct, parsed.set(port=proxy.port).render_as_string(hide_password=False), proxy
        finally:
            proxy.down()


def stored_keys(url: str) -> list[str]:
    with SessionStore(url) as store:
        assert store.check_integrity() == []
        with store.engine.connect() as conn:
            return list(conn.exec_driver_sql("SELECT event_key FROM events").scalars())


@pytest.mark.timeout(60)
def test_a_write_to_a_server_gone_silent_mid_session_is_an_outage_and_the_retry_stores_it(proxied):
    direct, url, proxy = proxied
    first, second = batch_events("hang", 0, 200), batch_events("hang", 1, 200)
    with SessionStore(url, connect_timeout_s=1, write_timeout_s=WRITE_TIMEOUT_S) as store:
        assert store.write(first).stored == 200  # connected, and the connection pooled
        proxy.frozen.set()
        with pytest.raises(StoreUnavailable, match=f"^database unavailable: .*:{proxy.port}/.* \\(no answer within 2 s\\)$"):
            store.write(second)
        with pytest.raises(StoreUnavailable):  # a new connection gets no answer either
            store.write(second)
        proxy.frozen.clear()
        assert store.write(second).stored == 200
    keys = stored_keys(direct)
    assert sorted(keys) == sorted(event_keys(first) | event_keys(second))


@pytest.mark.timeout(60)
def test_the_emitter_keeps_and_retries_a_batch_the_silent_server_held(proxied, caplog):
    direct, url, proxy = proxied
    sink = StoreSink(url, connect_timeout_s=1, write_timeout_s=WRITE_TIMEOUT_S)
    emitter = Emitter(sink, EmitterSettings(interval_s=0.05, max_backoff_s=0.2))
    t0 = time.time() - 3600
    events: list[Event] = [ToolStart(ts=t0 + i, program_id="p-hang", call_id=f"c{i}", tool="t") for i in range(600)]
    try:
        with caplog.at_level(logging.WARNING, "maitred"):
            for e in events[:200]:
                emitter.emit(e)
            assert emitter.flush(30) is True
            proxy.frozen.set()
            for e in events[200:400]:
                emitter.emit(e)  # the agent is never held up: emit only queues
            assert wait_until(lambda: "no answer within 2 s" in (emitter.stats().last_error or ""))
            for e in events[400:]:
                emitter.emit(e)
            stats = emitter.stats()
            assert (stats.queued, stats.dropped) == (400, 0)  # kept for the retry, nothing dropped
            proxy.frozen.clear()
            assert emitter.flush(30) is True
        stats = emitter.stats()
        assert (stats.delivered, stats.dropped, stats.last_error) == (600, 0, None)
        messages = [r.getMessage() for r in caplog.records]
        assert sum(m.startswith("maitred: StoreSink unavailable") for m in messages) == 1
        assert sum(m == "maitred: StoreSink reachable again" for m in messages) == 1
    finally:
        emitter.shutdown(5)
    assert sorted(stored_keys(direct)) == sorted(event_keys(events))
