"""A PostgreSQL server that accepted the connection and then stops answering, mid-session: a
write fails as an outage after ``write_timeout_s`` instead of hanging for ever, the emitter
keeps the batch and retries it, and once the server answers again everything is stored once.
Opening a store (connecting, the schema check, the migrations) and every query fail the same
way after ``read_timeout_s``, and so does the command line; the same store reads again once
the server answers.

The silent server is a real PostgreSQL behind a proxy that, once frozen, keeps every
connection open and swallows what either side sends: no reset, no refusal, no answer. The
pytest timeouts are guards against the hang this file is about, not speed requirements.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import Pool

import maitred.cli
import maitred.cli.commands
from maitred.events import Event, ToolStart
from maitred.middleware import Emitter, EmitterSettings, StoreSink
from maitred.storage import SessionStore, StoreUnavailable
from tests.conftest import POSTGRES_URL
from tests.faults.store_child import batch_events, event_keys
from tests.helpers import TcpProxy, throwaway_schemas, wait_until

#: How long a write, and opening or a query, may wait for the silent server here; the
#: defaults are 30 s.
WRITE_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 2.0


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


def no_answer(proxy: FreezingProxy) -> str:
    """The whole message of a wait the read deadline cut, naming the server and the bound."""
    return f"^database unavailable: .*:{proxy.port}/.* \\(no answer within {READ_TIMEOUT_S:g} s\\)$"


def open_store(url: str) -> SessionStore:
    return SessionStore(url, connect_timeout_s=1, read_timeout_s=READ_TIMEOUT_S, write_timeout_s=WRITE_TIMEOUT_S)


@contextmanager
def _listening(target: Any, name: str, fn: Callable[..., None]) -> Iterator[None]:
    event.listen(target, name, fn)
    try:
        yield
    finally:
        event.remove(target, name, fn)


def silent_once_connected(proxy: FreezingProxy) -> AbstractContextManager[None]:
    """The proxy goes silent the moment a connection through it is in (authenticated), before
    the first query: a server that lets the client in and then answers nothing."""

    def connected(dbapi_connection: Any, _record: Any) -> None:
        if dbapi_connection.info.port == proxy.port:
            proxy.frozen.set()

    return _listening(Pool, "connect", connected)


def silent_at_first_create(proxy: FreezingProxy) -> AbstractContextManager[None]:
    """The proxy goes silent just before the migrations send their first ``CREATE``: the
    statements before it were answered, so the deadline must hold across statements."""

    def sending(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if statement.lstrip().upper().startswith("CREATE"):
            proxy.frozen.set()

    return _listening(Engine, "before_cursor_execute", sending)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("silence", [silent_once_connected, silent_at_first_create], ids=["once-connected", "mid-migration"])
def test_opening_a_store_on_a_server_gone_silent_is_an_outage_and_a_later_open_works(proxied, silence):
    direct, url, proxy = proxied
    with silence(proxy), pytest.raises(StoreUnavailable, match=no_answer(proxy)):
        open_store(url)
    assert proxy.frozen.is_set()  # the silence was met, not skipped
    proxy.frozen.clear()
    with open_store(url) as store:
        assert store.write(batch_events("open", 0, 20)).stored == 20
    assert len(stored_keys(direct)) == 20  # the cut migration left nothing half made


#: Each query the store answers, by name: (store, a scratch folder) -> what it returned.
READS: dict[str, Callable[[SessionStore, Path], Any]] = {
    "tool_stats_all": lambda store, _: store.tool_stats_all(),
    "tool_stats": lambda store, _: store.tool_stats("tool-1"),
    "programs": lambda store, _: store.programs(),
    "program": lambda store, _: store.program("reads"),
    "events": lambda store, _: store.events("reads"),
    "export_trace": lambda store, where: (
        store.export_trace(where / "t.jsonl"),
        (where / "t.jsonl").read_text().splitlines()[1:],
    ),
    "revision": lambda store, _: store.revision(),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
def test_a_read_from_a_server_gone_silent_is_an_outage_and_the_same_store_reads_again(proxied, read, tmp_path):
    _, url, proxy = proxied
    with open_store(url) as store:
        assert store.write(batch_events("reads", 0, 20)).stored == 20
        before = read(store, tmp_path)  # answered, and the connection pooled
        assert before
        proxy.frozen.set()
        with pytest.raises(StoreUnavailable, match=no_answer(proxy)):
            read(store, tmp_path)
        proxy.frozen.clear()
        assert read(store, tmp_path) == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "query",
    [["stats", "tools"], ["programs"], ["timeline", "p"], ["export", "--out", "t.jsonl"], ["db", "upgrade"]],
    ids=lambda q: q[0],
)
def test_a_query_command_on_a_silent_server_says_so_in_one_line_and_exits_1(proxied, query, tmp_path, monkeypatch, capsys):
    _, url, proxy = proxied
    monkeypatch.chdir(tmp_path)
    open_store(url).close()  # a maitred database, so the command gets past the existence check
    monkeypatch.setattr(maitred.cli.commands, "SessionStore", partial(SessionStore, read_timeout_s=READ_TIMEOUT_S))
    with silent_once_connected(proxy):
        assert maitred.cli.main([*query, "--db", url]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("maitred: error: database unavailable: ") and err.endswith(f"(no answer within {READ_TIMEOUT_S:g} s)")
    assert f":{proxy.port}/" in err and not list(tmp_path.iterdir())


@pytest.mark.timeout(60)
def test_a_healthy_read_longer_in_all_than_the_bound_is_not_cut(proxied, tmp_path):
    """The bound is on each wait: an export running a statement per program, each answered in
    a fraction of ``read_timeout_s``, takes longer than it in all and still completes."""
    _, url, _ = proxied
    programs = 20
    with open_store(url) as store:
        for i in range(programs):
            store.write(batch_events(f"p{i}", 0, 4))

        def slow(*_event: Any) -> None:
            time.sleep(READ_TIMEOUT_S / 8)

        event.listen(store.engine, "before_cursor_execute", slow)
        assert store.export_trace(tmp_path / "t.jsonl") == programs  # over 20 statements: over 5 s
